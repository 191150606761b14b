// GPU tests of -tp 2 --device cuda: one process per GPU over NCCL (process_ranks_runner.h; CUDA
// builds, run by `scripts/gpu_check.sh nccl` on a machine with two GPUs, e.g. nvidia-h200-x2).
// With fewer than two GPUs they fail saying so (never skip). Under KIMIRT_RANKS_SHARE_GPU=1 they
// run with both ranks on one GPU (`scripts/gpu_check.sh tp2shared`, `pp2shared`; rank_device.h).
//   - every logits tensor of the process-ranks trace (a prefill in two chunks, five decode steps,
//     a second sequence resumed from a shared block + KDA snapshot) at TP 2 equals TP 1 on one
//     GPU within the CPU TP tests' tolerance (model_consistency_test.cpp: 1e-5 × max|logit|) with
//     F32 weights (the fixtures, the 48B's real widths), within a BF16 step with BF16 weights (the
//     real-width K3 and 48B), with the same greedy token at every decode step;
//   - an engine's greedy generation of four requests is token for token TP 1's;
//   - decode graphs at TP 2 (the collectives captured): every step's bits those of --enforce-eager;
//   - a follower killed mid-run is an error naming its rank, within the collective timeout; one
//     that dies inside a step ends the step within seconds (the communicator aborted).
// And -pp 2 --device cuda (ProcessRanksCudaPipeline*, `scripts/gpu_check.sh pp2`): two pipeline
// stages, the residual stream's state and the logits crossing by ncclSend/ncclRecv
// (docs/distributed.md "Pipeline parallelism"):
//   - every logits tensor of the trace at PP 2 equals one GPU's within the same tolerance, with
//     the same greedy token, on the fixtures and on two real-width models (random weights at the
//     published widths: the 2-layer K3, whose stages cut through an AttnRes block, and the 2-layer
//     Kimi-Linear-48B, one KDA and one MLA layer). A stage computes what one GPU computes with the
//     same kernels, so the difference is expected to be exactly 0; the tests print it;
//   - an engine's greedy generation of four requests is token for token one GPU's;
//   - a decode step's micro-batches in flight: each row bit for bit its sequence alone on one GPU.
#if KIMIRT_TEST_CUDA
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/engine/engine_test_util.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/engine/rank_device.h"
#include "kimirt/engine/runner_trace_test_util.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

std::string Fixture(const std::string& n) { return testing::TestDataPath("fixtures/" + n); }

// The followers' binary: the `kimirt` beside this test binary (the GPU bundle unpacks both into
// one directory, as the build does), else the build's own.
std::string KimirtBinary() {
  std::error_code ec;
  const std::filesystem::path beside = std::filesystem::read_symlink("/proc/self/exe", ec).parent_path() / "kimirt";
  return !ec && std::filesystem::exists(beside) ? beside.string() : std::string(KIMIRT_BINARY);
}

RunnerOptions CudaOptions(int tp, int pp = 1) {
  RunnerOptions o;
  o.device = "cuda";
  o.matrix_dtype = DType::kF32;  // F32 GEMMs: TP 1 and TP 2 differ only by the sums' order
  o.tp = tp;
  o.pp = pp;
  o.block_size = 8;
  o.num_kv_blocks = 256;
  o.max_kda_snapshots = 4;
  o.rank_worker_binary = KimirtBinary();
  o.rank_timeout_ms = 10000;
  return o;
}

// Two GPUs, or one under KIMIRT_RANKS_SHARE_GPU=1 (every rank on GPU 0, the peer all-reduce
// alone: the -tp 2 tests' correctness where one GPU is lent; rank_device.h).
#define KIMIRT_REQUIRE_TWO_GPUS()                                                                                    \
  ASSERT_GE(VisibleCudaDevices(), RanksShareGpu() ? 1 : 2)                                                          \
      << "-tp 2 --device cuda needs two GPUs (or KIMIRT_RANKS_SHARE_GPU=1 and one); " << VisibleCudaDevices()        \
      << " visible (run on nvidia-h200-x2: scripts/gpu_check.sh nccl)"

// The CPU TP tests' tolerance (model_consistency_test.cpp), relative to max(1, max|logit|): F32
// weights and activations, where the split changes only the grouping of F32 sums.
constexpr float kF32Tolerance = 1e-5f;
// With weights held BF16 as serve holds them, the tensor-core kernels round their activations to
// BF16, and a sum that the split regroups (an all-reduced o_proj or down-projection) can land on
// the other side of a rounding: that element moves by a BF16 step (2^-8 relative), which the
// layers after it carry to the logits. One BF16 step of the largest logit bounds that (a wrong
// slice or a missing all-reduce moves logits by O(1)); measured on an H100: 1.2e-3 at a largest
// logit of 4.8, 1/16 of it (session 38, tp2shared).
constexpr float kBf16Tolerance = 1.0f / 256;

// The trace of `source` on one GPU (`one`'s options) and on two ranks (`two`'s): call by call
// within `tolerance` × max(1, max|logit|), and the greedy token of each call's last row (the next
// token of a decode) the same. Returns the largest difference.
float ExpectTwoRanksMatchOneGpu(const ModelSource& source, const RunnerOptions& one_o, const RunnerOptions& two_o,
                                float tolerance = kF32Tolerance) {
  auto one = ModelRunner::Create(source, one_o);
  EXPECT_TRUE(one.ok()) << one.status().ToString();
  if (!one.ok()) return -1;
  const auto want = testing::Trace(**one);
  one->reset();
  auto two = ModelRunner::Create(source, two_o);
  EXPECT_TRUE(two.ok()) << two.status().ToString();
  if (!two.ok()) return -1;
  const auto got = testing::Trace(**two);
  EXPECT_EQ(got.size(), want.size());
  const int64_t V = (*two)->config().vocab_size;
  float worst = 0;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i].size(), want[i].size()) << "call " << i;
    if (got[i].size() != want[i].size()) continue;
    float max_abs = 0, max_diff = 0;
    for (size_t j = 0; j < want[i].size(); ++j) {
      EXPECT_TRUE(std::isfinite(got[i][j])) << "call " << i << " logit " << j;
      max_abs = std::max(max_abs, std::fabs(want[i][j]));
      max_diff = std::max(max_diff, std::fabs(got[i][j] - want[i][j]));
    }
    worst = std::max(worst, max_diff);
    EXPECT_LE(max_diff, tolerance * std::max(1.0f, max_abs)) << "call " << i << " (max |logit| " << max_abs << ")";
    const std::vector<float> g(got[i].end() - V, got[i].end()), w(want[i].end() - V, want[i].end());
    EXPECT_EQ(testing::Argmax(g), testing::Argmax(w)) << "call " << i;
  }
  EXPECT_TRUE((*two)->health().ok()) << (*two)->health().ToString();
  return worst;
}

// An engine's greedy generation of four requests on two ranks is one GPU's, token for token.
void ExpectSameGreedyGeneration(const std::string& source, const RunnerOptions& one_o, const RunnerOptions& two_o) {
  auto one = ModelRunner::Create(source, one_o);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const auto want = testing::GreedyTokens(**one);
  one->reset();
  ASSERT_EQ(want.size(), 4u);
  auto two = ModelRunner::Create(source, two_o);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(testing::GreedyTokens(**two), want);
}

class ProcessRanksCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessRanksCuda, Tp2LogitsMatchTp1) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  ExpectTwoRanksMatchOneGpu(ModelSource::Directory(Fixture(GetParam())), CudaOptions(1), CudaOptions(2));
}

// Batched decode at TP 2 on two GPUs (the engine batches up to RowInvariantRows there): each
// row is its sequence decoded alone, bit for bit (the all-reduce sums in rank order at any size).
TEST_P(ProcessRanksCuda, Tp2BatchedDecodeRowsAreEachSequenceAlone) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  testing::ExpectBatchedDecodeIsEachAlone(Fixture(GetParam()), CudaOptions(2));
}

TEST_P(ProcessRanksCuda, Tp2GreedyGenerationIsTp1s) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  ExpectSameGreedyGeneration(Fixture(GetParam()), CudaOptions(1), CudaOptions(2));
}

// Decode graphs at TP 2 (docs/distributed.md "Decode graphs at TP > 1"; the NCCL collectives
// captured with the step): three sequences decoded together for 10 steps with graphs (the
// default) and with --enforce-eager give every step's logits bit for bit, and rank 0 replayed
// graphs (the ranks agreed to capture the second time the step's shape came).
TEST_P(ProcessRanksCuda, Tp2DecodeGraphsGiveTheEagerBits) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  auto run = [&](bool eager, int64_t* replays) {
    std::vector<std::vector<float>> out;
    RunnerOptions o = CudaOptions(2);
    o.enforce_eager = eager;
    auto r = ModelRunner::Create(Fixture(GetParam()), o);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return out;
    std::vector<ModelRunner::Handle> hs;
    for (int i = 0; i < 3; ++i) {
      hs.push_back((*r)->NewSequence());
      EXPECT_TRUE((*r)->Reserve(hs.back(), 24).ok());
      EXPECT_TRUE((*r)->Forward(hs.back(), std::vector<int32_t>{1, 2 + i, 3 + 2 * i}, true).ok());
    }
    for (int step = 0; step < 10; ++step) {
      const std::vector<int32_t> ids = {(step * 7 + 5) % 500, (step * 11 + 9) % 500, (step * 13 + 1) % 500};
      auto l = (*r)->ForwardDecode(hs, ids);
      EXPECT_TRUE(l.ok()) << l.status().ToString();
      if (!l.ok()) return out;
      out.push_back(testing::Host(*l));
    }
    *replays = (*r)->graph_replays();
    EXPECT_TRUE((*r)->health().ok()) << (*r)->health().ToString();
    return out;
  };
  int64_t eager_replays = -1, graph_replays = -1;
  const auto want = run(true, &eager_replays);
  const auto got = run(false, &graph_replays);
  EXPECT_EQ(eager_replays, 0);
  EXPECT_GE(graph_replays, 5) << "the decode steps at TP 2 did not run as graphs";
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    EXPECT_EQ(0, std::memcmp(got[i].data(), want[i].data(), got[i].size() * sizeof(float))) << "step " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ProcessRanksCuda, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) { return info.param == "tiny-a" ? "TinyA" : "KimiLinearTiny"; });

class ProcessRanksCudaPipeline : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessRanksCudaPipeline, Pp2LogitsMatchOneGpu) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  const float worst =
      ExpectTwoRanksMatchOneGpu(ModelSource::Directory(Fixture(GetParam())), CudaOptions(1), CudaOptions(1, 2));
  std::printf("PP 2 vs one GPU, %s: largest |logit difference| %g\n", GetParam().c_str(), worst);
}

TEST_P(ProcessRanksCudaPipeline, Pp2GreedyGenerationIsOneGpus) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  ExpectSameGreedyGeneration(Fixture(GetParam()), CudaOptions(1), CudaOptions(1, 2));
}

// Steps in flight on GPUs (docs/distributed.md "Steps in flight"; asked for: --steps-in-flight 2):
// the engine submits the next step before collecting this one, and the logits cross on an NCCL
// communicator and stream of their own; the greedy tokens are still one GPU's.
TEST_P(ProcessRanksCudaPipeline, Pp2StepsInFlightGreedyGenerationIsOneGpus) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  RunnerOptions o = CudaOptions(1, 2);
  o.steps_in_flight = 2;
  ExpectSameGreedyGeneration(Fixture(GetParam()), CudaOptions(1), o);
}

// Micro-batches in flight (docs/distributed.md "Micro-batches in flight"): a decode step of 5 and
// of 64 sequences at PP 2 splits into micro-batches (2 by default: 3 + 2 and 32 + 32 rows; 4 asked:
// 16 rows each) that overlap the two GPUs; the kernels are row-invariant up to 64 rows, so each
// row must be, bit for bit, its sequence decoded alone on one GPU.
TEST_P(ProcessRanksCudaPipeline, Pp2MicroBatchedDecodeRowsAreEachSequenceAloneOnOneGpu) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  for (int micro_batches : {0, 4}) {
    for (int batch : {5, 64}) {
      SCOPED_TRACE(std::to_string(batch) + " sequences, --pp-micro-batches " + std::to_string(micro_batches));
      RunnerOptions o = CudaOptions(1, 2);
      o.pp_micro_batches = micro_batches;
      ASSERT_NO_FATAL_FAILURE(testing::ExpectBatchedDecodeIsEachAlone(Fixture(GetParam()), o, batch, CudaOptions(1)));
    }
  }
}

// Prefill chunks in flight (docs/distributed.md "Prefill chunks in flight"): steps of 3 and 6
// sequences' chunks in one ForwardStep call at PP 2 overlap the two GPUs; each chunk's logits
// must be, bit for bit, what the same two stages give it forwarded alone, one chunk after another.
TEST_P(ProcessRanksCudaPipeline, Pp2PrefillChunksInFlightAreEachChunkAlone) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  for (int seqs : {3, 6}) {
    SCOPED_TRACE(std::to_string(seqs) + " sequences");
    ASSERT_NO_FATAL_FAILURE(
        testing::ExpectStepsInFlightAreEachAlone(Fixture(GetParam()), CudaOptions(1, 2), seqs, CudaOptions(1, 2)));
  }
}

// A step in one flow (docs/distributed.md "A step in one flow"): 3 and 5 decode rows (micro-batches
// of 2 + 1 and 3 + 2 rows) followed by 3 sequences' prefill chunks, in one ForwardStep call at
// PP 2; every decode row (the kernels are row-invariant up to 64 rows) and chunk must be, bit for
// bit, what the same two stages give it forwarded alone.
TEST_P(ProcessRanksCudaPipeline, Pp2DecodesAndChunksInOneFlowAreEachAlone) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  for (int decoders : {3, 5}) {
    SCOPED_TRACE(std::to_string(decoders) + " decode rows");
    ASSERT_NO_FATAL_FAILURE(testing::ExpectStepsInFlightAreEachAlone(Fixture(GetParam()), CudaOptions(1, 2), 3,
                                                                     CudaOptions(1, 2), decoders));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ProcessRanksCudaPipeline, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) { return info.param == "tiny-a" ? "TinyA" : "KimiLinearTiny"; });

// Real widths: random weights made at load (ModelSource::RandomWeights) at the 2-layer bench
// configs' widths (bench/configs); `tp` × `pp` = 2 ranks against one GPU. Both models with weights
// held as BF16 (exact for BF16 and MXFP4 values) and a BF16 latent cache, as serve holds them
// (kBf16Tolerance; a pipeline changes no sum, so PP 2 is expected exact either way); and the
// Kimi-Linear-48B with F32 weights and cache, F32 end to end (its experts are BF16, not MXFP4,
// whose decode kernel takes BF16 activations), within the CPU TP tests' own kF32Tolerance.
void ExpectRealWidthTwoGpusMatchOne(int tp, int pp) {
  KIMIRT_REQUIRE_TWO_GPUS();
  struct Case {
    const char* name;
    DType matrix;
    KvCacheDType cache;
    float tolerance;
  };
  for (const Case& c : {Case{"kimi-k3-2layer", DType::kBF16, KvCacheDType::kBF16, kBf16Tolerance},
                        Case{"kimi-linear-48b-2layer", DType::kBF16, KvCacheDType::kBF16, kBf16Tolerance},
                        Case{"kimi-linear-48b-2layer", DType::kF32, KvCacheDType::kF32, kF32Tolerance}}) {
    const std::string what = std::string(c.name) + (c.matrix == DType::kF32 ? ", F32" : ", BF16");
    SCOPED_TRACE(what);
    const std::string config = testing::TestDataPath(std::string("bench/configs/") + c.name + ".json");
    KIMIRT_REQUIRE_FILE(config);
    RunnerOptions one = CudaOptions(1), two = CudaOptions(tp, pp);
    for (RunnerOptions* o : {&one, &two}) {
      o->matrix_dtype = c.matrix;
      o->kv_cache_dtype = c.cache;
      o->rank_timeout_ms = 300000;  // making GBs of weights takes longer than a fixture's 10 s
    }
    const float worst = ExpectTwoRanksMatchOneGpu(ModelSource::RandomWeights(config, 7), one, two, c.tolerance);
    std::printf("%s vs one GPU, %s (random weights): largest |logit difference| %g (bound %g x max(1, max|logit|))\n",
                tp > 1 ? "TP 2" : "PP 2", what.c_str(), worst, c.tolerance);
  }
}

TEST(ProcessRanksCudaPipelineRealWidth, Pp2LogitsMatchOneGpu) { ExpectRealWidthTwoGpusMatchOne(1, 2); }

// Issue 15's "TP 2 logits equal TP 1 within the CPU TP tests' tolerance on a real-width model":
// the split sums differ from one GPU's only by their grouping (F32: within that tolerance; BF16:
// within one BF16 step, kBf16Tolerance says why).
TEST(ProcessRanksCudaRealWidth, Tp2LogitsMatchOneGpu) { ExpectRealWidthTwoGpusMatchOne(2, 1); }

// Rank 1 dies between steps: the supervisor names it within moments (health()), and the next
// Forward fails with that error at once instead of waiting in an NCCL collective for rank 1.
TEST(ProcessRanksCudaFailure, AKilledFollowerIsAnErrorNamingItsRankNotAHang) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  auto r = ModelRunner::Create(Fixture("tiny-a"), CudaOptions(2));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelRunner::Handle h = (*r)->NewSequence();
  ASSERT_TRUE((*r)->Reserve(h, 16).ok());
  ASSERT_TRUE((*r)->Forward(h, std::vector<int32_t>{1, 2, 3}, true).ok());
  const std::vector<int> pids = testing::FollowerPids();
  ASSERT_EQ(pids.size(), 1u);
  ASSERT_EQ(kill(pids[0], SIGKILL), 0);
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 100 && (*r)->health().ok(); ++i) usleep(20000);
  EXPECT_NE((*r)->health().message().find("rank 1"), std::string::npos) << (*r)->health().ToString();
  Result<Tensor> l = (*r)->Forward(h, std::vector<int32_t>{4}, true);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(l.ok());
  EXPECT_LT(s, 5.0);
  EXPECT_NE(l.status().message().find("rank 1"), std::string::npos) << l.status().message();
  r->reset();
  EXPECT_TRUE(testing::FollowerPids().empty());
}

// Rank 1 dies inside a step, after rank 0 sent it: rank 0's part waits for it inside NCCL (the
// host is in the logits' download, not in a collective), where only the supervisor's abort of the
// communicator ends it before the 5-minute collective timeout. The step fails within seconds.
TEST(ProcessRanksCudaFailure, AFollowerDyingInsideAStepEndsTheStepNamingIt) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture("tiny-a/config.json"));
  testing::ExpectFollowerDyingInAStepNamed(Fixture("tiny-a"), CudaOptions(2), 1);
}

}  // namespace
}  // namespace kimirt
#endif  // KIMIRT_TEST_CUDA
