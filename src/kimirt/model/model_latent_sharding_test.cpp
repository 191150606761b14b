// LatentMoE's latent projections split over the TP ranks (Parallelism::shard_latent_moe;
// docs/plan.md "Weights"): routed_expert_down_proj column-parallel with the latent all-gathered,
// routed_expert_up_proj row-parallel with its partial output summed in the shared expert's
// all-reduce. On CPU thread ranks, for the fixtures with a LatentMoE whose heads split: the
// logits equal TP 1's and plain TP's within the EP test's tolerance, the greedy continuation is
// the same, the ranks agree bit for bit; each rank holds exactly its rows / columns of the
// checkpoint's projections and nothing else differs from plain TP; the planner counts what the
// loader holds; a degree that does not divide the latent is refused naming the tensor.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "kimirt/model/layout.h"
#include "kimirt/model/model_test_util.h"
#include "kimirt/model/rank_test_util.h"
#include "kimirt/tools/bench_model.h"

namespace kimirt {
namespace {

using testing::FixtureDir;
using testing::RankOutput;

struct Case {
  std::string fixture;
  std::vector<int> degrees;  // TP degrees its heads split over
};

class LatentShardingTest : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FIXTURE(GetParam().fixture);
    ids_ = testing::Goldens(FixtureDir(GetParam().fixture) + "/goldens.safetensors").Ids("prompt3.ids");
  }
  std::vector<RankOutput> Run(int tp, bool shard) {
    LoadOptions lo;
    lo.shard_latent_moe = shard;
    std::vector<RankOutput> out(static_cast<size_t>(tp));
    const std::vector<std::string> errors =
        testing::OnThreadRanks(GetParam().fixture, tp, lo, [&](Model& m, Communicator& comm) {
          out[static_cast<size_t>(comm.rank())] = testing::RunRank(m, ids_);
        });
    for (int r = 0; r < tp; ++r) {
      if (!errors[static_cast<size_t>(r)].empty()) out[static_cast<size_t>(r)].error = errors[static_cast<size_t>(r)];
    }
    return out;
  }
  std::vector<int32_t> ids_;
};

TEST_P(LatentShardingTest, LogitsAndGreedyTokensEqualOneRankAndPlainTp) {
  const std::vector<RankOutput> one = Run(1, true);  // one rank holds the projections whole anyway
  ASSERT_TRUE(one[0].error.empty()) << one[0].error;
  // ExpertParallelTest's bar: twice TensorParallelEqualsOneRank's 1e-5. The split moves where
  // the up-projection's sum is rounded (tp partial sums added in rank order); a lost or doubled
  // latent slice moves logits by O(0.1).
  const float tol = 2e-5f * std::max(1.0f, testing::MaxAbs(one[0].logits));
  for (int tp : GetParam().degrees) {
    SCOPED_TRACE("TP" + std::to_string(tp));
    const std::vector<RankOutput> plain = Run(tp, false), split = Run(tp, true);
    for (int r = 0; r < tp; ++r) {
      const RankOutput& got = split[static_cast<size_t>(r)];
      ASSERT_TRUE(got.error.empty()) << "rank " << r << ": " << got.error;
      ASSERT_TRUE(plain[static_cast<size_t>(r)].error.empty()) << plain[static_cast<size_t>(r)].error;
      EXPECT_LE(testing::MaxAbsDiff(got.logits, one[0].logits), tol) << "rank " << r;
      EXPECT_LE(testing::MaxAbsDiff(got.logits, plain[static_cast<size_t>(r)].logits), tol) << "rank " << r;
      EXPECT_EQ(got.greedy, one[0].greedy) << "rank " << r;
      // Every collective sums in rank order on every rank: the ranks agree bit for bit.
      EXPECT_EQ(0, std::memcmp(got.logits.raw(), split[0].logits.raw(), got.logits.nbytes())) << "rank " << r;
    }
  }
}

TEST_P(LatentShardingTest, EachRankHoldsItsSliceAndThePlanCountsIt) {
  const std::string dir = FixtureDir(GetParam().fixture);
  ModelWeights full;
  std::unique_ptr<Backend> full_backend = MakeCpuBackend();  // owns `full`'s tensors
  {
    auto comm = MakeSingleRankCommunicator();
    auto m = Model::Load(dir, *full_backend, *comm);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    full = (*m)->weights();
  }
  auto config = LoadModelConfig(dir + "/config.json");
  ASSERT_TRUE(config.ok());
  auto layout = Layout::Build(*config);
  ASSERT_TRUE(layout.ok());
  const int64_t D = config->hidden_size, Dl = config->ExpertHiddenSize();
  ASSERT_TRUE(config->UsesLatentMoe());
  uint64_t latent_bytes = 0;  // F32 as the CPU holds them, every MoE layer's two projections
  for (const LayerWeights& l : full.layers) {
    if (l.is_moe) latent_bytes += l.moe.latent_down.nbytes() + l.moe.latent_up.nbytes();
  }
  ASSERT_GT(latent_bytes, 0u);
  for (int tp : GetParam().degrees) {
    SCOPED_TRACE("TP" + std::to_string(tp));
    const int64_t per = Dl / tp;
    std::vector<uint64_t> plain_held(static_cast<size_t>(tp));
    LoadOptions plain;
    std::vector<std::string> errors = testing::OnThreadRanks(GetParam().fixture, tp, plain, [&](Model& m, Communicator& comm) {
      plain_held[static_cast<size_t>(comm.rank())] = HeldBytes(m.weights());
    });
    for (const std::string& e : errors) ASSERT_TRUE(e.empty()) << e;
    LoadOptions lo;
    lo.shard_latent_moe = true;
    errors = testing::OnThreadRanks(GetParam().fixture, tp, lo, [&](Model& m, Communicator& comm) {
      const int r = comm.rank();
      const ModelWeights& w = m.weights();
      for (size_t i = 0; i < w.layers.size(); ++i) {
        if (!w.layers[i].is_moe) continue;
        const Tensor& down = w.layers[i].moe.latent_down;  // [Dl, D]: rows r·per ..
        const Tensor& up = w.layers[i].moe.latent_up;      // [D, Dl]: columns r·per ..
        const Tensor& down_full = full.layers[i].moe.latent_down;
        const Tensor& up_full = full.layers[i].moe.latent_up;
        ASSERT_EQ(down.shape(), (Shape{per, D})) << "rank " << r << " layer " << i;
        ASSERT_EQ(up.shape(), (Shape{D, per})) << "rank " << r << " layer " << i;
        EXPECT_EQ(0, std::memcmp(down.f32(), down_full.f32() + r * per * D, static_cast<size_t>(per * D) * sizeof(float)))
            << "rank " << r << " layer " << i;
        for (int64_t row = 0; row < D; ++row) {
          ASSERT_EQ(0, std::memcmp(up.f32() + row * per, up_full.f32() + row * Dl + r * per,
                                   static_cast<size_t>(per) * sizeof(float)))
              << "rank " << r << " layer " << i << " row " << row;
        }
      }
      // Only the projections changed: (tp − 1) / tp of them fewer than plain TP holds.
      EXPECT_EQ(HeldBytes(w) * static_cast<uint64_t>(tp),
                plain_held[static_cast<size_t>(r)] * static_cast<uint64_t>(tp) - latent_bytes * static_cast<uint64_t>(tp - 1))
          << "rank " << r;
    });
    for (const std::string& e : errors) ASSERT_TRUE(e.empty()) << e;
    // The planner (stored bytes, BF16 here) takes the same (tp − 1) / tp of the stored projections.
    uint64_t stored_latent = 0;
    for (const TensorSpec& t : layout->tensors()) {
      if (t.role == TensorRole::kLatentDown || t.role == TensorRole::kLatentUp) stored_latent += t.nbytes();
    }
    EXPECT_EQ(PlannedWeightBytes(*layout, tp, 1, 1, true) * static_cast<uint64_t>(tp),
              PlannedWeightBytes(*layout, tp) * static_cast<uint64_t>(tp) - stored_latent * static_cast<uint64_t>(tp - 1));
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, LatentShardingTest,
                         ::testing::Values(Case{"tiny-a", {2, 4}}, Case{"k3-realheads", {2}}),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           std::string name = info.param.fixture;
                           for (char& ch : name) ch = ch == '-' ? '_' : ch;
                           return name;
                         });

// A degree that does not divide the latent width: refused naming the tensor and the numbers, while
// the same degree without the split is fine.
TEST(LatentSharding, ADegreeThatDoesNotDivideTheLatentIsRefused) {
  const std::string path = FixtureDir("tiny-a") + "/config.json";
  KIMIRT_REQUIRE_FILE(path);
  auto config = LoadModelConfig(path);
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  config->routed_expert_hidden_size = 34;  // 34 = 2 · 17: splits over 2, not over 4
  auto layout = Layout::Build(*config);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  Parallelism par;
  par.tp = 4;
  par.experts_dequantized = true;  // as the CPU loader widens tiny-a's MXFP4 experts
  EXPECT_TRUE(layout->CheckParallelism(par).ok()) << layout->CheckParallelism(par).ToString();
  par.shard_latent_moe = true;
  const Status st = layout->CheckParallelism(par);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("routed_expert_down_proj.weight: 34"), std::string::npos) << st.ToString();
  EXPECT_NE(st.ToString().find("TP 4"), std::string::npos) << st.ToString();
  par.tp = 2;
  EXPECT_TRUE(layout->CheckParallelism(par).ok());
}

}  // namespace
}  // namespace kimirt
