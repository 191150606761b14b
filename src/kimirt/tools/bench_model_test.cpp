// bench model's planned weight bytes are `kimirt plan`'s per-GPU weights, for the K3 2-layer
// bench config and the full K3 at TP 1 and 8, at TP 8 with EP 8 and at TP 2 × PP 2 (the figure the device's held
// bytes are set against).
#include <gtest/gtest.h>

#include <algorithm>

#include "kimirt/model/config.h"
#include "kimirt/testing/devices.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tools/bench_model.h"
#include "kimirt/tools/plan.h"

namespace kimirt {
namespace {

TEST(BenchModel, PlannedWeightBytesArePlansPerGpuWeights) {
  for (const char* path : {"bench/configs/kimi-k3-2layer.json", "configs/kimi-k3.json"}) {
    SCOPED_TRACE(path);
    const std::string file = testing::TestDataPath(path);
    KIMIRT_REQUIRE_FILE(file);
    auto c = LoadModelConfig(file);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto layout = Layout::Build(*c);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    for (int tp : {1, 8}) {
      PlanOptions po;
      po.par.tp = tp;
      po.suggest = false;
      auto plan = PlanFromLayout(*layout, po, "--config");
      ASSERT_TRUE(plan.ok()) << plan.status().ToString();
      EXPECT_EQ(PlannedWeightBytes(*layout, tp), plan->heaviest().weights) << "TP" << tp;
    }
    // Expert parallelism (bench model --enable-expert-parallel): plan -tp 8 -ep 8's figure.
    PlanOptions po;
    po.par.tp = po.par.ep = 8;
    po.suggest = false;
    auto plan = PlanFromLayout(*layout, po, "--config");
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_EQ(PlannedWeightBytes(*layout, 8, 8), plan->heaviest().weights);
    // Pipeline stages (bench model -pp): the most weights of plan -tp 2 -pp 2's stages (plan's
    // heaviest stage counts the runtime state too).
    po = PlanOptions();
    po.par.tp = 2;
    po.pp = 2;
    po.suggest = false;
    plan = PlanFromLayout(*layout, po, "--config");
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    uint64_t most = 0;
    for (const StagePlan& sp : plan->stages) most = std::max(most, sp.weights);
    EXPECT_EQ(PlannedWeightBytes(*layout, 2, 1, 2), most);
    EXPECT_LT(PlannedWeightBytes(*layout, 2, 1, 2), PlannedWeightBytes(*layout, 2));
  }
}

// What loading took from the device by the driver's count (device_bytes_loading_took): unknown
// (0) for host memory; on CUDA at least the bytes of the tensors the model holds: they go into
// fresh 128 MiB slabs, which the driver maps and counts (pool blocks, KIMIRT_WEIGHT_SLABS=0, can
// land a small model in pages the driver mapped for an earlier test, and its count then stays).
class BenchModelFootprint : public ::testing::TestWithParam<std::string> {};

TEST_P(BenchModelFootprint, LoadTakesTheDriversCount) {
  const std::string config = testing::FixtureDir("kimi-linear-tiny") + "/config.json";
  KIMIRT_REQUIRE_FILE(config);
  const std::string& device = GetParam();
  BenchModelOptions o;
  o.config_path = config;
  o.device = device;
  o.matrix_dtype = device == "cpu" ? DType::kF32 : DType::kBF16;
  o.batch_sizes = {1};
  o.prompt_len = 8;
  o.decode_tokens = 2;
  Result<BenchModelReport> r = RunBenchModel(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_GT(r->weight_bytes_on_device, 0u);
  if (device == "cpu") {
    EXPECT_EQ(r->device_bytes_loading_took, 0u);
  } else {
    EXPECT_GE(r->device_bytes_loading_took, r->weight_bytes_on_device);
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, BenchModelFootprint, ::testing::ValuesIn(testing::BuiltDevices()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace kimirt
