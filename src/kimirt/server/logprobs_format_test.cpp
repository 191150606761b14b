// OpenAI logprobs formatting: legacy completions and chat.
#include "kimirt/server/logprobs_format.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include <nlohmann/json.hpp>

#include "kimirt/server/server_test_util.h"

namespace kimirt {
namespace {

using testing::FakeTokenizer;

SampleResult Sample(int32_t token, float logprob, std::vector<TokenLogprob> top) {
  SampleResult s;
  s.token = token;
  s.logprob = logprob;
  s.top = std::move(top);
  return s;
}

TEST(LogprobsFormat, TokenText) {
  FakeTokenizer tok;
  EXPECT_EQ(TokenDisplayText(tok, 'a'), "a");
  EXPECT_EQ(TokenDisplayText(tok, 0xE4), "bytes:\\xe4");  // half a character
  EXPECT_EQ(TokenDisplayText(tok, 256), "<|open|>");
  EXPECT_EQ(JsonLogprob(-std::numeric_limits<float>::infinity()), -9999.0);
  EXPECT_EQ(JsonLogprob(std::nanf("")), -9999.0);
  EXPECT_EQ(JsonLogprob(-0.5f), -0.5);
}

TEST(LogprobsFormat, LegacyWithEcho) {
  FakeTokenizer tok;
  LegacyLogprobs lp(tok, 0);
  lp.AddPromptToken('h');
  lp.AddPromptToken('i');
  lp.AddSampled(Sample('!', -0.5f, {{'?', -0.25f}, {'!', -0.5f}}));
  // A two-byte character split over two tokens: each shows its bytes; offsets count one U+FFFD each.
  lp.AddSampled(Sample(0xC3, -1.0f, {}));
  lp.AddSampled(Sample(0xA9, -std::numeric_limits<float>::infinity(), {}));
  lp.AddSampled(Sample('x', -2.0f, {{'y', -0.1f}}));
  const Json j = lp.TakeJson();
  EXPECT_EQ(j.dump(), R"({"tokens":["h","i","!","bytes:\\xc3","bytes:\\xa9","x"],)"
                      R"("token_logprobs":[null,null,-0.5,-1.0,-9999.0,-2.0],)"
                      R"("top_logprobs":[null,null,{"?":-0.25,"!":-0.5},{"bytes:\\xc3":-1.0},{"bytes:\\xa9":-9999.0},)"
                      R"({"y":-0.10000000149011612,"x":-2.0}],)"
                      R"("text_offset":[0,1,2,3,4,5]})");
  EXPECT_TRUE(lp.empty());
}

TEST(LogprobsFormat, LegacyStreamingKeepsOffsets) {
  FakeTokenizer tok;
  LegacyLogprobs lp(tok, 5);  // a 5-character prompt, not echoed
  lp.AddSampled(Sample('a', -1.0f, {}));
  EXPECT_EQ(lp.TakeJson()["text_offset"].dump(), "[5]");
  lp.AddSampled(Sample(256, -1.0f, {}));  // special: not in the text
  lp.AddSampled(Sample('b', -1.0f, {}));
  EXPECT_EQ(lp.TakeJson()["text_offset"].dump(), "[6,6]");
  LegacyLogprobs echo(tok, 0);
  echo.AddPromptToken(256);  // a special name the client wrote in its prompt is text
  echo.AddSampled(Sample('c', -1.0f, {}));
  EXPECT_EQ(echo.TakeJson()["text_offset"].dump(), "[0,8]");
}

TEST(LogprobsFormat, Chat) {
  FakeTokenizer tok;
  std::vector<SampleResult> s = {Sample('a', -0.5f, {{'a', -0.5f}, {'b', -1.5f}, {'c', -2.0f}}),
                                 Sample(0xE4, -1.0f, {})};
  const Json j = ChatLogprobsContent(tok, s, 2);
  EXPECT_EQ(j.dump(), R"([{"token":"a","logprob":-0.5,"bytes":[97],"top_logprobs":[)"
                      R"({"token":"a","logprob":-0.5,"bytes":[97]},{"token":"b","logprob":-1.5,"bytes":[98]}]},)"
                      R"({"token":"bytes:\\xe4","logprob":-1.0,"bytes":[228],"top_logprobs":[]}])");
}

}  // namespace
}  // namespace kimirt
