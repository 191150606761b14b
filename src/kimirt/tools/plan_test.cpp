// The seed's three tables (../shared/seed/day0-kimi-k3-atom-mi355x.txt) are the independent
// expectation: every number printed there must come out of the planner at the seed's precision.
#include "kimirt/tools/plan.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "kimirt/engine/model_runner.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::TestDataPath;

Layout K3Layout() {
  Result<ModelConfig> c = LoadModelConfig(TestDataPath("configs/kimi-k3.json"));
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return std::move(Layout::Build(*c)).value();
}

std::string Dec3(uint64_t bytes, double unit) {
  char b[32];
  std::snprintf(b, sizeof(b), "%.3f", static_cast<double>(bytes) / unit);
  return b;
}
std::string GB(uint64_t b) { return Dec3(b, 1e9); }
std::string GiB(uint64_t b) { return Dec3(b, 1073741824.0); }

PlanOptions SeedOptions() {
  PlanOptions o;
  o.par.tp = 8;
  o.context_tokens = 1048576;
  o.kv_cache_dtype = PlanKvDType::kFP8;
  o.gpu = FindGpu("mi355x");
  o.prefix_caching = false;  // the seed's recipe serves with --no-enable_prefix_caching
  return o;
}

TEST(Plan, ReproducesTheSeedWeightTable) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  Result<PlanReport> r = PlanFromLayout(l, SeedOptions(), "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->num_tensors, 497220);
  EXPECT_EQ(r->checkpoint_bytes, 1560860324864ull);
  const StagePlan& h = r->heaviest();
  const std::pair<const char*, const char*> seed[kNumCategories] = {
      {"1.453", "0.182"},    {"1446.456", "180.807"}, {"24.310", "3.039"}, {"61.214", "7.763"},
      {"11.145", "2.029"},   {"0.006", "0.006"},      {"16.275", "11.231"}};
  for (int k = 0; k < kNumCategories; ++k) {
    SCOPED_TRACE(std::string(CategoryName(static_cast<Category>(k))));
    EXPECT_EQ(GB(r->full_bytes[k]), seed[k].first);
    EXPECT_EQ(GB(h.weight_bytes[k]), seed[k].second);
  }
  EXPECT_EQ(GB(r->checkpoint_bytes), "1560.860");
  EXPECT_EQ(GB(h.weights), "205.057");
  EXPECT_EQ(h.weights, 205056581360ull);  // k3-checkpoint-memory.md "Bottom line"
  EXPECT_EQ(h.loaded_weights, h.weights);  // no padding at TP8
}

// --shard-latent-moe: K3's 92 MoE layers each hold routed_expert_down_proj and _up_proj, 7168 ×
// 3584 BF16 apiece; split over TP8 a rank keeps 1/8 of them, so "Other" loses 7/8 of 92 · 2 ·
// 7168 · 3584 · 2 bytes and nothing else moves.
TEST(Plan, ShardingTheLatentProjectionsTakesSevenEighthsOfThemAtTp8) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  Result<PlanReport> seed = PlanFromLayout(l, SeedOptions(), "test");
  PlanOptions o = SeedOptions();
  o.par.shard_latent_moe = true;
  Result<PlanReport> split = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(seed.ok() && split.ok());
  const uint64_t latent = 92ull * 2 * 7168 * 3584 * 2;
  const int other = static_cast<int>(Category::kOther);
  EXPECT_EQ(split->heaviest().weight_bytes[other], seed->heaviest().weight_bytes[other] - latent / 8 * 7);
  EXPECT_EQ(GB(split->heaviest().weight_bytes[other]), "2.959");
  for (int k = 0; k < kNumCategories; ++k) {
    if (k != other) EXPECT_EQ(split->heaviest().weight_bytes[k], seed->heaviest().weight_bytes[k]) << k;
  }
  EXPECT_EQ(split->heaviest().weights, seed->heaviest().weights - latent / 8 * 7);
}

TEST(Plan, ReproducesTheSeedRuntimeAndCombinedTables) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  Result<PlanReport> r = PlanFromLayout(l, SeedOptions(), "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const StagePlan& h = r->heaviest();
  ASSERT_EQ(h.runtime.size(), 4u);
  EXPECT_EQ(GB(h.runtime[0].bytes), "14.496");
  EXPECT_EQ(h.runtime[0].layers, 24);
  EXPECT_EQ(GB(h.runtime[1].bytes), "0.054");
  EXPECT_EQ(h.runtime[1].layers, 69);
  EXPECT_EQ(GB(h.runtime[2].bytes), "0.002");
  EXPECT_EQ(GB(h.runtime[3].bytes), "0.940");
  EXPECT_EQ(h.runtime[3].layers, 93);
  EXPECT_EQ(GB(h.runtime_bytes), "15.491");
  EXPECT_EQ(h.runtime_bytes, 15491210240ull);
  // The printed formulas are the ones used: 1 byte for the FP8 latent, 4 for the FP32 state.
  EXPECT_EQ(h.runtime[0].formula, "1,048,576 × (512 + 64) × 1 byte (fp8)/layer");
  EXPECT_EQ(h.runtime[1].formula, "(96 ÷ 8) × 128 × 128 × 4 bytes (fp32)/layer");
  EXPECT_EQ(h.runtime[2].formula, "3 × (12288 ÷ 8) × (4 − 1) × 2 bytes (bf16)/layer");
  EXPECT_EQ(h.runtime[3].formula, "8,192 × ⌈93 ÷ 12⌉ × 7168 × 2 bytes (bf16)");

  EXPECT_EQ(GiB(h.weights), "190.974");
  EXPECT_EQ(GiB(h.runtime_bytes), "14.427");
  EXPECT_EQ(GiB(h.total()), "205.401");
  ASSERT_TRUE(r->gpu.has_value());
  const double cap = static_cast<double>(r->gpu->capacity_bytes);
  char pct[16];
  std::snprintf(pct, sizeof(pct), "%.1f", 100.0 * static_cast<double>(h.total()) / cap);
  EXPECT_STREQ(pct, "71.3");
  EXPECT_EQ(Dec3(r->gpu->capacity_bytes - h.total(), 1073741824.0), "82.599");
  EXPECT_TRUE(r->fits);

  // The table a person reads carries the same numbers.
  const std::string text = FormatPlanText(*r);
  for (const char* n : {"1446.456 GB", "180.807 GB", "205.057 GB", "15.491 GB", "190.974 GiB",
                        "14.427 GiB", "205.401 GiB", "288 GiB", "71.3%", "82.599 GiB", "497,220 tensors",
                        "1,560,860,324,864 bytes"}) {
    EXPECT_NE(text.find(n), std::string::npos) << n << " missing from:\n" << text;
  }
}

TEST(Plan, BF16LatentCacheDoublesTheKvRow) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  PlanOptions o = SeedOptions();
  o.kv_cache_dtype = PlanKvDType::kBF16;
  Result<PlanReport> r = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(r.ok());
  // k3-checkpoint-memory.md "Seed inconsistencies" 1: 28.991 GB; 29.987 GB; 218.901 GiB; 76.0 %.
  EXPECT_EQ(GB(r->heaviest().runtime[0].bytes), "28.991");
  EXPECT_EQ(GB(r->heaviest().runtime_bytes), "29.987");
  EXPECT_EQ(GiB(r->heaviest().total()), "218.901");
}

TEST(Plan, K3DoesNotFitEightH200sAndNamesTheSmallestLayout) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  PlanOptions o = SeedOptions();
  o.gpu = FindGpu("h200");
  Result<PlanReport> r = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->fits);
  ASSERT_TRUE(r->smallest_fit.has_value());
  const LayoutChoice& f = *r->smallest_fit;
  // At least the 1.56 TB of weights must be spread: over 11 GPUs' worth of 141 GB.
  EXPECT_GE(f.gpus(), 12);
  EXPECT_LE(f.per_gpu_bytes, r->budget_bytes);
  // Independently re-plan the suggestion: it must fit, and one GPU fewer (any split) must not.
  PlanOptions fit = o;
  fit.par.tp = f.tp;
  fit.pp = f.pp;
  Result<PlanReport> again = PlanFromLayout(l, fit, "test");
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_TRUE(again->fits);
  EXPECT_EQ(again->heaviest().total(), f.per_gpu_bytes);
  for (int tp = 1; tp <= 8; ++tp) {
    const int n = f.gpus() - 1;
    if (n % tp != 0) continue;
    PlanOptions fewer = o;
    fewer.par.tp = tp;
    fewer.pp = n / tp;
    fewer.suggest = false;
    Result<PlanReport> x = PlanFromLayout(l, fewer, "test");
    if (x.ok()) EXPECT_FALSE(x->fits) << "TP" << tp << " PP" << n / tp << " fits on fewer GPUs";
  }
  EXPECT_NE(FormatPlanText(*r).find("DOES NOT FIT"), std::string::npos);
}

TEST(Plan, KimiLinear48BFitsOneH200) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-linear-48b-a3b.json"));
  Result<ModelConfig> c = LoadModelConfig(TestDataPath("configs/kimi-linear-48b-a3b.json"));
  ASSERT_TRUE(c.ok());
  Result<Layout> l = Layout::Build(*c);
  ASSERT_TRUE(l.ok());
  PlanOptions o;
  o.gpu = FindGpu("H200");
  Result<PlanReport> r = PlanFromLayout(*l, o, "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->fits) << FormatPlanText(*r);
  EXPECT_EQ(r->options.context_tokens, 1048576);  // model_max_length
  ASSERT_EQ(r->heaviest().runtime.size(), 4u);    // no AttnRes; the prefix cache's snapshots (on by default)
  EXPECT_EQ(r->heaviest().runtime[0].layers, 7);
  EXPECT_EQ(r->heaviest().runtime[3].name, "KDA prefix snapshots");
  EXPECT_EQ(r->heaviest().runtime[3].layers, 20);
  EXPECT_GT(r->kv_token_capacity, 1048576);
}

TEST(Plan, PipelineStagesSplitLayersLikeVllm) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  PlanOptions o = SeedOptions();
  o.par.tp = 4;
  o.pp = 4;  // 93 = 23 + 23 + 24 + 23: the remainder goes to the stage before the last
  Result<PlanReport> r = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->stages.size(), 4u);
  EXPECT_EQ(r->stages[0].first_layer, 0);
  EXPECT_EQ(r->stages[0].last_layer, 22);
  EXPECT_EQ(r->stages[2].first_layer, 46);
  EXPECT_EQ(r->stages[2].last_layer, 69);
  EXPECT_EQ(r->stages[3].last_layer, 92);
  // Every byte lands on exactly one stage: the stages' TP-rank sums add up to the text model.
  uint64_t sum = 0;
  for (const StagePlan& s : r->stages) sum += s.loaded_weights;
  Parallelism one;
  one.tp = 4;
  uint64_t expect = 0;
  for (const TensorSpec& t : l.tensors()) expect += l.SliceFor(t, one, 0).loaded_bytes;
  EXPECT_EQ(sum, expect);
}

TEST(Plan, CountsThePrefixCachesKdaSnapshotsAsServeSizesThem) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  PlanOptions o = SeedOptions();
  o.prefix_caching = true;
  Result<PlanReport> r = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const StagePlan& h = r->heaviest();
  // Hand arithmetic. One snapshot per GPU at TP8: 69 KDA layers of (96/8) x 128 x 128 FP32
  // recurrent state + 3 x (4 - 1) x 12288/8 FP32 conv windows = 69 x 841,728 bytes. serve's
  // cache budget is what 0.9 x 288 GiB leaves after the 205,056,581,360 bytes of weights:
  // floor(0.9 x 309,237,645,312) - 205,056,581,360 = 73,257,299,420; a tenth of it holds 126
  // snapshots (7,325,729,942 / 58,079,232 = 126.1).
  ASSERT_TRUE(h.snapshots.has_value());
  EXPECT_EQ(h.snapshots->bytes_each, 69ull * 841728);
  EXPECT_EQ(h.snapshots->cache_budget, 73257299420ull);
  EXPECT_EQ(h.snapshots->count, 126);
  ASSERT_EQ(h.runtime.size(), 5u);  // the seed's four rows, then the snapshots
  EXPECT_EQ(h.runtime[4].name, "KDA prefix snapshots");
  EXPECT_EQ(h.runtime[4].bytes, 126ull * 69 * 841728);
  EXPECT_EQ(h.runtime[4].layers, 69);
  EXPECT_EQ(h.runtime[4].formula, "126 × ((96 ÷ 8) × 128 × 128 + 9 × 1536) × 4 bytes/layer");
  EXPECT_EQ(h.runtime_bytes, 15491210240ull + 126ull * 69 * 841728);  // the seed's total + the row
  const std::string text = FormatPlanText(*r);
  EXPECT_NE(text.find("KDA prefix snapshots"), std::string::npos) << text;
  EXPECT_NE(text.find("7.318 GB"), std::string::npos) << text;
  EXPECT_NE(FormatPlanJson(*r).find("\"kda_snapshots\""), std::string::npos);

  // An explicit count; and without a GPU no budget to take a share of: no row, but a note.
  o.kda_snapshots = 10;
  r = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->heaviest().runtime.back().bytes, 10ull * 69 * 841728);
  o.kda_snapshots = -1;
  o.gpu.reset();
  r = PlanFromLayout(l, o, "test");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->heaviest().runtime.size(), 4u);
  EXPECT_NE(FormatPlanText(*r).find("not counted here"), std::string::npos);
  o.kda_snapshots = -2;
  EXPECT_FALSE(PlanFromLayout(l, o, "test").ok());
}

// The planner's snapshot row is what the runner serve builds allocates: for the same cache
// budget, the same count of snapshots of the same size (KdaStateSlots::SlotBytes on a rank).
TEST(Plan, SnapshotBytesMatchWhatTheRunnerAllocates) {
  const std::string dir = TestDataPath("fixtures/tiny-a");
  KIMIRT_REQUIRE_FILE(dir + "/config.json");
  Result<ModelConfig> c = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_GT(c->NumKdaLayers(), 0);
  Result<Layout> l = Layout::Build(*c);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  PlanOptions o;
  o.context_tokens = 256;
  o.gpu = GpuSpec{"custom", "64 MiB", 64ull << 20, "test", 0.0, 8};
  Result<PlanReport> r = PlanFromLayout(*l, o, "test");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_TRUE(r->heaviest().snapshots.has_value());
  const SnapshotPlan plan = *r->heaviest().snapshots;
  ASSERT_GT(plan.count, 1);
  auto runner_for = [&](int tp) {
    RunnerOptions ro;
    ro.tp = tp;
    ro.block_size = 16;
    ro.kv_cache_bytes = plan.cache_budget;  // what serve's runner gets from the same GPU budget
    ro.kda_snapshot_fraction = kServeKdaSnapshotFraction;  // serve's share with caching on
    return ModelRunner::Create(dir, ro);
  };
  Result<std::unique_ptr<ModelRunner>> one = runner_for(1);
  ASSERT_TRUE(one.ok()) << one.status().ToString();
  EXPECT_EQ((*one)->kda_snapshot_bytes(), plan.bytes_each);
  EXPECT_EQ((*one)->kda_snapshot_capacity(), plan.count);
  EXPECT_EQ(r->heaviest().runtime.back().bytes,
            static_cast<uint64_t>((*one)->kda_snapshot_capacity()) * (*one)->kda_snapshot_bytes());
  // On two ranks each holds half the heads: the bytes the planner's rule gives for TP2.
  Result<std::unique_ptr<ModelRunner>> two = runner_for(2);
  ASSERT_TRUE(two.ok()) << two.status().ToString();
  EXPECT_EQ((*two)->kda_snapshot_bytes(), KdaSnapshotBytes(*c, 2, c->NumKdaLayers()));
  EXPECT_EQ((*two)->kda_snapshot_bytes() * 2, plan.bytes_each);
  EXPECT_EQ((*two)->kda_snapshot_capacity(), KdaSnapshotsFor(plan.cache_budget, kServeKdaSnapshotFraction,
                                                             (*two)->kda_snapshot_bytes()));
  EXPECT_EQ(PlanOptions{}.kda_snapshot_fraction, kServeKdaSnapshotFraction);
}

TEST(Plan, RejectsBadOptions) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  PlanOptions o = SeedOptions();
  o.par.tp = 7;
  Result<PlanReport> r = PlanFromLayout(l, o, "test");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("TP 7"), std::string::npos) << r.status().message();
  o = SeedOptions();
  o.pp = 94;
  EXPECT_FALSE(PlanFromLayout(l, o, "test").ok());
  o = SeedOptions();
  o.gpu_memory_utilization = 1.5;
  EXPECT_FALSE(PlanFromLayout(l, o, "test").ok());
}

}  // namespace
}  // namespace kimirt

#include "kimirt/tools/bench_model.h"

namespace kimirt {
namespace {

// The decode-traffic estimate of `kimirt bench model`, against hand arithmetic on K3 at TP8.
TEST(DecodeStepBytes, K3AtTp8CountsSharedWeightsExpectedExpertsAndCaches) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = K3Layout();
  // One sequence, empty context: shared weights (the TP8 per-GPU weights minus routed experts
  // and the embedding shard) + 16/896 of the experts + the KDA states read and written.
  const uint64_t per_gpu = 205056581360ull;                 // the seed's TP8 per-GPU bytes
  const uint64_t experts_tp8 = 1446456066048ull / 8;         // routed experts, each rank's slice
  const uint64_t embed_tp8 = 163840ull * 7168 * 2 / 8;       // embedding shard (rows read: ~0)
  const double want_shared = static_cast<double>(per_gpu - experts_tp8 - embed_tp8);
  const double kda = 2.0 * 12 * 128 * 128 * 4 * 69;          // 12 heads per rank, FP32, r+w
  const double want = want_shared + experts_tp8 * (16.0 / 896.0) + kda;
  const double got = static_cast<double>(DecodeStepBytes(l, 8, 1, 0, 1, /*weight_bytes=*/0));
  EXPECT_NEAR(got, want, want * 1e-9);
  // A large batch touches every expert; the latent cache adds 576 bytes per token and MLA layer.
  const double big = static_cast<double>(DecodeStepBytes(l, 8, 4096, 1000, 1, 0));
  const double want_big = want_shared + experts_tp8 + 4096.0 * 1000 * 576 * 24 + kda * 4096;
  EXPECT_NEAR(big, want_big, want_big * 1e-6);
}

}  // namespace
}  // namespace kimirt
