#include <gtest/gtest.h>

#include <filesystem>

#include "kimirt/eval/gsm8k.h"
#include "kimirt/eval/mt19937.h"
#include "kimirt/testing/test_data.h"

namespace kimirt::eval {
namespace {

std::vector<Gsm8kDoc> Docs(const std::string& prefix, size_t n) {
  std::vector<Gsm8kDoc> d;
  for (size_t i = 0; i < n; ++i) {
    d.push_back({prefix + " question " + std::to_string(i) + "?",
                 prefix + " step <<1+" + std::to_string(i) + "=" + std::to_string(i + 1) + ">>.\n#### " + std::to_string(i + 1)});
  }
  return d;
}

TEST(Gsm8kPrompt, GoldenFewshotPrompt) {
  // 30 train documents: CPython's sample() takes its set path (n > 21) for k = 2, as for GSM8K.
  const std::vector<Gsm8kDoc> train = Docs("T", 30), test = Docs("E", 3);
  Result<std::vector<Gsm8kPrompt>> p = BuildGsm8kPrompts(train, test, 2, 2, 1234, true);
  ASSERT_TRUE(p.ok()) << p.status().message();
  ASSERT_EQ(p->size(), 2u);
  // random.Random(1234).sample(range(30), 2) == [24, 14], then [3, 0] for the second document.
  EXPECT_EQ((*p)[0].fewshot_ids, (std::vector<size_t>{24, 14}));
  EXPECT_EQ((*p)[1].fewshot_ids, (std::vector<size_t>{3, 0}));
  EXPECT_EQ((*p)[0].text,
            "Question: T question 24?\nAnswer: T step <<1+24=25>>.\n#### 25\n\n"
            "Question: T question 14?\nAnswer: T step <<1+14=15>>.\n#### 15\n\n"
            "Question: E question 0?\nAnswer:");
  // Chat, few-shot as turns: user question / assistant answer, then the question.
  const std::vector<ChatTurn>& m = (*p)[0].messages;
  ASSERT_EQ(m.size(), 5u);
  EXPECT_EQ(m[0].role, "user");
  EXPECT_EQ(m[0].content, "Question: T question 24?\nAnswer:");
  EXPECT_EQ(m[1].role, "assistant");
  EXPECT_EQ(m[1].content, "T step <<1+24=25>>.\n#### 25");
  EXPECT_EQ(m[4].role, "user");
  EXPECT_EQ(m[4].content, "Question: E question 0?\nAnswer:");
  // Collapsed to one turn, the user message is the plain-text prompt.
  Result<std::vector<Gsm8kPrompt>> single = BuildGsm8kPrompts(train, test, 1, 2, 1234, false);
  ASSERT_TRUE(single.ok());
  ASSERT_EQ((*single)[0].messages.size(), 1u);
  EXPECT_EQ((*single)[0].messages[0].role, "user");
  EXPECT_EQ((*single)[0].messages[0].content, (*p)[0].text);
}

TEST(Gsm8kPrompt, LimitIsAPrefixOfTheFullRunAndZeroShotDrawsNothing) {
  const std::vector<Gsm8kDoc> train = Docs("T", 100), test = Docs("E", 10);
  Result<std::vector<Gsm8kPrompt>> all = BuildGsm8kPrompts(train, test, -1, 5, 1234, true);
  Result<std::vector<Gsm8kPrompt>> some = BuildGsm8kPrompts(train, test, 4, 5, 1234, true);
  ASSERT_TRUE(all.ok() && some.ok());
  ASSERT_EQ(all->size(), 10u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ((*all)[i].text, (*some)[i].text);
  Result<std::vector<Gsm8kPrompt>> zero = BuildGsm8kPrompts(train, test, 2, 0, 1234, true);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ((*zero)[1].text, "Question: E question 1?\nAnswer:");
  EXPECT_FALSE(BuildGsm8kPrompts(train, test, 2, 101, 1234, true).ok());
}

TEST(Gsm8kPrompt, RealDataFirstPromptsAsLmEvalDrawsThem) {
  const std::string dir = testing::TestDataPath("data/gsm8k");
  KIMIRT_REQUIRE_FILE(dir + "/test.jsonl");
  Result<Gsm8kData> data = LoadGsm8k(dir);
  ASSERT_TRUE(data.ok()) << data.status().message();
  ASSERT_EQ(data->train.size(), 7473u);
  ASSERT_EQ(data->test.size(), 1319u);
  Result<std::vector<Gsm8kPrompt>> p = BuildGsm8kPrompts(data->train, data->test, 2, 5, 1234, true);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ((*p)[0].fewshot_ids, (std::vector<size_t>{6374, 3610, 957, 61, 742}));
  EXPECT_EQ((*p)[1].fewshot_ids, (std::vector<size_t>{7462, 6610, 4769, 286, 5501}));
  const std::string& text = (*p)[0].text;
  EXPECT_EQ(text.rfind("Question: " + data->train[6374].question + "\nAnswer: " + data->train[6374].answer + "\n\n", 0), 0u);
  const std::string tail = "Question: " + data->test[0].question + "\nAnswer:";
  ASSERT_GE(text.size(), tail.size());
  EXPECT_EQ(text.substr(text.size() - tail.size()), tail);
  EXPECT_EQ(Gsm8kStopSequences(), (std::vector<std::string>{"Question:", "</s>", "<|im_end|>"}));
}

TEST(Gsm8kData, LoadErrorsNameTheFileAndLine) {
  const std::string dir = ::testing::TempDir() + "kimirt_gsm8k_bad";
  std::filesystem::create_directories(dir);
  {
    std::FILE* f = std::fopen((dir + "/test.jsonl").c_str(), "w");
    std::fputs("{\"question\": \"q\", \"answer\": \"#### 1\"}\n{\"question\": 3}\n", f);
    std::fclose(f);
  }
  Result<std::vector<Gsm8kDoc>> d = LoadGsm8kJsonl(dir + "/test.jsonl");
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("test.jsonl:2"), std::string::npos) << d.status().message();
  Result<Gsm8kData> missing = LoadGsm8k(dir);  // no train.jsonl
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("train.jsonl"), std::string::npos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kimirt::eval
