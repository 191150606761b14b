// Process ranks (process_ranks_runner.h) against thread ranks: the same calls give the same
// logits bit for bit (the TCP communicator sums in the thread communicator's rank order), over a
// prefill, decode steps, a KDA snapshot restored into a second sequence that shares the prompt's
// blocks; and a follower killed mid-run is an error naming it within seconds, not a hang.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "kimirt/engine/model_runner.h"
#include "kimirt/engine/runner_trace_test_util.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::Trace;

std::string Fixture(const std::string& n) { return testing::TestDataPath("fixtures/" + n); }

using testing::ExpectSameBits;

RunnerOptions Options(bool processes, int tp = 2, bool ep = false) { return testing::TraceRunnerOptions(processes, tp, ep); }

// A fixture and a TP degree. With 4 ranks the rank order of the sums matters (with 2, x0 + x1
// equals x1 + x0 in IEEE arithmetic).
class ProcessRanks : public ::testing::TestWithParam<std::pair<std::string, int>> {};

TEST_P(ProcessRanks, LogitsEqualThreadRanksBitForBit) {
  const auto& [fixture, tp] = GetParam();
  KIMIRT_REQUIRE_FILE(Fixture(fixture + "/config.json"));
  auto threads = ModelRunner::Create(Fixture(fixture), Options(false, tp));
  ASSERT_TRUE(threads.ok()) << threads.status().ToString();
  auto procs = ModelRunner::Create(Fixture(fixture), Options(true, tp));
  ASSERT_TRUE(procs.ok()) << procs.status().ToString();
  const auto want = Trace(**threads);
  const auto got = Trace(**procs);
  ASSERT_NO_FATAL_FAILURE(ExpectSameBits(got, want));
  // The prefix-cache path reproduces the unshared sequence: the snapshot + shared block resume
  // exactly where sequence a was after its first block (last row of its second prefill).
  EXPECT_EQ(std::memcmp(got.back().data(), got[1].data() + got[1].size() - got.back().size(),
                        got.back().size() * sizeof(float)), 0);
  EXPECT_TRUE((*procs)->health().ok());
}

// Expert parallelism travels to the followers: each loads its own experts (and the zero
// stand-ins for the others) exactly as the thread ranks do, so the logits are the same bits.
TEST(ProcessRanksExpertParallel, LogitsEqualThreadRanksBitForBit) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    auto threads = ModelRunner::Create(Fixture("tiny-a"), Options(false, tp, /*ep=*/true));
    ASSERT_TRUE(threads.ok()) << threads.status().ToString();
    auto procs = ModelRunner::Create(Fixture("tiny-a"), Options(true, tp, /*ep=*/true));
    ASSERT_TRUE(procs.ok()) << procs.status().ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectSameBits(Trace(**procs), Trace(**threads)));
  }
}

// The latent projections' split (LoadOptions::shard_latent_moe) travels to the followers too: a
// follower that held them whole would skip the latent's all-gather that rank 0 runs.
TEST(ProcessRanksLatentSharding, LogitsEqualThreadRanksBitForBit) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  for (int tp : {2, 4}) {
    SCOPED_TRACE("tp " + std::to_string(tp));
    RunnerOptions o = Options(false, tp);
    o.shard_latent_moe = true;
    auto threads = ModelRunner::Create(Fixture("tiny-a"), o);
    ASSERT_TRUE(threads.ok()) << threads.status().ToString();
    o.process_ranks = true;
    auto procs = ModelRunner::Create(Fixture("tiny-a"), o);
    ASSERT_TRUE(procs.ok()) << procs.status().ToString();
    ASSERT_NO_FATAL_FAILURE(ExpectSameBits(Trace(**procs), Trace(**threads)));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ProcessRanks,
                         ::testing::Values(std::make_pair(std::string("tiny-a"), 2), std::make_pair(std::string("tiny-a"), 4),
                                           std::make_pair(std::string("kimi-linear-tiny"), 2),
                                           std::make_pair(std::string("kimi-linear-tiny"), 4)),
                         [](const auto& info) {
                           return std::string(info.param.first == "tiny-a" ? "TinyA" : "KimiLinearTiny") + "Tp" +
                                  std::to_string(info.param.second);
                         });

// Pipeline stages as processes (docs/distributed.md "Pipeline parallelism"): each rank one
// process, its stage's TP group and its pipeline linked by TCP through rank 0's rendezvous store.
// The runner trace (prefills, decode steps, a KDA snapshot restored into a sequence sharing the
// prompt's blocks) equals the thread ranks' at the same degrees and the TP-only run's (one stage:
// pipelining changes no sum), bit for bit.
TEST(ProcessRanksPipeline, LogitsEqualThreadRanksAndOneStageBitForBit) {
  for (const auto& [fixture, tp, pp] : {std::tuple{"tiny-a", 1, 2}, std::tuple{"tiny-a", 1, 3},
                                        std::tuple{"tiny-a", 2, 2}, std::tuple{"kimi-linear-tiny", 2, 2}}) {
    SCOPED_TRACE(std::string(fixture) + " tp " + std::to_string(tp) + " pp " + std::to_string(pp));
    KIMIRT_REQUIRE_FILE(Fixture(std::string(fixture) + "/config.json"));
    auto one_stage = ModelRunner::Create(Fixture(fixture), Options(false, tp));
    ASSERT_TRUE(one_stage.ok()) << one_stage.status().ToString();
    RunnerOptions o = Options(false, tp);
    o.pp = pp;
    auto threads = ModelRunner::Create(Fixture(fixture), o);
    ASSERT_TRUE(threads.ok()) << threads.status().ToString();
    o.process_ranks = true;
    auto procs = ModelRunner::Create(Fixture(fixture), o);
    ASSERT_TRUE(procs.ok()) << procs.status().ToString();
    EXPECT_EQ(testing::FollowerPids().size(), static_cast<size_t>(tp * pp - 1));
    const auto want = Trace(**one_stage);
    ASSERT_NO_FATAL_FAILURE(ExpectSameBits(Trace(**threads), want));
    ASSERT_NO_FATAL_FAILURE(ExpectSameBits(Trace(**procs), want));
    EXPECT_TRUE((*procs)->health().ok());
  }
}

// Batched decode through process ranks (runner_trace_test_util.h ExpectBatchedDecodeIsEachAlone).
TEST(ProcessRanksDecode, BatchedRowsEqualEachSequenceDecodedAlone) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  testing::ExpectBatchedDecodeIsEachAlone(Fixture("tiny-a"), Options(true));
}

// Micro-batches in flight on process ranks (docs/distributed.md "Micro-batches in flight"): a
// decode step of 1, 3, 5 and 64 sequences through PP 2, PP 3 and TP 2 × PP 2 (each stage a
// process, one sequence per micro-batch on the CPU) gives each row its sequence's bits decoded
// alone on one stage (TP 2's at TP 2); and so do the thread ranks.
TEST(ProcessRanksPipeline, MicroBatchedDecodeRowsAreEachSequenceAloneOnOneStage) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  for (const auto& [tp, pp] : {std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 2}}) {
    for (bool processes : {true, false}) {
      for (int batch : {1, 3, 5, 64}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + (processes ? " processes" : " threads") +
                     ", " + std::to_string(batch) + " sequences");
        RunnerOptions o = Options(processes, tp);
        o.pp = pp;
        ASSERT_NO_FATAL_FAILURE(testing::ExpectBatchedDecodeIsEachAlone(Fixture("tiny-a"), o, batch, Options(false, tp)));
      }
    }
  }
}

// A step in one flow through the runners (ForwardStep; docs/distributed.md "A step in one
// flow"): steps of 1, 3 and 6 sequences' prefill chunks alone, and of 1 and 3 sequences' chunks
// beside 1 and 2 decode rows, in one call (the decode rows, the chunks and their tokens go to
// every rank in one message) through PP 2, PP 3 and TP 2 × PP 2 on process and thread ranks give
// every decode row and chunk the bits it has forwarded alone on one stage (TP 2's at TP 2), and
// the decode step after them too.
TEST(ProcessRanksPipeline, StepsInFlightAreEachDecodeAndChunkAloneOnOneStage) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  for (const auto& [tp, pp] : {std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 2}}) {
    for (bool processes : {true, false}) {
      for (const auto& [seqs, decoders] : {std::pair{1, 0}, std::pair{3, 0}, std::pair{6, 0}, std::pair{1, 1}, std::pair{3, 2}}) {
        SCOPED_TRACE("tp " + std::to_string(tp) + " pp " + std::to_string(pp) + (processes ? " processes" : " threads") +
                     ", " + std::to_string(seqs) + " sequences' chunks, " + std::to_string(decoders) + " decode rows");
        RunnerOptions o = Options(processes, tp);
        o.pp = pp;
        ASSERT_NO_FATAL_FAILURE(
            testing::ExpectStepsInFlightAreEachAlone(Fixture("tiny-a"), o, seqs, Options(false, tp), decoders));
      }
    }
  }
}

// Runs tiny-a under `o` (`followers` processes), forwards a prompt, SIGKILLs follower `victim`,
// and checks the next Forward (with `decode_step`, a decode step of three sequences: micro-batches
// in flight under -pp) fails within 5 s naming `rank`, and health() turns bad. Later calls must
// fail at once (failed for good); resetting the runner stops every other follower.
void ExpectKilledFollowerNamed(const RunnerOptions& o, size_t followers, size_t victim, const std::string& rank,
                               bool decode_step = false) {
  auto r = ModelRunner::Create(Fixture("tiny-a"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<ModelRunner::Handle> hs;
  for (int i = 0; i < (decode_step ? 3 : 1); ++i) {
    hs.push_back((*r)->NewSequence());
    ASSERT_TRUE((*r)->Reserve(hs.back(), 16).ok());
    ASSERT_TRUE((*r)->Forward(hs.back(), std::vector<int32_t>{1, 2, static_cast<int32_t>(3 + i)}, true).ok());
  }
  const ModelRunner::Handle h = hs[0];
  const std::vector<int> pids = testing::FollowerPids();
  ASSERT_EQ(pids.size(), followers);
  ASSERT_EQ(kill(pids[victim], SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  // The next Forward's collectives (or the pipeline's Recv) read the dead rank's closed socket.
  Result<Tensor> l = decode_step ? (*r)->ForwardDecode(hs, std::vector<int32_t>{4, 5, 6})
                                 : (*r)->Forward(h, std::vector<int32_t>{4}, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(l.ok());
  EXPECT_LT(s, 5.0);
  EXPECT_NE(l.status().message().find(rank), std::string::npos) << l.status().message();
  EXPECT_FALSE((*r)->health().ok());
  EXPECT_FALSE((*r)->Forward(h, std::vector<int32_t>{5}, true).ok());
  EXPECT_FALSE((*r)->Reserve(h, 17).ok());
  r->reset();
  EXPECT_TRUE(testing::FollowerPids().empty());  // the supervisor stopped the others
}

// A stage's follower killed: rank 2, the last of three stages.
TEST(ProcessRanksPipeline, AKilledStageIsAnErrorNamingItsRank) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions o = Options(true, 1);
  o.pp = 3;
  ExpectKilledFollowerNamed(o, 2, 1, "rank 2");
}

// ... and in a decode step's micro-batches: the last stage (rank 2), or the middle one (rank 1,
// which stage 0 sends the micro-batches to and the last stage receives them from).
TEST(ProcessRanksPipeline, AKilledStageInAMicroBatchedStepIsAnErrorNamingItsRank) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions o = Options(true, 1);
  o.pp = 3;
  {
    SCOPED_TRACE("the last stage");
    ExpectKilledFollowerNamed(o, 2, 1, "rank 2", /*decode_step=*/true);
  }
  {
    SCOPED_TRACE("the middle stage");
    // Rank 2 then exits too, and rank 0 hears of it first; the supervisor's word names the
    // rank that was killed.
    ExpectKilledFollowerNamed(o, 2, 0, "rank 1 (local rank 1, pid", /*decode_step=*/true);
  }
}

// Steps in flight (docs/distributed.md "Steps in flight"): the last stage killed while rank 0
// keeps steps submitted. The first step that cannot complete — its submit, or else its collect,
// which the logits receiver answers — fails within 5 s naming the rank; every later call fails
// at once, and the runner ends (its receiver thread included) without a hang.
TEST(ProcessRanksPipeline, AKilledStageWithStepsInFlightIsAnErrorNamingItsRank) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions o = Options(true, 1);
  o.pp = 2;
  auto r = ModelRunner::Create(Fixture("tiny-a"), o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ((*r)->steps_in_flight(), 2);
  std::vector<ModelRunner::Handle> hs;
  const std::vector<int32_t> prompt{1, 2, 3}, next{4};
  for (int i = 0; i < 2; ++i) {
    hs.push_back((*r)->NewSequence());
    ASSERT_TRUE((*r)->Reserve(hs.back(), 16).ok());
  }
  // Two steps in flight, collected: the runner works.
  for (ModelRunner::Handle h : hs) {
    const ModelRunner::Chunk c{h, prompt, true};
    ASSERT_TRUE((*r)->SubmitStep(ModelRunner::Decodes{}, std::span(&c, 1)).ok());
  }
  for (int i = 0; i < 2; ++i) ASSERT_TRUE((*r)->CollectStep().ok());
  const std::vector<int> pids = testing::FollowerPids();
  ASSERT_EQ(pids.size(), 1u);
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  Status first = (*r)->SubmitStep(ModelRunner::Decodes{std::span(&hs[0], 1), next}, {});
  if (first.ok()) first = (*r)->SubmitStep(ModelRunner::Decodes{std::span(&hs[1], 1), next}, {});
  if (first.ok()) first = (*r)->CollectStep().status();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(first.ok());
  EXPECT_LT(s, 5.0);
  EXPECT_NE(first.message().find("rank 1"), std::string::npos) << first.message();
  EXPECT_FALSE((*r)->health().ok());
  EXPECT_FALSE((*r)->SubmitStep(ModelRunner::Decodes{std::span(&hs[0], 1), next}, {}).ok());
  r->reset();
  EXPECT_TRUE(testing::FollowerPids().empty());
}

TEST(ProcessRanksFailure, AKilledFollowerIsAnErrorNamingItsRankNotAHang) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions o = Options(true);
  o.tp = 4;  // tiny-a has 4 heads: ranks 1..3 are processes
  ExpectKilledFollowerNamed(o, 3, 1, "rank 2");
}

// Rank 2 of 4 dies after rank 0 sent it a step: the step's collectives end at once (on CPU the
// dead rank's socket closes; on GPUs the same test runs in process_ranks_cuda_test.cpp, where it
// takes the supervisor's abort of rank 0's NCCL communicator).
TEST(ProcessRanksFailure, AFollowerDyingInsideAStepEndsTheStepNamingIt) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions o = Options(true);
  o.tp = 4;
  testing::ExpectFollowerDyingInAStepNamed(Fixture("tiny-a"), o, 2);
}

TEST(ProcessRanksFailure, AFollowerThatCannotStartFailsCreate) {
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  RunnerOptions o = Options(true);
  o.rank_worker_binary = "/nonexistent/kimirt";
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ModelRunner::Create(Fixture("tiny-a"), o);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 10.0);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("rank 1"), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kimirt
