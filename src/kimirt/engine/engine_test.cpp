// Engine behaviour on the tiny-a fixture (CPU): greedy output equals the model's own greedy
// continuation; a request's tokens and logprobs are bit-identical alone or among 32 mixed
// requests; preemption under a small cache completes everything; aborts and finished requests
// return every block and slot.
#include "kimirt/engine/engine.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <thread>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/engine/engine_test_util.h"
#include "kimirt/model/model.h"
#include "kimirt/model/pipeline_stages.h"
#include "kimirt/testing/devices.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::Collector;

std::string Fixture(const std::string& n) { return testing::TestDataPath("fixtures/" + n); }

// The same tokens and the same logprobs, bit for bit.
void ExpectSameBits(const Collector::Result& got, const Collector::Result& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  EXPECT_EQ(0, std::memcmp(got.logprobs.data(), want.logprobs.data(), want.logprobs.size() * sizeof(float)))
      << "logprobs differ in their bits";
}

// Stats are published after each step, so the last request's release shows one step after its
// final event: wait (bounded) for the engine to go idle.
EngineStats WaitIdle(Engine& e) {
  EngineStats s = e.Stats();
  for (int i = 0; i < 1000 && (s.running + s.waiting > 0 || s.kv_blocks_used > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    s = e.Stats();
  }
  return s;
}

// Every engine test runs on each device: "cpu" (one forward per sequence) and "cuda", where
// decode steps of several sequences share one forward (the backend is row-invariant), which
// the bit-identity tests then hold to the same standard.
class EngineTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
    auto be = MakeBackend(GetParam());
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    backend_ = std::move(be).value();
    comm_ = MakeSingleRankCommunicator();
    auto m = Model::Load(Fixture("tiny-a"), *backend_, *comm_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
  }
  std::unique_ptr<Engine> MakeEngine(EngineOptions o, int64_t kv_blocks = 4096, EngineTestHooks hooks = {}) {
    RunnerOptions ro;
    ro.block_size = 8;
    ro.num_kv_blocks = kv_blocks;
    auto runner = ModelRunner::ForModel(*model_, ro);
    EXPECT_TRUE(runner.ok()) << runner.status().ToString();
    runners_.push_back(std::move(runner).value());
    auto e = Engine::Create(*runners_.back(), nullptr, o, std::move(hooks));
    EXPECT_TRUE(e.ok()) << e.status().ToString();
    return e.ok() ? std::move(e).value() : nullptr;
  }
  EngineRequest Request(const std::string& id, std::vector<int32_t> prompt, int32_t max_tokens, Collector& c) {
    EngineRequest r;
    r.id = id;
    r.prompt = std::move(prompt);
    r.params.temperature = 0.0f;
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.logprobs = 0;
    r.on_output = c.Callback();
    return r;
  }
  static std::vector<int32_t> Prompt(int len, int salt) {
    std::vector<int32_t> p;
    for (int i = 0; i < len; ++i) p.push_back((i * 37 + salt * 101 + 7) % 512);
    return p;
  }
  static EngineOptions SmallOptions() {
    EngineOptions o;
    o.prefill_chunk = 16;
    o.max_num_batched_tokens = 256;
    o.max_num_seqs = 64;
    return o;
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
  // Engines live in the test bodies and end before the fixture, so the runners outlive them.
  std::vector<std::unique_ptr<ModelRunner>> runners_;
};

TEST_P(EngineTest, GreedyEqualsTheModelsOwnContinuation) {
  const std::vector<int32_t> prompt = Prompt(21, 3);
  // Reference: the same fixed chunking the engine uses (16), then one token at a time.
  SequenceState st = model_->NewSequence();
  ForwardOptions last;
  last.all_logits = false;
  Result<Tensor> logits = Status(ErrorCode::kInternal, "unset");
  for (size_t at = 0; at < prompt.size(); at += 16) {
    logits = model_->Forward(&st, std::span<const int32_t>(prompt).subspan(at, std::min<size_t>(16, prompt.size() - at)), last);
  }
  std::vector<int32_t> want;
  for (int i = 0; i < 12; ++i) {
    const int32_t next = static_cast<int32_t>(std::max_element(logits->f32(), logits->f32() + 512) - logits->f32());
    want.push_back(next);
    logits = model_->Forward(&st, std::vector<int32_t>{next}, last);
  }
  Collector c;
  auto engine = MakeEngine(SmallOptions());
  ASSERT_TRUE(engine->Submit(Request("a", prompt, 12, c)).ok());
  ASSERT_TRUE(c.Wait({"a"}));
  Collector::Result r = c.Get("a");
  EXPECT_EQ(r.finish, FinishReason::kLength);
  EXPECT_EQ(r.tokens, want);
  EXPECT_EQ(r.prompt_tokens, 21);
  EXPECT_EQ(r.completion_tokens, 12);
  EXPECT_EQ(r.events, 12);  // one event per token
}

TEST_P(EngineTest, TokensAreBitIdenticalAloneOrAmong32Requests) {
  const std::vector<int32_t> probe = Prompt(45, 9);
  Collector alone;
  {
    auto engine = MakeEngine(SmallOptions());
    ASSERT_TRUE(engine->Submit(Request("probe", probe, 20, alone)).ok());
    ASSERT_TRUE(alone.Wait({"probe"}));
  }
  Collector crowd;
  auto engine = MakeEngine(SmallOptions());
  std::vector<std::string> ids;
  for (int i = 0; i < 31; ++i) {
    ids.push_back("r" + std::to_string(i));
    ASSERT_TRUE(engine->Submit(Request(ids.back(), Prompt(1 + (i * 13) % 70, i), 5 + i % 17, crowd)).ok());
    if (i == 15) ASSERT_TRUE(engine->Submit(Request("probe", probe, 20, crowd)).ok());
  }
  ids.push_back("probe");
  ASSERT_TRUE(crowd.Wait(ids));
  const Collector::Result a = alone.Get("probe"), b = crowd.Get("probe");
  ExpectSameBits(b, a);
  EngineStats s = WaitIdle(*engine);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.state_slots_used, 0);
  EXPECT_EQ(s.running + s.waiting, 0);
}

// Greedy requests without logprobs take their token from the device's argmax (the row never
// comes back; engine.cpp ArgmaxOnly); with logprobs the sampler reads the row. The tokens must
// be the same: every request once with logprobs (the reference), then again with every other
// one without, so decode batches mix both kinds of rows.
TEST_P(EngineTest, ArgmaxOnlyRowsGiveTheSamplersTokens) {
  auto run = [&](bool mixed) {
    Collector c;
    auto engine = MakeEngine(SmallOptions());
    std::vector<std::string> ids;
    for (int i = 0; i < 12; ++i) {
      ids.push_back("r" + std::to_string(i));
      EngineRequest r = Request(ids.back(), Prompt(3 + (i * 11) % 40, i + 50), 6 + i % 5, c);
      if (mixed && i % 2 == 0) r.params.logprobs = -1;
      EXPECT_TRUE(engine->Submit(std::move(r)).ok());
    }
    EXPECT_TRUE(c.Wait(ids));
    std::vector<std::vector<int32_t>> tokens;
    for (const std::string& id : ids) tokens.push_back(c.Get(id).tokens);
    EngineStats s = WaitIdle(*engine);
    EXPECT_EQ(s.kv_blocks_used, 0);
    return tokens;
  };
  const std::vector<std::vector<int32_t>> want = run(false), got = run(true);
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << "request r" << i << (i % 2 == 0 ? " (argmax on the device)" : " (logprobs)");
    EXPECT_EQ(want[i].size(), 6 + i % 5);
  }
}

TEST_P(EngineTest, PromptLogprobsMatchTheModelAndLeaveTheTokensAlone) {
  const std::vector<int32_t> prompt = Prompt(45, 5);  // chunks of 16, 16 and 13
  // Reference: the whole prompt in one forward, every position's logits, log_softmax in double.
  SequenceState st = model_->NewSequence();
  Result<Tensor> all = model_->Forward(&st, prompt);
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  const int64_t V = all->dim(1);
  auto ref_logprob = [&](size_t row, int32_t token) {
    const float* x = all->f32() + row * static_cast<size_t>(V);
    const double m = *std::max_element(x, x + V);
    double z = 0.0;
    for (int64_t v = 0; v < V; ++v) z += std::exp(static_cast<double>(x[v]) - m);
    return static_cast<double>(x[token]) - m - std::log(z);
  };

  Collector plain, scored;
  auto engine = MakeEngine(SmallOptions());
  ASSERT_TRUE(engine->Submit(Request("plain", prompt, 8, plain)).ok());
  EngineRequest r = Request("scored", prompt, 8, scored);
  r.params.prompt_logprobs = 3;
  ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  ASSERT_TRUE(plain.Wait({"plain"}) && scored.Wait({"scored"}));
  const Collector::Result a = plain.Get("plain"), b = scored.Get("scored");
  EXPECT_TRUE(a.prompt_logprobs.empty());
  EXPECT_EQ(b.prompt_logprobs_event, 0);  // all on the first token's event
  ASSERT_EQ(b.prompt_logprobs.size(), prompt.size() - 1);
  for (size_t i = 0; i < b.prompt_logprobs.size(); ++i) {
    const SampleResult& s = b.prompt_logprobs[i];
    EXPECT_EQ(s.token, prompt[i + 1]) << i;
    EXPECT_NEAR(s.logprob, ref_logprob(i, prompt[i + 1]), 1e-4) << "prompt position " << i + 1;
    ASSERT_EQ(s.top.size(), 3u);
    const float* x = all->f32() + i * static_cast<size_t>(V);
    EXPECT_EQ(s.top[0].token, std::max_element(x, x + V) - x) << i;
    EXPECT_NEAR(s.top[0].logprob, ref_logprob(i, s.top[0].token), 1e-4) << i;
    EXPECT_GE(s.top[0].logprob, s.top[1].logprob);
    EXPECT_GE(s.top[1].logprob, s.top[2].logprob);
  }
  // Asking for them reads the same last-position logits: same tokens, same bits.
  ExpectSameBits(b, a);

  // Preempted mid-prefill and recomputed: still one list, and the same bits.
  Collector squeezed;
  auto small = MakeEngine(SmallOptions(), /*kv_blocks=*/14);
  std::vector<std::string> ids;
  for (int i = 0; i < 6; ++i) {
    ids.push_back("s" + std::to_string(i));
    EngineRequest q = Request(ids.back(), prompt, 8, squeezed);
    q.params.prompt_logprobs = 3;
    ASSERT_TRUE(small->Submit(std::move(q)).ok());
  }
  ASSERT_TRUE(squeezed.Wait(ids, 120));
  EXPECT_GT(WaitIdle(*small).preemptions, 0);
  for (const std::string& id : ids) {
    const Collector::Result c = squeezed.Get(id);
    ASSERT_EQ(c.prompt_logprobs.size(), b.prompt_logprobs.size()) << id;
    for (size_t i = 0; i < c.prompt_logprobs.size(); ++i) {
      EXPECT_EQ(c.prompt_logprobs[i].logprob, b.prompt_logprobs[i].logprob) << id << " position " << i + 1;
    }
    EXPECT_EQ(c.tokens, b.tokens) << id;
  }
}

TEST_P(EngineTest, PreemptionUnderASmallCacheCompletesEveryRequest) {
  EngineOptions o = SmallOptions();
  Collector c;
  auto engine = MakeEngine(o, /*kv_blocks=*/12);  // 96 token positions for 8 sequences wanting ~50 each
  std::vector<std::string> ids;
  for (int i = 0; i < 8; ++i) {
    ids.push_back("p" + std::to_string(i));
    ASSERT_TRUE(engine->Submit(Request(ids.back(), Prompt(20 + i, i), 30, c)).ok());
  }
  ASSERT_TRUE(c.Wait(ids, 120));
  for (const std::string& id : ids) {
    EXPECT_EQ(c.Get(id).finish, FinishReason::kLength) << id;
    EXPECT_EQ(c.Get(id).tokens.size(), 30u) << id;
  }
  EngineStats s = WaitIdle(*engine);
  EXPECT_GT(s.preemptions, 0);
  EXPECT_EQ(s.kv_blocks_used, 0);
}

TEST_P(EngineTest, AbortFreesEverything) {
  Collector c;
  auto engine = MakeEngine(SmallOptions());
  ASSERT_TRUE(engine->Submit(Request("long", Prompt(30, 1), 100000, c)).ok());
  EngineRequest queued = Request("queued", Prompt(5, 2), 10, c);
  ASSERT_TRUE(engine->Submit(std::move(queued)).ok());
  while (c.Get("long").tokens.size() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  engine->Abort("long");
  engine->Abort("nonexistent");  // ignored
  ASSERT_TRUE(c.Wait({"long", "queued"}));
  EXPECT_EQ(c.Get("long").finish, FinishReason::kAbort);
  EXPECT_EQ(c.Get("queued").finish, FinishReason::kLength);
  const EngineStats s = WaitIdle(*engine);
  EXPECT_EQ(s.kv_blocks_used, 0);
  EXPECT_EQ(s.state_slots_used, 0);
  // The id is free again once finished.
  EXPECT_TRUE(engine->Submit(Request("long", Prompt(3, 3), 2, c)).ok());
}

TEST_P(EngineTest, RefusesBadRequestsAndAFullQueue) {
  EngineOptions o = SmallOptions();
  o.max_waiting = 2;
  o.max_num_seqs = 1;
  Collector c;
  {
    EngineOptions limited = o;
    limited.max_model_len = 64;
    EXPECT_EQ(MakeEngine(limited)->Submit(Request("l", Prompt(64, 1), 4, c)).code(), ErrorCode::kInvalidArgument);
  }
  // The queue below needs "d" still running when it fills: not limited to 64 positions, which a
  // fast GPU decodes before q3 is submitted (then q1 runs and q3 finds a free place).
  auto engine = MakeEngine(o);
  EXPECT_EQ(engine->Submit(Request("e", {}, 4, c)).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(engine->Submit(Request("v", {1, 512}, 4, c)).code(), ErrorCode::kInvalidArgument);
  EngineRequest bad = Request("t", {1}, 4, c);
  bad.params.top_p = 1.5f;
  Status s = engine->Submit(std::move(bad));
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(s.message().find("top_p"), std::string::npos) << s.message();
  ASSERT_TRUE(engine->Submit(Request("d", {1, 2}, 100000, c)).ok());
  EXPECT_EQ(engine->Submit(Request("d", {1}, 4, c)).code(), ErrorCode::kInvalidArgument);  // duplicate id
  // One running, then the queue of two fills up.
  while (engine->Stats().running < 1) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_TRUE(engine->Submit(Request("q1", {1}, 2, c)).ok());
  ASSERT_TRUE(engine->Submit(Request("q2", {1}, 2, c)).ok());
  EXPECT_EQ(engine->Submit(Request("q3", {1}, 2, c)).code(), ErrorCode::kResourceExhausted);
  engine->Abort("d");
  ASSERT_TRUE(c.Wait({"d", "q1", "q2"}));
  engine->Shutdown(/*drain=*/true);
  EXPECT_EQ(engine->Submit(Request("z", {1}, 2, c)).code(), ErrorCode::kResourceExhausted);
}

TEST_P(EngineTest, StopsAtMaxModelLenAndAtStopTokens) {
  EngineOptions o = SmallOptions();
  o.max_model_len = 30;
  Collector c;
  auto engine = MakeEngine(o);
  ASSERT_TRUE(engine->Submit(Request("m", Prompt(25, 4), 100, c)).ok());
  ASSERT_TRUE(c.Wait({"m"}));
  EXPECT_EQ(c.Get("m").finish, FinishReason::kLength);
  EXPECT_EQ(c.Get("m").tokens.size(), 5u);
  // Whatever greedy produces first becomes a stop token: the request stops right there.
  const int32_t first = c.Get("m").tokens[0];
  EngineRequest r = Request("s", Prompt(25, 4), 100, c);
  r.params.stop_token_ids = {first};
  ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  ASSERT_TRUE(c.Wait({"s"}));
  EXPECT_EQ(c.Get("s").finish, FinishReason::kStop);
  EXPECT_EQ(c.Get("s").tokens, std::vector<int32_t>{first});
}

TEST_P(EngineTest, AForcedCompletionHookGeneratesItsTokensThenEos) {
  // tiny-a's EOS is 258; the forced tokens replace what greedy would pick, and EOS ends the
  // request as a stop (ignore_eos off), whatever max_tokens allows.
  ASSERT_EQ(model_->config().eos_token_ids, std::vector<int64_t>{258});
  Collector c;
  auto engine = MakeEngine(SmallOptions(), 4096, EngineTestHooks::ForcedCompletion({5, 6, 7}, model_->config()));
  EngineRequest r = Request("f", Prompt(20, 6), 100, c);
  r.params.ignore_eos = false;
  ASSERT_TRUE(engine->Submit(std::move(r)).ok());
  ASSERT_TRUE(c.Wait({"f"}));
  EXPECT_EQ(c.Get("f").tokens, (std::vector<int32_t>{5, 6, 7, 258}));
  EXPECT_EQ(c.Get("f").finish, FinishReason::kStop);
  EXPECT_EQ(c.Get("f").completion_tokens, 4);
}

}  // namespace
}  // namespace kimirt

namespace kimirt {
namespace {

INSTANTIATE_TEST_SUITE_P(Devices, EngineTest, ::testing::ValuesIn(testing::BuiltDevices()),
                         [](const auto& info) { return info.param; });

// A greedy request for RunGreedy: id, prompt, tokens to generate.
struct GreedyRequest {
  std::string id;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 0;
};
std::vector<int32_t> TestPrompt(int len, int salt) {
  std::vector<int32_t> p;
  for (int k = 0; k < len; ++k) p.push_back((k * 31 + salt) % 512);
  return p;
}

// A request to follow, and 15 others around it (it is the 9th, index 8).
GreedyRequest Probe() { return {"probe", TestPrompt(37, 3), 14}; }
std::vector<GreedyRequest> CrowdAround(const GreedyRequest& probe) {
  std::vector<GreedyRequest> crowd;
  for (int i = 0; i < 15; ++i) {
    crowd.push_back({"o" + std::to_string(i), TestPrompt(1 + (i * 13) % 40, 7 * i + 10), 3 + i % 9});
    if (i == 7) crowd.push_back(probe);
  }
  return crowd;
}

// `requests` through an engine on a runner of tiny-a made with `ro` (block size 8); each
// request's result, in order. With `logprobs`, each token's logprob comes back too. Requests from
// index `later` on are submitted only once the first has two tokens out (they join a running
// batch).
std::vector<Collector::Result> RunGreedy(RunnerOptions ro, const std::vector<GreedyRequest>& requests,
                                         bool logprobs = false, size_t later = SIZE_MAX) {
  ro.block_size = 8;
  auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  EXPECT_TRUE(runner.ok()) << runner.status().ToString();
  if (!runner.ok()) return {};
  EngineOptions o;
  o.prefill_chunk = 16;
  o.max_num_batched_tokens = 64;
  auto engine = Engine::Create(**runner, nullptr, o);
  EXPECT_TRUE(engine.ok());
  Collector c;
  std::vector<std::string> ids;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GreedyRequest& g = requests[i];
    if (i == later) {
      for (int k = 0; k < 10000 && c.Get(requests[0].id).tokens.size() < 2; ++k) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_GE(c.Get(requests[0].id).tokens.size(), 2u);
    }
    EngineRequest r;
    r.id = g.id;
    r.prompt = g.prompt;
    r.params.temperature = 0;
    r.params.max_tokens = g.max_tokens;
    r.params.ignore_eos = true;
    if (logprobs) r.params.logprobs = 0;
    r.on_output = c.Callback();
    ids.push_back(r.id);
    EXPECT_TRUE((*engine)->Submit(std::move(r)).ok());
  }
  EXPECT_TRUE(c.Wait(ids));
  std::vector<Collector::Result> out;
  for (const std::string& id : ids) out.push_back(c.Get(id));
  (*engine)->Shutdown(true);
  return out;
}

TEST(EngineTensorParallel, TwoThreadRanksGenerateWhatOneRankDoes) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  auto run = [](int tp) {
    RunnerOptions ro;
    ro.tp = tp;
    ro.block_size = 8;
    ro.num_kv_blocks = 256;
    auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
    EXPECT_TRUE(runner.ok()) << runner.status().ToString();
    return testing::GreedyTokens(**runner);
  };
  const auto one = run(1);
  ASSERT_EQ(one.size(), 4u);
  EXPECT_EQ(run(2), one);
}

// Expert parallelism through the engine (docs/distributed.md "Expert parallelism"): TP 2 with
// ep 2 generates what one rank does, and a request's tokens and logprobs are bit-identical alone
// or among 15 others (on the CPU each sequence forwards alone; the ranks' all-reduce sums in rank
// order, whatever else runs).
TEST(EngineExpertParallel, TwoRanksGenerateWhatOneRankDoesAloneOrAmongOthers) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  const GreedyRequest probe = Probe();
  const std::vector<GreedyRequest> crowd = CrowdAround(probe);
  RunnerOptions ro;
  ro.num_kv_blocks = 512;
  const Collector::Result one = RunGreedy(ro, {probe}, true).at(0);
  ro.tp = ro.ep = 2;
  const Collector::Result alone = RunGreedy(ro, {probe}, true).at(0);
  const Collector::Result among = RunGreedy(ro, crowd, true).at(8);
  ASSERT_EQ(one.tokens.size(), 14u);
  EXPECT_EQ(alone.tokens, one.tokens);
  ExpectSameBits(among, alone);
}

TEST(EngineExpertParallel, DegreesItCannotRunAreRefused) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions ro;
  ro.num_kv_blocks = 16;
  ro.tp = 3;  // tiny-a has 8 experts
  ro.ep = 3;
  auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("the 8 routed experts do not split evenly"), std::string::npos)
      << runner.status().message();
  ro.tp = 4;
  ro.ep = 2;
  runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("ep must be 1 or -tp 4, got 2"), std::string::npos)
      << runner.status().message();
}

TEST(EngineTensorParallel, ADegreeThatDoesNotSplitTheHeadsFailsCleanly) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions ro;
  ro.tp = 3;  // tiny-a has 4 heads
  ro.num_kv_blocks = 16;
  auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("do not split over TP 3"), std::string::npos) << runner.status().message();
}

// Pipeline parallelism through the engine (docs/distributed.md "Pipeline parallelism"): PP 2 and
// TP 2 × PP 2 on thread ranks generate what one rank does, token and logprob bits alike, and a
// request's tokens and logprobs are bit-identical alone or among 15 others at PP 2 (a stage's
// numerics are one rank's, and on the CPU each sequence forwards alone).
TEST(EnginePipelineParallel, StagesGenerateWhatOneRankDoesAloneOrAmongOthers) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  const GreedyRequest probe = Probe();
  const std::vector<GreedyRequest> crowd = CrowdAround(probe);
  RunnerOptions ro;
  ro.num_kv_blocks = 512;
  const Collector::Result one = RunGreedy(ro, {probe}, true).at(0);
  ASSERT_EQ(one.tokens.size(), 14u);
  auto same = [&](const Collector::Result& got) { ExpectSameBits(got, one); };
  ro.pp = 2;
  {
    SCOPED_TRACE("PP2 alone");
    same(RunGreedy(ro, {probe}, true).at(0));
  }
  {
    SCOPED_TRACE("PP2 among 15");
    same(RunGreedy(ro, crowd, true).at(8));
  }
  ro.pp = 3;
  {
    SCOPED_TRACE("PP3 alone");
    same(RunGreedy(ro, {probe}, true).at(0));
  }
  // TP 2 × PP 2 against TP 2 (4 thread ranks; TP sums differ from one rank's in rounding).
  RunnerOptions tp2;
  tp2.num_kv_blocks = 512;
  tp2.tp = 2;
  const Collector::Result two = RunGreedy(tp2, {probe}, true).at(0);
  tp2.pp = 2;
  const Collector::Result grid = RunGreedy(tp2, {probe}, true).at(0);
  ExpectSameBits(grid, two);
}

// Micro-batches in flight through the engine: the runner takes a step's decodes in one call
// (decode_batch_limit) and the stages split it into micro-batches, one per stage (MicroBatchRows).
// Sixteen requests of different prompt and output lengths (joining the
// batch as their prefills finish, leaving it as they end; half submitted only once the first is
// decoding) give one rank's tokens and logprobs, every request bit for bit, at PP 2, 3 and 4, and
// TP 2 × PP 2 gives TP 2's.
TEST(EnginePipelineParallel, MicroBatchedStepsGiveOneRanksBitsAsRequestsComeAndGo) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  const std::vector<GreedyRequest> crowd = CrowdAround(Probe());
  const size_t later = crowd.size() / 2;
  auto expect_same = [&](const std::vector<Collector::Result>& got, const std::vector<Collector::Result>& want) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < want.size(); ++i) {
      SCOPED_TRACE("request " + crowd[i].id);
      ASSERT_EQ(want[i].tokens.size(), static_cast<size_t>(crowd[i].max_tokens));
      ExpectSameBits(got[i], want[i]);
    }
  };
  for (int tp : {1, 2}) {
    RunnerOptions ro;
    ro.num_kv_blocks = 512;
    ro.tp = tp;
    const std::vector<Collector::Result> one = RunGreedy(ro, crowd, true, later);
    for (int pp : tp == 1 ? std::vector<int>{2, 3, 4} : std::vector<int>{2}) {
      SCOPED_TRACE("TP" + std::to_string(tp) + " x PP" + std::to_string(pp));
      ro.pp = pp;
      auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
      ASSERT_TRUE(runner.ok()) << runner.status().ToString();
      EXPECT_GE((*runner)->decode_batch_limit(), 64) << "a PP runner takes the step's decodes in one call";
      runner->reset();
      expect_same(RunGreedy(ro, crowd, true, later), one);
      ro.pp_micro_batches = 2;  // asks for fewer than the CPU needs: still one per sequence
      expect_same(RunGreedy(ro, crowd, true), one);
      ro.pp_micro_batches = 0;
    }
  }
}

// Prefill chunks in flight through the engine: eight requests whose prompts (19 to 68 tokens)
// take two to five chunks of 16, submitted at once, so the steps hold four chunks of different
// sequences (64 batched tokens), later beside decodes; the runner takes each step's chunks in one
// call (step_in_flight) and the stages overlap them. Every request's tokens and logprobs equal
// one rank's bit for bit at PP 2 and 3, and TP 2 × PP 2's equal TP 2's.
TEST(EnginePipelineParallel, PrefillChunksInFlightGiveOneRanksBits) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  std::vector<GreedyRequest> requests;
  for (int i = 0; i < 8; ++i) requests.push_back({"p" + std::to_string(i), TestPrompt(19 + (i * 29) % 50, 5 * i + 1), 2 + i % 5});
  for (int tp : {1, 2}) {
    RunnerOptions ro;
    ro.num_kv_blocks = 512;
    ro.tp = tp;
    const std::vector<Collector::Result> one = RunGreedy(ro, requests, true);
    ASSERT_EQ(one.size(), requests.size());
    for (int pp : tp == 1 ? std::vector<int>{2, 3} : std::vector<int>{2}) {
      SCOPED_TRACE("TP" + std::to_string(tp) + " x PP" + std::to_string(pp));
      ro.pp = pp;
      auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
      ASSERT_TRUE(runner.ok()) << runner.status().ToString();
      EXPECT_TRUE((*runner)->step_in_flight()) << "a PP runner takes a step's prefill chunks in one call";
      runner->reset();
      const std::vector<Collector::Result> got = RunGreedy(ro, requests, true);
      ASSERT_EQ(got.size(), one.size());
      for (size_t i = 0; i < one.size(); ++i) {
        SCOPED_TRACE("request " + requests[i].id);
        ASSERT_EQ(one[i].tokens.size(), static_cast<size_t>(requests[i].max_tokens));
        ExpectSameBits(got[i], one[i]);
      }
    }
  }
}

// Stages hold different layers, so a cache budget in bytes gives each its own block count: every
// rank takes the smallest (the stage with the most MLA layers), so their allocators stay in step.
// tiny-a's MLA layers are 3, 4 and 5: at PP 3 the stages hold 0, 1 and 2 of them (a stage without
// MLA layers keeps the block accounting only).
TEST(EnginePipelineParallel, TheCacheIsTheSmallestStagesBudget) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions ro;
  ro.block_size = 8;
  ro.kv_cache_bytes = 1 << 20;
  ro.pp = 3;
  auto three = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  // The stage holding the most MLA layers sets the count: the budget over its block's bytes.
  auto config = LoadModelConfig(Fixture("tiny-a"));
  ASSERT_TRUE(config.ok());
  const auto stages = PipelineStages(config->num_hidden_layers, 3);
  int64_t most = 0;
  for (const PipelineStage& s : stages) {
    int64_t mla = 0;
    for (int64_t i = s.first_layer; i < s.end_layer; ++i) mla += config->IsKdaLayer(i) ? 0 : 1;
    most = std::max(most, mla);
  }
  ASSERT_GT(most, 0);
  ASSERT_LT(most, config->NumMlaLayers()) << "tiny-a's MLA layers must span both stages for this test";
  auto backend = MakeBackend("cpu");
  ASSERT_TRUE(backend.ok());
  LatentKvCache heaviest(**backend, static_cast<int>(most), 0, 8, config->kv_lora_rank, config->qk_rope_head_dim,
                         KvCacheDType::kF32, false);
  EXPECT_EQ((*three)->kv_blocks_total(), static_cast<int64_t>(ro.kv_cache_bytes / heaviest.block_bytes()));
}

TEST(EnginePipelineParallel, BadDegreesAreRefusedNamingThem) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions ro;
  ro.num_kv_blocks = 16;
  ro.pp = 7;  // tiny-a has 6 layers
  auto runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("-pp 7: must be between 1 and the 6 layers"), std::string::npos)
      << runner.status().message();
  ro.pp = 0;
  runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("-pp must be >= 1"), std::string::npos) << runner.status().message();
  ro.pp = 2;
  ro.pp_micro_batches = -1;
  runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("--pp-micro-batches must be >= 0"), std::string::npos)
      << runner.status().message();
  ro.pp_micro_batches = 0;
  ro.steps_in_flight = -1;
  runner = ModelRunner::Create(Fixture("tiny-a"), ro);
  ASSERT_FALSE(runner.ok());
  EXPECT_NE(runner.status().message().find("--steps-in-flight must be >= 0"), std::string::npos)
      << runner.status().message();
}

}  // namespace
}  // namespace kimirt
