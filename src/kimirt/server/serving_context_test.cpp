// Per-choice sampling params, the context-length check, finish reasons, served model name.
#include "kimirt/server/serving_context.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "kimirt/server/openai_server.h"

namespace kimirt {
namespace {

TEST(ServingContext, ChoiceSeeds) {
  SamplingParams p;
  p.n = 3;
  p.seed = 42;
  std::vector<SamplingParams> c = ChoiceParams(p, 7);
  ASSERT_EQ(c.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(c[i].n, 1);
    EXPECT_EQ(*c[i].seed, 42u + i);
  }
  p.seed.reset();
  c = ChoiceParams(p, 7);
  EXPECT_EQ(*c[2].seed, 9u);  // the request's fresh seed + i
  p.n = 1;
  c = ChoiceParams(p, 7);
  ASSERT_EQ(c.size(), 1u);
  EXPECT_EQ(*c[0].seed, 7u);
}

// Issue 11 defect 7: unseeded requests drew their choices' seeds from one fixed base, so every
// n = 2 request repeated the last one. Each draw must differ; --seed makes the sequence replay.
TEST(ServingContext, RequestSeedsAreFreshAndReplayable) {
  RequestSeeds a(uint64_t{1234}), b(uint64_t{1234}), c(uint64_t{99});
  std::vector<uint64_t> drawn;
  for (int i = 0; i < 100; ++i) {
    const uint64_t s = a.Next();
    EXPECT_EQ(s, b.Next()) << "the same --seed replays the same seeds";
    drawn.push_back(s);
  }
  std::sort(drawn.begin(), drawn.end());
  // No two requests share a seed, nor sit within n = 128 of each other (seed + i per choice).
  for (size_t i = 1; i < drawn.size(); ++i) EXPECT_GT(drawn[i] - drawn[i - 1], 128u);
  EXPECT_NE(RequestSeeds(uint64_t{1234}).Next(), c.Next());
  EXPECT_NE(RequestSeeds(std::nullopt).Next(), RequestSeeds(std::nullopt).Next());  // OS entropy
}

TEST(ServingContext, ContextLength) {
  EXPECT_FALSE(CheckContextLength(100, 28, 128, "prompt"));
  EXPECT_FALSE(CheckContextLength(100, 1000, 0, "prompt"));  // unknown context: the engine decides
  std::optional<ApiError> e = CheckContextLength(100, 29, 128, "prompt");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->kind, ApiErrorKind::kInvalidRequest);
  EXPECT_EQ(e->param, "max_tokens");
  EXPECT_EQ(e->code, "context_length_exceeded");
  EXPECT_NE(e->message.find("128"), std::string::npos);
  e = CheckContextLength(200, 1, 128, "messages");
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "messages");
}

TEST(ServingContext, Failures) {
  RequestOutput o;
  o.finish = FinishReason::kStop;
  EXPECT_FALSE(FailureOf(o, false));
  EXPECT_EQ(OpenAiFinishReason(FinishReason::kLength), "length");
  o.finish = FinishReason::kAbort;
  EXPECT_EQ(FailureOf(o, true)->kind, ApiErrorKind::kShuttingDown);
  EXPECT_EQ(FailureOf(o, false)->kind, ApiErrorKind::kInternal);
  o.finish = FinishReason::kError;
  o.error = InvalidArgument("prompt too long");
  EXPECT_EQ(FailureOf(o, false)->kind, ApiErrorKind::kInvalidRequest);
}

TEST(ServingContext, DefaultServedModelName) {
  EXPECT_EQ(DefaultServedModelName("/models/Kimi-K3/"), "Kimi-K3");
  EXPECT_EQ(DefaultServedModelName("Kimi-Linear-48B-A3B-Instruct"), "Kimi-Linear-48B-A3B-Instruct");
  EXPECT_EQ(DefaultServedModelName(""), "kimirt-builtin");
  EXPECT_EQ(DefaultServedModelName("/"), "kimirt-builtin");
  EXPECT_NE(NewRequestId("cmpl"), NewRequestId("cmpl"));
  EXPECT_EQ(NewRequestId("cmpl").rfind("cmpl-", 0), 0u);
}

}  // namespace
}  // namespace kimirt
