// GPU tests of -pp 2 --device cuda: two pipeline stages, one process per GPU, the residual
// stream's state and the logits crossing by ncclSend/ncclRecv (docs/distributed.md "Pipeline
// parallelism"; CUDA builds, run by `scripts/gpu_check.sh pp2` on a machine with two GPUs, e.g.
// nvidia-h200-x2). With fewer than two GPUs they fail saying so (never skip).
//   - every logits tensor of the process-ranks trace (runner_trace_test_util.h) at PP 2 equals one
//     GPU's within the CPU TP tests' tolerance (1e-5 × max|logit|), with the same greedy token at
//     every call, on the fixtures and on two real-width models (random weights at the published
//     widths: the 2-layer K3, whose stages cut through an AttnRes block, and the 2-layer
//     Kimi-Linear-48B, one KDA and one MLA layer). A stage computes what one GPU computes with
//     the same kernels, so the difference is expected to be exactly 0; the tests print it;
//   - an engine's greedy generation of four requests is token for token one GPU's.
#if KIMIRT_TEST_CUDA
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/engine/engine_test_util.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/engine/runner_trace_test_util.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tools/checkpoint_writer.h"

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

RunnerOptions CudaOptions(int pp) {
  RunnerOptions o;
  o.device = "cuda";
  o.matrix_dtype = DType::kF32;
  o.pp = pp;
  o.block_size = 8;
  o.num_kv_blocks = 256;
  o.max_kda_snapshots = 4;
  o.rank_worker_binary = KimirtBinary();
  o.rank_timeout_ms = 60000;
  return o;
}

#define KIMIRT_REQUIRE_TWO_GPUS()                                                                         \
  ASSERT_GE(VisibleCudaDevices(), 2) << "-pp 2 --device cuda needs two GPUs; " << VisibleCudaDevices() \
                                     << " visible (run on nvidia-h200-x2: scripts/gpu_check.sh pp2)"

// The trace of `dir` on one GPU and at PP 2: within 1e-5 × max|logit| call by call, the same
// greedy token; the largest difference is printed (0 expected).
void ExpectPp2MatchesOneGpu(const std::string& dir, RunnerOptions base) {
  base.pp = 1;
  auto one = ModelRunner::Create(dir, base);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  const auto want = testing::Trace(**one);
  const int64_t V = (*one)->config().vocab_size;
  one->reset();
  base.pp = 2;
  auto two = ModelRunner::Create(dir, base);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  const auto got = testing::Trace(**two);
  ASSERT_EQ(got.size(), want.size());
  float worst = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "call " << i;
    float max_abs = 0, max_diff = 0;
    for (size_t j = 0; j < want[i].size(); ++j) {
      ASSERT_TRUE(std::isfinite(got[i][j])) << "call " << i << " logit " << j;
      max_abs = std::max(max_abs, std::fabs(want[i][j]));
      max_diff = std::max(max_diff, std::fabs(got[i][j] - want[i][j]));
    }
    worst = std::max(worst, max_diff);
    EXPECT_LE(max_diff, 1e-5f * std::max(1.0f, max_abs)) << "call " << i << " (max |logit| " << max_abs << ")";
    const std::vector<float> g(got[i].end() - V, got[i].end()), w(want[i].end() - V, want[i].end());
    EXPECT_EQ(testing::Argmax(g), testing::Argmax(w)) << "call " << i;
  }
  std::printf("PP 2 vs one GPU, %s: largest |logit difference| %g over %zu calls\n", dir.c_str(), worst, want.size());
  ::testing::Test::RecordProperty("max_abs_diff", std::to_string(worst));
  EXPECT_TRUE((*two)->health().ok()) << (*two)->health().ToString();
}

class ProcessRanksCudaPipeline : public ::testing::TestWithParam<std::string> {};

TEST_P(ProcessRanksCudaPipeline, Pp2LogitsMatchOneGpu) {
  KIMIRT_REQUIRE_TWO_GPUS();
  KIMIRT_REQUIRE_FILE(Fixture(GetParam() + "/config.json"));
  ExpectPp2MatchesOneGpu(Fixture(GetParam()), CudaOptions(1));
}

TEST_P(ProcessRanksCudaPipeline, Pp2GreedyGenerationIsOneGpus) {
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

INSTANTIATE_TEST_SUITE_P(Fixtures, ProcessRanksCudaPipeline, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) { return info.param == "tiny-a" ? "TinyA" : "KimiLinearTiny"; });

// Real widths: random checkpoints of the 2-layer bench configs (bench/configs), written to a
// temporary directory; weights held as BF16 (exact for BF16 and MXFP4 values) so the 2-layer K3
// fits comfortably; the latent cache BF16 as serve holds it.
TEST(ProcessRanksCudaPipelineRealWidth, Pp2LogitsMatchOneGpu) {
  KIMIRT_REQUIRE_TWO_GPUS();
  for (const char* name : {"kimi-k3-2layer", "kimi-linear-48b-2layer"}) {
    SCOPED_TRACE(name);
    const std::string config = testing::TestDataPath(std::string("bench/configs/") + name + ".json");
    KIMIRT_REQUIRE_FILE(config);
    auto c = LoadModelConfig(config);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto layout = Layout::Build(*c);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    const std::string dir = (std::filesystem::temp_directory_path() /
                             ("kimirt-pp2-" + std::string(name) + "-" + std::to_string(::getpid())))
                                .string();
    std::ifstream in(config);
    std::ostringstream text;
    text << in.rdbuf();
    CheckpointWriteOptions wo;
    wo.fill = CheckpointFill::kRandom;
    wo.seed = 7;
    wo.shards = 1;
    wo.config_json = text.str();
    ASSERT_TRUE(WriteCheckpoint(*layout, dir, wo).ok());
    RunnerOptions o = CudaOptions(1);
    o.matrix_dtype = DType::kBF16;
    o.kv_cache_dtype = KvCacheDType::kBF16;
    ExpectPp2MatchesOneGpu(dir, o);
    std::error_code ec;
    std::filesystem::remove_all(dir, ec);
  }
}

}  // namespace
}  // namespace kimirt
#endif  // KIMIRT_TEST_CUDA
