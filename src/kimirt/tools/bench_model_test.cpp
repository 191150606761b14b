// bench model's planned weight bytes are `kimirt plan`'s per-GPU weights, for the K3 2-layer
// bench config and the full K3 at TP 1 and 8, and at TP 8 with EP 8 (the figure the device's held
// bytes are set against).
#include <gtest/gtest.h>

#include "kimirt/model/config.h"
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
  }
}

}  // namespace
}  // namespace kimirt
