// GPU tests of -tp 2 --device cuda: one process per GPU over NCCL (process_ranks_runner.h; CUDA
// builds, run by `scripts/gpu_check.sh nccl` on a machine with two GPUs, e.g. nvidia-h200-x2).
// With fewer than two GPUs they fail saying so (never skip).
//   - every logits tensor of the process-ranks trace (a prefill in two chunks, five decode steps,
//     a second sequence resumed from a shared block + KDA snapshot) at TP 2 equals TP 1 on one
//     GPU within the CPU TP tests' tolerance (model_consistency_test.cpp: 1e-5 × max|logit|),
//     with the same greedy token at every decode step;
//   - an engine's greedy generation of four requests is token for token TP 1's;
//   - a follower killed mid-run is an error naming its rank, within the collective timeout.
#if KIMIRT_TEST_CUDA
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/engine/engine_test_util.h"
#include "kimirt/engine/model_runner.h"
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

RunnerOptions CudaOptions(int tp) {
  RunnerOptions o;
  o.device = "cuda";
  o.matrix_dtype = DType::kF32;  // F32 GEMMs: TP 1 and TP 2 differ only by the sums' order
  o.tp = tp;
  o.block_size = 8;
  o.num_kv_blocks = 256;
  o.max_kda_snapshots = 4;
  o.rank_worker_binary = KimirtBinary();
  o.rank_timeout_ms = 10000;
  return o;
}

#define KIMIRT_REQUIRE_TWO_GPUS()                                                                         \
  ASSERT_GE(VisibleCudaDevices(), 2) << "-tp 2 --device cuda needs two GPUs; " << VisibleCudaDevices() \
                                     << " visible (run on nvidia-h200-x2: scripts/gpu_check.sh nccl)"

class ProcessRanksCuda : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessRanksCuda, Tp2LogitsMatchTp1) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  auto one = ModelRunner::Create(Fixture(GetParam()), CudaOptions(1));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const auto want = testing::Trace(**one);
  one->reset();
  auto two = ModelRunner::Create(Fixture(GetParam()), CudaOptions(2));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  const auto got = testing::Trace(**two);
  ASSERT_EQ(got.size(), want.size());
  const int64_t V = (*two)->config().vocab_size;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "call " << i;
    float max_abs = 0, max_diff = 0;
    for (size_t j = 0; j < want[i].size(); ++j) {
      ASSERT_TRUE(std::isfinite(got[i][j])) << "call " << i << " logit " << j;
      max_abs = std::max(max_abs, std::fabs(want[i][j]));
      max_diff = std::max(max_diff, std::fabs(got[i][j] - want[i][j]));
    }
    EXPECT_LE(max_diff, 1e-5f * std::max(1.0f, max_abs)) << "call " << i << " (max |logit| " << max_abs << ")";
    // The greedy token of each call's last row (the next token of a decode) is TP 1's.
    const std::vector<float> g(got[i].end() - V, got[i].end()), w(want[i].end() - V, want[i].end());
    EXPECT_EQ(testing::Argmax(g), testing::Argmax(w)) << "call " << i;
  }
  EXPECT_TRUE((*two)->health().ok()) << (*two)->health().ToString();
}

TEST_P(ProcessRanksCuda, Tp2GreedyGenerationIsTp1s) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  auto one = ModelRunner::Create(Fixture(GetParam()), CudaOptions(1));
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const auto want = testing::GreedyTokens(**one);
  one->reset();
  ASSERT_EQ(want.size(), 4u);
  auto two = ModelRunner::Create(Fixture(GetParam()), CudaOptions(2));
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ(testing::GreedyTokens(**two), want);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ProcessRanksCuda, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) { return info.param == "tiny-a" ? "TinyA" : "KimiLinearTiny"; });

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

}  // namespace
}  // namespace kimirt
#endif  // KIMIRT_TEST_CUDA
