// A step in one flow through the engine (docs/distributed.md "A step in one flow"): under -pp the
// engine hands a step's decodes and prefill chunks to the runner in one ForwardStep call, which
// sends them through the stages as one flow. Requests of long prompts (prefilled in chunks of 8)
// run beside short ones that are already decoding, more join while others prefill, some share a
// prefix (with the prefix cache on, they resume from it) and one scores its prompt; at PP 2 and 3
// and TP 2 × PP 2, on thread and process ranks, with the prefix cache on and off, every request's
// tokens, logprobs and prompt logprobs equal one rank's (TP 2's) bit for bit, and steps with both
// decode rows and chunks did go through in one call. A failing one-flow call ends exactly the
// requests it covered, with its error; the others go on with their bits unchanged. CPU ranks
// (threads and processes) run it again with steps in flight (docs/distributed.md "Steps in flight": the next step enters
// stage 0 while the later stages run this one), where an abort of a request in flight waits for
// its step.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <deque>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/engine/engine.h"
#include "kimirt/engine/engine_test_util.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::Collector;

std::string TinyA() { return testing::TestDataPath("fixtures/tiny-a"); }

// Forwards every call to `inner` and counts the engine's ForwardStep calls: `one_flow` those
// with decode rows and chunks both. With `fail_one_flow` = n, the n-th of those fails instead of
// running (the runner's all-or-nothing: nothing forwarded), and the handles it covered are kept.
class StepCountingRunner final : public ModelRunner {
 public:
  explicit StepCountingRunner(ModelRunner& inner) : inner_(inner) {}

  int64_t one_flow = 0, chunks_only = 0;
  int64_t fail_one_flow = 0;
  std::set<Handle> failed;  // the handles of the call that failed

  const ModelConfig& config() const override { return inner_.config(); }
  int64_t kv_blocks_total() const override { return inner_.kv_blocks_total(); }
  int64_t kv_blocks_free() const override { return inner_.kv_blocks_free(); }
  int64_t kv_blocks_for(int64_t tokens) const override { return inner_.kv_blocks_for(tokens); }
  Status health() const override { return inner_.health(); }
  Handle NewSequence() override { return inner_.NewSequence(); }
  Status Reserve(Handle h, int64_t tokens) override { return inner_.Reserve(h, tokens); }
  Result<Tensor> Forward(Handle h, std::span<const int32_t> ids, bool last_only, ArgmaxRequest* argmax) override {
    return inner_.Forward(h, ids, last_only, argmax);
  }
  void Release(Handle h) override {
    for (const std::set<Handle>& step : flying_) released_in_flight += step.count(h);
    inner_.Release(h);
  }
  int kv_block_size() const override { return inner_.kv_block_size(); }
  KvCacheDType kv_cache_dtype() const override { return inner_.kv_cache_dtype(); }
  std::vector<int32_t> BlockTable(Handle h) const override { return inner_.BlockTable(h); }
  int32_t kv_block_refs(int32_t block) const override { return inner_.kv_block_refs(block); }
  void RetainBlocks(std::span<const int32_t> blocks) override { inner_.RetainBlocks(blocks); }
  void ReleaseBlocks(std::span<const int32_t> blocks) override { inner_.ReleaseBlocks(blocks); }
  void SharePrefix(Handle h, std::span<const int32_t> blocks, int64_t tokens) override {
    inner_.SharePrefix(h, blocks, tokens);
  }
  SnapshotId SnapshotKda(Handle h) override { return inner_.SnapshotKda(h); }
  void RestoreKda(Handle h, SnapshotId s) override { inner_.RestoreKda(h, s); }
  void DropKdaSnapshot(SnapshotId s) override { inner_.DropKdaSnapshot(s); }
  uint64_t kda_snapshot_bytes() const override { return inner_.kda_snapshot_bytes(); }
  int64_t kda_snapshot_capacity() const override { return inner_.kda_snapshot_capacity(); }
  int64_t decode_batch_limit() const override { return inner_.decode_batch_limit(); }
  Result<Tensor> ForwardDecode(std::span<const Handle> hs, std::span<const int32_t> ids,
                               ArgmaxRequest* argmax) override {
    return inner_.ForwardDecode(hs, ids, argmax);
  }
  bool step_in_flight() const override { return inner_.step_in_flight(); }
  Result<StepLogits> ForwardStep(const Decodes& decodes, std::span<const Chunk> chunks) override {
    KIMIRT_RETURN_IF_ERROR(Count(decodes, chunks));
    return inner_.ForwardStep(decodes, chunks);
  }
  // Steps in flight: counted as ForwardStep, and the most submitted and not yet collected.
  int steps_in_flight() const override { return inner_.steps_in_flight(); }
  Status SubmitStep(const Decodes& decodes, std::span<const Chunk> chunks) override {
    KIMIRT_RETURN_IF_ERROR(Count(decodes, chunks));
    KIMIRT_RETURN_IF_ERROR(inner_.SubmitStep(decodes, chunks));
    std::set<Handle>& step = flying_.emplace_back(decodes.hs.begin(), decodes.hs.end());
    for (const Chunk& c : chunks) step.insert(c.h);
    most_in_flight = std::max(most_in_flight, static_cast<int64_t>(flying_.size()));
    return Status::Ok();
  }
  Result<StepLogits> CollectStep() override {
    flying_.pop_front();
    return inner_.CollectStep();
  }
  int64_t most_in_flight = 0;
  int64_t released_in_flight = 0;  // Release calls of a sequence in a step not yet collected

 private:
  Status Count(const Decodes& decodes, std::span<const Chunk> chunks) {
    if (decodes.hs.empty()) {
      ++chunks_only;
    } else if (!chunks.empty() && ++one_flow == fail_one_flow) {
      failed.insert(decodes.hs.begin(), decodes.hs.end());
      for (const Chunk& c : chunks) failed.insert(c.h);
      return Internal("injected failure of a step's one flow");
    }
    return Status::Ok();
  }

  ModelRunner& inner_;
  std::deque<std::set<Handle>> flying_;  // each step in flight's sequences, oldest first
};

// Short prompts of 3 to 9 tokens (r0, r3, r6, r9: decoding after one chunk) and longer ones of 8
// to 61 tokens (up to eight chunks of 8), four of them sharing a 24-token prefix (three chunks),
// one (r4) scoring its prompt; 3 to 12 tokens out, each with its logprob. The requests from
// kLater on join once the first has two tokens out, while others still prefill.
constexpr size_t kLater = 6;
std::vector<EngineRequest> Requests() {
  std::vector<int32_t> shared;
  for (int k = 0; k < 24; ++k) shared.push_back((k * 53 + 7) % 512);
  std::vector<EngineRequest> out;
  for (int i = 0; i < 12; ++i) {
    EngineRequest r;
    r.id = "r" + std::to_string(i);
    const bool long_prompt = i % 3 != 0;
    if (long_prompt && i % 2 == 0) r.prompt = shared;
    const int own = long_prompt ? 3 + (i * 17) % 38 : 3 + (i * 5) % 9;
    for (int k = 0; k < own; ++k) r.prompt.push_back((i * 97 + k * 31 + 1) % 512);
    r.params.temperature = 0;
    r.params.max_tokens = i == 0 ? 12 : 3 + (i * 7) % 10;
    r.params.ignore_eos = true;
    r.params.logprobs = 0;
    if (i == 4) r.params.prompt_logprobs = 0;
    out.push_back(std::move(r));
  }
  return out;
}

struct FlowRun {
  std::map<std::string, Collector::Result> results;
  int64_t one_flow = 0, chunks_only = 0;
  int64_t most_in_flight = 0;  // steps submitted and not yet collected, at most
  std::set<ModelRunner::Handle> failed;
};

// Requests() through an engine (chunks of 8, 32 tokens a step) on tiny-a under `ro`.
FlowRun RunRequests(RunnerOptions ro, bool caching, int64_t fail_one_flow = 0) {
  FlowRun out;
  ro.block_size = 8;
  ro.num_kv_blocks = 512;
  ro.max_kda_snapshots = 16;
  ro.rank_worker_binary = KIMIRT_BINARY;
  auto inner = ModelRunner::Create(TinyA(), ro);
  EXPECT_TRUE(inner.ok()) << inner.status().ToString();
  if (!inner.ok()) return out;
  StepCountingRunner runner(**inner);
  runner.fail_one_flow = fail_one_flow;
  EngineOptions o;
  o.prefill_chunk = 8;
  o.max_num_batched_tokens = 32;
  o.enable_prefix_caching = caching;
  auto engine = Engine::Create(runner, nullptr, o);
  EXPECT_TRUE(engine.ok()) << engine.status().ToString();
  if (!engine.ok()) return out;
  Collector c;
  std::vector<std::string> ids;
  std::vector<EngineRequest> requests = Requests();
  for (size_t i = 0; i < requests.size(); ++i) {
    if (i == kLater) {
      auto waiting = [&] {
        const Collector::Result first = c.Get(ids[0]);
        return first.tokens.size() < 2 && first.finish == FinishReason::kNone;
      };
      for (int k = 0; k < 10000 && waiting(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      EXPECT_FALSE(waiting()) << "the first request had no two tokens out in 10 s";
    }
    requests[i].on_output = c.Callback();
    ids.push_back(requests[i].id);
    EXPECT_TRUE((*engine)->Submit(std::move(requests[i])).ok());
  }
  EXPECT_TRUE(c.Wait(ids));
  (*engine)->Shutdown(true);
  for (const std::string& id : ids) out.results[id] = c.Get(id);
  out.one_flow = runner.one_flow;
  out.chunks_only = runner.chunks_only;
  out.most_in_flight = runner.most_in_flight;
  out.failed = runner.failed;
  return out;
}

// The same tokens, logprobs and prompt logprobs, bit for bit.
void ExpectSameBits(const Collector::Result& got, const Collector::Result& want) {
  EXPECT_EQ(got.finish, want.finish) << got.error.ToString();
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  EXPECT_EQ(0, std::memcmp(got.logprobs.data(), want.logprobs.data(), want.logprobs.size() * sizeof(float)))
      << "logprobs differ in their bits";
  ASSERT_EQ(got.prompt_logprobs.size(), want.prompt_logprobs.size());
  for (size_t i = 0; i < want.prompt_logprobs.size(); ++i) {
    EXPECT_EQ(0, std::memcmp(&got.prompt_logprobs[i].logprob, &want.prompt_logprobs[i].logprob, sizeof(float)))
        << "prompt logprob " << i;
  }
}

TEST(EngineStepFlow, DecodesAndChunksInOneFlowGiveOneRanksBits) {
  KIMIRT_REQUIRE_FILE(TinyA() + "/config.json");
  const std::vector<EngineRequest> requests = Requests();
  for (int tp : {1, 2}) {
    RunnerOptions ro;
    ro.tp = tp;
    const FlowRun one = RunRequests(ro, false);
    ASSERT_EQ(one.results.size(), requests.size());
    EXPECT_EQ(one.one_flow, 0) << "one stage forwards each call alone";
    for (const EngineRequest& r : requests) {
      ASSERT_EQ(one.results.at(r.id).tokens.size(), static_cast<size_t>(r.params.max_tokens)) << r.id;
    }
    ASSERT_EQ(one.results.at("r4").prompt_logprobs.size(), requests[4].prompt.size() - 1);
    for (int pp : tp == 1 ? std::vector<int>{2, 3} : std::vector<int>{2}) {
      // CPU ranks keep a step per stage in flight by default (steps_in_flight 0); 1: one at a time.
      for (const auto& [processes, steps] :
           {std::pair{false, 0}, std::pair{false, 1}, std::pair{true, 0}, std::pair{true, 1}}) {
        for (bool caching : {false, true}) {
          SCOPED_TRACE("TP" + std::to_string(tp) + " x PP" + std::to_string(pp) + (processes ? " processes" : " threads") +
                       (caching ? ", prefix cache on" : ", prefix cache off") +
                       (steps == 0 ? ", steps in flight" : ", a step at a time"));
          ro.pp = pp;
          ro.process_ranks = processes;
          ro.steps_in_flight = steps;
          const FlowRun got = RunRequests(ro, caching);
          EXPECT_GT(got.one_flow, 0) << "no step sent its decodes and chunks in one call";
          if (steps == 0) {
            EXPECT_EQ(got.most_in_flight, pp) << "the engine did not keep a step per stage in flight";
          } else {
            EXPECT_LE(got.most_in_flight, 1);
          }
          for (const EngineRequest& r : requests) {
            SCOPED_TRACE("request " + r.id);
            ExpectSameBits(got.results.at(r.id), one.results.at(r.id));
          }
        }
      }
    }
  }
}

// The third one-flow call fails (injected in the runner, before anything runs): exactly the
// requests it covered end with its error — their decode rows and chunks alike — and every other
// request's tokens and logprobs are the reference's, bit for bit.
TEST(EngineStepFlow, AFailingOneFlowCallEndsExactlyTheRequestsItCovers) {
  KIMIRT_REQUIRE_FILE(TinyA() + "/config.json");
  RunnerOptions ro;
  const FlowRun one = RunRequests(ro, false);
  ro.pp = 2;
  const FlowRun got = RunRequests(ro, false, /*fail_one_flow=*/3);
  ASSERT_GE(got.one_flow, 3);
  ASSERT_GE(got.failed.size(), 2u) << "a one-flow call covers a decode row and a chunk at least";
  size_t errors = 0;
  for (const auto& [id, result] : got.results) {
    SCOPED_TRACE("request " + id);
    if (result.finish == FinishReason::kError) {
      ++errors;
      EXPECT_NE(result.error.message().find("injected failure of a step's one flow"), std::string::npos)
          << result.error.ToString();
      continue;
    }
    ExpectSameBits(result, one.results.at(id));
  }
  EXPECT_EQ(errors, got.failed.size());
}

// Steps in flight (thread and process ranks, PP 2): two requests decode in two cohorts, one step each in
// flight. When x has 4 tokens out its callback aborts y, whose step is then in flight: the abort
// waits for that step's outputs (the runner never releases a sequence a stage may still write),
// y ends as aborted, every block comes back, and x's tokens are one rank's, bit for bit.
TEST(EngineStepFlow, AnAbortOfASequenceInFlightWaitsForItsStep) {
  KIMIRT_REQUIRE_FILE(TinyA() + "/config.json");
  auto run = [](RunnerOptions ro, bool abort_y) {
    std::map<std::string, Collector::Result> out;
    ro.num_kv_blocks = 64;
    ro.block_size = 8;
    auto inner = ModelRunner::Create(TinyA(), ro);
    EXPECT_TRUE(inner.ok()) << inner.status().ToString();
    if (!inner.ok()) return std::pair{out, int64_t{-1}};
    StepCountingRunner runner(**inner);
    auto engine = Engine::Create(runner, nullptr, EngineOptions{});
    EXPECT_TRUE(engine.ok()) << engine.status().ToString();
    Collector c;
    Engine* e = engine->get();
    int x_tokens = 0;
    for (const char* id : {"x", "y"}) {
      EngineRequest r;
      r.id = id;
      r.prompt = {3, 1, 4, 1, 5, 9, 2, 6};
      if (r.id == "y") r.prompt.push_back(5);
      r.params.temperature = 0;
      r.params.max_tokens = r.id == "x" ? 12 : 400;
      r.params.ignore_eos = true;
      r.params.logprobs = 0;
      r.on_output = [&, collect = c.Callback(), is_x = r.id == "x"](const RequestOutput& o) {
        collect(o);
        if (is_x && abort_y && (x_tokens += static_cast<int>(o.token_ids.size())) == 4) e->Abort("y");
      };
      EXPECT_TRUE(e->Submit(std::move(r)).ok());
    }
    EXPECT_TRUE(c.Wait(abort_y ? std::vector<std::string>{"x", "y"} : std::vector<std::string>{"x"}));
    if (abort_y) {  // (the reference's y may still be running: Shutdown ends it)
      for (int i = 0; i < 5000 && e->Stats().kv_blocks_used != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      EXPECT_EQ(e->Stats().kv_blocks_used, 0);
    }
    e->Shutdown(false);
    out["x"] = c.Get("x");
    out["y"] = c.Get("y");
    return std::pair{out, runner.released_in_flight};
  };
  RunnerOptions one;
  const auto [want, unused] = run(one, false);
  for (bool processes : {false, true}) {
    SCOPED_TRACE(processes ? "process ranks" : "thread ranks");
    RunnerOptions pp2;
    pp2.pp = 2;
    pp2.process_ranks = processes;
    pp2.rank_worker_binary = KIMIRT_BINARY;
    const auto [got, released_in_flight] = run(pp2, true);
    ExpectSameBits(got.at("x"), want.at("x"));
    EXPECT_EQ(got.at("y").finish, FinishReason::kAbort);
    EXPECT_LT(got.at("y").tokens.size(), 400u);
    EXPECT_EQ(released_in_flight, 0) << "a sequence was released while a step holding it was in flight";
  }
}

}  // namespace
}  // namespace kimirt
