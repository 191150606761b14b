#include "kimirt/tools/checkpoint_writer.h"

#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "kimirt/core/dtype_convert.h"
#include "kimirt/testing/temp_dir.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tools/plan.h"

namespace kimirt {
namespace {

using testing::TestDataPath;

using testing::TempDir;

// The layout of the config at `rel` in the test data; a missing file fails the test by name.
void LoadLayout(const std::string& rel, std::optional<Layout>* layout) {
  const std::string path = TestDataPath(rel);
  KIMIRT_REQUIRE_FILE(path);
  Result<ModelConfig> c = LoadModelConfig(path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Result<Layout> l = Layout::Build(*c);
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  layout->emplace(std::move(*l));
}

TEST(CheckpointWriter, RandomTinyCheckpointRoundTrips) {
  std::optional<Layout> layout;
  ASSERT_NO_FATAL_FAILURE(LoadLayout("fixtures/tiny-b/config.json", &layout));
  const Layout& l = *layout;
  const TempDir tmp("kimirt_random_tiny_b_");
  const std::string& dir = tmp.path();
  CheckpointWriteOptions o;
  o.fill = CheckpointFill::kRandom;
  o.seed = 7;
  o.shards = 3;
  o.config_json = "{}";
  Result<CheckpointWriteSummary> s = WriteCheckpoint(l, dir, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->shards, 3);
  EXPECT_EQ(s->tensors, 1002);

  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->shards().size(), 3u);
  EXPECT_TRUE(CheckCheckpoint(l, **ckpt).ok());
  EXPECT_EQ((*ckpt)->total_bytes(), l.total_bytes());
  for (const TensorSpec& t : l.tensors()) {
    Result<std::span<const uint8_t>> d = (*ckpt)->Data(t.name);
    ASSERT_TRUE(d.ok()) << d.status().ToString();
    const std::vector<uint8_t> want = RandomTensorBytes(l, t, 7);
    ASSERT_EQ(d->size(), want.size()) << t.name;
    ASSERT_EQ(std::memcmp(d->data(), want.data(), want.size()), 0) << t.name;
  }
  // The same seed gives the same bytes; another seed other bytes.
  const TensorSpec* q = l.Find("language_model.model.layers.0.self_attn.q_proj.weight");
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(RandomTensorBytes(l, *q, 7), RandomTensorBytes(l, *q, 7));
  EXPECT_NE(RandomTensorBytes(l, *q, 7), RandomTensorBytes(l, *q, 8));

  // MXFP4 experts decode to weights of the intended standard deviation 1/sqrt(fan_in): fan_in 64 → 0.125.
  const std::string E = "language_model.model.layers.1.block_sparse_moe.experts.3.w1.";
  std::span<const uint8_t> packed = *(*ckpt)->Data(E + "weight_packed");
  std::span<const uint8_t> scale = *(*ckpt)->Data(E + "weight_scale");
  const int64_t rows = 64, in = 64;
  double sum2 = 0;
  std::vector<float> row(static_cast<size_t>(in));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeMxfp4Row(packed.data() + r * in / 2, scale.data() + r * in / 32, in, row.data());
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v));
      sum2 += static_cast<double>(v) * v;
    }
  }
  const double stddev = std::sqrt(sum2 / static_cast<double>(rows * in));
  EXPECT_NEAR(stddev, 0.125, 0.02);
}

// The whole 1.56 TB release as holes: 96 shards whose headers must give the same plan as the
// layout (the seed's tables from real headers), with almost nothing allocated on disk.
TEST(CheckpointWriter, SparseKimiK3PlansLikeItsConfig) {
  std::optional<Layout> layout;
  ASSERT_NO_FATAL_FAILURE(LoadLayout("configs/kimi-k3.json", &layout));
  const Layout& l = *layout;
  const TempDir tmp("kimirt_sparse_k3_");
  const std::string& dir = tmp.path();
  CheckpointWriteOptions o;
  o.fill = CheckpointFill::kSparse;
  o.shards = 96;
  Result<CheckpointWriteSummary> s = WriteCheckpoint(l, dir, o);
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(s->tensors, 497220);
  uint64_t apparent = 0, allocated = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    struct stat st {};
    ASSERT_EQ(::stat(e.path().c_str(), &st), 0);
    apparent += static_cast<uint64_t>(st.st_size);
    allocated += static_cast<uint64_t>(st.st_blocks) * 512;
  }
  EXPECT_GT(apparent, 1560860324864ull);
  EXPECT_LT(allocated, uint64_t{1} << 30) << "sparse payloads took disk space";

  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(dir);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
  EXPECT_EQ((*ckpt)->num_tensors(), 497220u);
  EXPECT_EQ((*ckpt)->shards().size(), 96u);
  EXPECT_EQ((*ckpt)->total_bytes(), 1560860324864ull);
  for (const auto& shard : (*ckpt)->shards()) EXPECT_FALSE(shard->mapped());  // headers only

  PlanOptions po;
  po.par.tp = 8;
  po.context_tokens = 1048576;
  po.kv_cache_dtype = PlanKvDType::kFP8;
  po.gpu = FindGpu("MI355X");
  Result<PlanReport> from_ckpt = PlanFromCheckpoint(l, **ckpt, po, "same");
  Result<PlanReport> from_cfg = PlanFromLayout(l, po, "same");
  ASSERT_TRUE(from_ckpt.ok()) << from_ckpt.status().ToString();
  ASSERT_TRUE(from_cfg.ok());
  EXPECT_EQ(FormatPlanJson(*from_ckpt), FormatPlanJson(*from_cfg));
  EXPECT_EQ(from_ckpt->heaviest().weights, 205056581360ull);
  for (const auto& shard : (*ckpt)->shards()) EXPECT_FALSE(shard->mapped());
}

TEST(CheckpointWriter, PlanFromCheckpointNamesMissingAndMisShapedTensors) {
  std::optional<Layout> layout;
  ASSERT_NO_FATAL_FAILURE(LoadLayout("fixtures/tiny-a/config.json", &layout));
  const Layout& l = *layout;
  Result<ModelConfig> c = LoadModelConfig(TestDataPath("fixtures/tiny-b/config.json"));
  ASSERT_TRUE(c.ok());
  // tiny-b's checkpoint checked against tiny-a's layout: every kind of mismatch at once.
  Result<std::unique_ptr<Checkpoint>> ckpt = Checkpoint::Open(TestDataPath("fixtures/tiny-b"));
  ASSERT_TRUE(ckpt.ok());
  PlanOptions po;
  Result<PlanReport> r = PlanFromCheckpoint(l, **ckpt, po, "x");
  ASSERT_FALSE(r.ok());
  const std::string& m = r.status().message();
  EXPECT_NE(m.find("unexpected"), std::string::npos) << m;
  EXPECT_NE(m.find("mis-shaped"), std::string::npos) << m;
  EXPECT_NE(m.find("language_model.model.embed_tokens.weight is [1000, 96] BF16, expected [512, 64] BF16"),
            std::string::npos)
      << m;
}

}  // namespace
}  // namespace kimirt
