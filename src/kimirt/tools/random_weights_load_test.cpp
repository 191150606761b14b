// Random weights made at load (ModelSource::RandomWeights) against the checkpoint
// `make-checkpoint --random` writes for the same config and seed: the same logits bit for bit,
// for a K3 config with MXFP4 experts (tiny-a) and a Kimi-Linear one, on one rank and on two (thread
// ranks, expert parallelism, process ranks — whose followers make their own slices from the
// config path and seed they are sent); one rank on every built device. And TP 2 on random weights gives
// TP 1's logits within the tensor-parallel tolerance and TP 1's greedy tokens, which `bench model
// --config --random-weights -tp 2` runs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "kimirt/engine/engine_test_util.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/engine/runner_trace_test_util.h"
#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"
#include "kimirt/testing/devices.h"
#include "kimirt/testing/temp_dir.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tools/bench_model.h"
#include "kimirt/tools/checkpoint_writer.h"

namespace kimirt {
namespace {

constexpr uint64_t kSeed = 11;

std::string Config(const std::string& fixture) { return testing::FixtureDir(fixture) + "/config.json"; }

// make-checkpoint --random --seed kSeed of the fixture's config, written under `dir`.
void WriteRandomCheckpoint(const std::string& fixture, const std::string& dir) {
  KIMIRT_REQUIRE_FILE(Config(fixture));
  auto c = LoadModelConfig(Config(fixture));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  auto layout = Layout::Build(*c);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  std::ifstream in(Config(fixture), std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  CheckpointWriteOptions o;
  o.fill = CheckpointFill::kRandom;
  o.seed = kSeed;
  o.shards = 2;
  o.config_json = text.str();
  auto s = WriteCheckpoint(*layout, dir, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
}

using testing::ExpectSameBits;

RunnerOptions Options(const std::string& device, int tp, bool ep, bool processes) {
  return testing::TraceRunnerOptions(processes, tp, ep, device);
}

std::vector<std::vector<float>> TraceOf(const ModelSource& source, const RunnerOptions& o) {
  auto r = ModelRunner::Create(source, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? testing::Trace(**r) : std::vector<std::vector<float>>{};
}

// One rank on each built device (CUDA: BF16 matrices, MXFP4 experts held as stored).
class RandomWeightsLoadOnDevice : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(RandomWeightsLoadOnDevice, MadeAtLoadEqualsTheCheckpointOnDiskBitForBit) {
  const auto& [fixture, device] = GetParam();
  const testing::TempDir dir("kimirt_random_load_");
  ASSERT_NO_FATAL_FAILURE(WriteRandomCheckpoint(fixture, dir.path()));
  ExpectSameBits(TraceOf(ModelSource::RandomWeights(Config(fixture), kSeed), Options(device, 1, false, false)),
                 TraceOf(ModelSource::Directory(dir.path()), Options(device, 1, false, false)));
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RandomWeightsLoadOnDevice,
                         ::testing::Combine(::testing::Values("tiny-a", "kimi-linear-tiny"),
                                            ::testing::ValuesIn(testing::BuiltDevices())),
                         [](const auto& info) {
                           std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

#if KIMIRT_TEST_CUDA
// The CUDA backend packs a model's weights into slabs (Backend::BeginWeights; the default) or,
// with KIMIRT_WEIGHT_SLABS=0, into its caching pool's size classes; the kernels read the same
// values at other addresses, so the logits keep their bits (MXFP4 codes tiled, BF16 matrices
// tiled and not).
TEST(CudaWeightSlabs, PackedWeightsGiveThePoolsBits) {
  for (const std::string fixture : {"tiny-a", "kimi-linear-tiny"}) {
    SCOPED_TRACE(fixture);
    KIMIRT_REQUIRE_FILE(Config(fixture));
    const ModelSource source = ModelSource::RandomWeights(Config(fixture), kSeed);
    ASSERT_EQ(setenv("KIMIRT_WEIGHT_SLABS", "0", 1), 0);
    const auto pool = TraceOf(source, Options("cuda", 1, false, false));
    ASSERT_EQ(unsetenv("KIMIRT_WEIGHT_SLABS"), 0);
    const auto slabs = TraceOf(source, Options("cuda", 1, false, false));
    ASSERT_FALSE(pool.empty());
    ExpectSameBits(slabs, pool);
  }
}
#endif

// Two CPU ranks: threads, processes (followers sent the config path and seed), with and without
// expert parallelism.
class RandomWeightsLoad : public ::testing::TestWithParam<std::string> {};

TEST_P(RandomWeightsLoad, MadeAtLoadEqualsTheCheckpointOnDiskBitForBit) {
  const testing::TempDir dir("kimirt_random_load_");
  ASSERT_NO_FATAL_FAILURE(WriteRandomCheckpoint(GetParam(), dir.path()));
  const ModelSource disk = ModelSource::Directory(dir.path());
  const ModelSource made = ModelSource::RandomWeights(Config(GetParam()), kSeed);
  struct Case {
    const char* what;
    bool ep, processes;
  };
  for (const Case& k : {Case{"TP 2 threads", false, false}, Case{"TP 2 EP threads", true, false},
                        Case{"TP 2 process ranks", false, true}, Case{"TP 2 EP process ranks", true, true}}) {
    SCOPED_TRACE(k.what);
    const RunnerOptions o = Options("cpu", 2, k.ep, k.processes);
    ExpectSameBits(TraceOf(made, o), TraceOf(disk, o));
  }
  // Another seed is another model.
  const auto other = TraceOf(ModelSource::RandomWeights(Config(GetParam()), kSeed + 1), Options("cpu", 1, false, false));
  const auto mine = TraceOf(made, Options("cpu", 1, false, false));
  ASSERT_EQ(other.size(), mine.size());
  EXPECT_NE(other.front(), mine.front());
}

TEST_P(RandomWeightsLoad, TensorParallelMatchesOneRank) {
  const ModelSource made = ModelSource::RandomWeights(Config(GetParam()), kSeed);
  const auto one = TraceOf(made, Options("cpu", 1, false, false));
  for (bool ep : {false, true}) {
    SCOPED_TRACE(ep ? "TP 2 EP" : "TP 2");
    const auto two = TraceOf(made, Options("cpu", 2, ep, false));
    ASSERT_EQ(two.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      ASSERT_EQ(two[i].size(), one[i].size());
      float scale = 1.0f, diff = 0.0f;
      for (size_t j = 0; j < one[i].size(); ++j) {
        ASSERT_TRUE(std::isfinite(one[i][j])) << "call " << i;
        scale = std::max(scale, std::fabs(one[i][j]));
        diff = std::max(diff, std::fabs(two[i][j] - one[i][j]));
      }
      EXPECT_LE(diff, 1e-5f * scale) << "call " << i;  // model_consistency_test's TP tolerance
    }
  }
  auto r1 = ModelRunner::Create(made, Options("cpu", 1, false, false));
  auto r2 = ModelRunner::Create(made, Options("cpu", 2, false, false));
  ASSERT_TRUE(r1.ok() && r2.ok());
  const auto tokens = testing::GreedyTokens(**r1);
  ASSERT_EQ(tokens.size(), 4u);
  EXPECT_EQ(testing::GreedyTokens(**r2), tokens);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, RandomWeightsLoad, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) { return std::string(info.param == "tiny-a" ? "TinyA" : "KimiLinearTiny"); });

// `bench model --config FILE --random-weights -tp 2` runs with no checkpoint written, and says
// how long the load took.
TEST(BenchModelRandomWeights, RunsAtTensorParallelTwo) {
  KIMIRT_REQUIRE_FILE(Config("tiny-a"));
  BenchModelOptions o;
  o.config_path = Config("tiny-a");
  o.seed = kSeed;
  o.tp = 2;
  o.expert_parallel = true;
  o.batch_sizes = {1, 2};
  o.prompt_len = 12;
  o.decode_tokens = 4;
  auto r = RunBenchModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->points.size(), 2u);
  EXPECT_GT(r->load_seconds, 0.0);
  EXPECT_NE(r->model.find("random weights, seed 11"), std::string::npos) << r->model;
  EXPECT_NE(r->ToText().find("load: "), std::string::npos);
  EXPECT_GT(r->max_abs_logit, 0.0f);
  EXPECT_LT(r->max_abs_logit, 1e3f);  // the recipe keeps activations O(1)
  for (const BenchModelPoint& p : r->points) EXPECT_GT(p.decode_tokens_per_s, 0.0);
}

}  // namespace
}  // namespace kimirt
