// Expert parallelism on CPU thread ranks (docs/distributed.md "Expert parallelism"): with ep = tp
// every rank holds E / tp routed experts whole and zero stand-ins for the others. Checked on the
// fixtures whose heads split (tiny-a, kimi-linear-tiny: 8 experts each) at TP 2 and 4: the logits
// equal TP 1 within twice the TP test's tolerance (model_consistency_test.cpp; why, at the test)
// and the greedy continuation is the same; each rank holds exactly its experts (the checkpoint's values, whole)
// and the routed-expert bytes `kimirt plan -ep` counts; at the MoE op, on every backend built
// (the CUDA cases in a CUDA build, on one GPU), each rank adds exactly its own (token, slot)
// contributions; degrees that cannot place the experts are refused naming the numbers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <functional>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/random.h"
#include "kimirt/model/model_test_util.h"
#include "kimirt/model/moe.h"
#include "kimirt/model/rank_test_util.h"
#include "kimirt/tools/plan.h"

namespace kimirt {
namespace {

using testing::FixtureDir;
using testing::Goldens;
using testing::RankOutput;
using testing::RunRank;

// `fn` on every rank of `fixture` at TP `tp` with expert parallelism `ep` (1 or tp).
std::vector<std::string> OnRanks(const std::string& fixture, int tp, int ep,
                                 const std::function<void(Model&, Communicator&)>& fn) {
  LoadOptions lo;
  lo.ep = ep;
  return testing::OnThreadRanks(fixture, tp, lo, fn);
}

class ExpertParallelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FIXTURE(GetParam());
    ids_ = Goldens(FixtureDir(GetParam()) + "/goldens.safetensors").Ids("prompt3.ids");
  }
  std::vector<RankOutput> Run(int tp, int ep) {
    std::vector<RankOutput> out(static_cast<size_t>(tp));
    const std::vector<std::string> errors = OnRanks(GetParam(), tp, ep, [&](Model& m, Communicator& comm) {
      out[static_cast<size_t>(comm.rank())] = RunRank(m, ids_);
    });
    for (int r = 0; r < tp; ++r) {
      if (!errors[static_cast<size_t>(r)].empty()) out[static_cast<size_t>(r)].error = errors[static_cast<size_t>(r)];
    }
    return out;
  }
  std::vector<int32_t> ids_;
};

TEST_P(ExpertParallelTest, LogitsAndGreedyTokensEqualOneRank) {
  const std::vector<RankOutput> one = Run(1, 1);
  ASSERT_TRUE(one[0].error.empty()) << one[0].error;
  // Twice TensorParallelEqualsOneRank's 1e-5: that test's own margin on tiny-a at TP 2 is 15%
  // (3.31e-5 of 3.91e-5), and EP moves the rounding elsewhere (3.907e-5 measured there: the
  // routed sum is TP 1's bits exactly at top-2, EachRankAddsExactlyItsOwnSlots, the rest is plain
  // TP). A lost or doubled expert moves logits by O(0.1).
  const float tol = 2e-5f * std::max(1.0f, testing::MaxAbs(one[0].logits));
  for (int tp : {2, 4}) {
    SCOPED_TRACE("TP" + std::to_string(tp) + " EP" + std::to_string(tp));
    const std::vector<RankOutput> ep = Run(tp, tp);
    for (int r = 0; r < tp; ++r) {
      const RankOutput& got = ep[static_cast<size_t>(r)];
      ASSERT_TRUE(got.error.empty()) << "rank " << r << ": " << got.error;
      EXPECT_LE(testing::MaxAbsDiff(got.logits, one[0].logits), tol) << "rank " << r;
      EXPECT_EQ(got.greedy, one[0].greedy) << "rank " << r;
      // The all-reduce sums in rank order on every rank: the ranks agree bit for bit.
      EXPECT_EQ(0, std::memcmp(got.logits.raw(), ep[0].logits.raw(), got.logits.nbytes())) << "rank " << r;
    }
  }
}

// The routed-expert tensors (gate, up, down) a layer's rank holds as its own, i.e. not views of
// the stand-in buffers; their bytes.
bool IsStandIn(const ModelWeights& w, const Tensor& t) {
  for (const Tensor& b : w.expert_stand_ins) {
    const auto* base = static_cast<const uint8_t*>(b.raw());
    const auto* p = static_cast<const uint8_t*>(t.raw());
    if (p >= base && p + t.nbytes() <= base + b.nbytes()) return true;
  }
  return false;
}
uint64_t OwnExpertBytes(const ModelWeights& w) {
  uint64_t n = 0;
  for (const LayerWeights& l : w.layers) {
    for (const auto* list : {&l.moe.experts.gate, &l.moe.experts.up, &l.moe.experts.down}) {
      for (const Tensor& t : *list) n += IsStandIn(w, t) ? 0 : t.nbytes();
    }
  }
  return n;
}
bool AllZero(const Tensor& t) {
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (t.f32()[i] != 0.0f) return false;
  }
  return true;
}

// The plan's routed-expert bytes per GPU for TP `tp`, EP `ep` (`kimirt plan -tp N -ep N`).
uint64_t PlannedExpertBytes(const Layout& layout, int tp, int ep) {
  PlanOptions po;
  po.par.tp = tp;
  po.par.ep = ep;
  po.suggest = false;
  auto plan = PlanFromLayout(layout, po, "--config");
  EXPECT_TRUE(plan.ok()) << plan.status().ToString();
  return plan.ok() ? plan->heaviest().weight_bytes[static_cast<size_t>(Category::kRoutedExpert)] : 0;
}

TEST_P(ExpertParallelTest, EachRankHoldsExactlyItsExpertsWhole) {
  // The reference: TP 1 holds every expert whole.
  ModelWeights full;
  uint64_t full_expert_bytes = 0;
  std::unique_ptr<Backend> full_backend = MakeCpuBackend();  // owns `full`'s tensors
  {
    auto comm = MakeSingleRankCommunicator();
    auto m = Model::Load(FixtureDir(GetParam()), *full_backend, *comm);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    full = (*m)->weights();
    full_expert_bytes = OwnExpertBytes(full);
  }
  auto config = LoadModelConfig(FixtureDir(GetParam()) + "/config.json");
  ASSERT_TRUE(config.ok());
  auto layout = Layout::Build(*config);
  ASSERT_TRUE(layout.ok());
  const int64_t E = config->num_experts;
  ASSERT_GT(full_expert_bytes, 0u);
  for (int tp : {2, 4}) {
    SCOPED_TRACE("TP" + std::to_string(tp));
    // Plain TP of the same degree: everything but the routed experts must be held alike.
    std::vector<uint64_t> tp_held(static_cast<size_t>(tp)), tp_experts(static_cast<size_t>(tp));
    std::vector<std::string> errors = OnRanks(GetParam(), tp, 1, [&](Model& m, Communicator& comm) {
      tp_held[static_cast<size_t>(comm.rank())] = HeldBytes(m.weights());
      tp_experts[static_cast<size_t>(comm.rank())] = OwnExpertBytes(m.weights());
    });
    for (const std::string& e : errors) ASSERT_TRUE(e.empty()) << e;
    const uint64_t planned_ep = PlannedExpertBytes(*layout, tp, tp), planned_full = PlannedExpertBytes(*layout, 1, 1);
    ASSERT_GT(planned_ep, 0u);
    errors = OnRanks(GetParam(), tp, tp, [&](Model& m, Communicator& comm) {
      const int r = comm.rank();
      const ModelWeights& w = m.weights();
      const int64_t per = E / tp;  // rank r: experts [r·E/N, (r+1)·E/N)
      for (size_t i = 0; i < w.layers.size(); ++i) {
        if (!w.layers[i].is_moe) continue;
        const ExpertWeights& got = w.layers[i].moe.experts;
        const ExpertWeights& want = full.layers[i].moe.experts;
        ASSERT_EQ(got.gate.size(), static_cast<size_t>(E));
        for (int64_t e = 0; e < E; ++e) {
          const bool own = e >= r * per && e < (r + 1) * per;
          for (auto list : {&ExpertWeights::gate, &ExpertWeights::up, &ExpertWeights::down}) {
            const Tensor& g = (got.*list)[static_cast<size_t>(e)];
            const Tensor& f = (want.*list)[static_cast<size_t>(e)];
            ASSERT_EQ(g.shape(), f.shape()) << "rank " << r << " layer " << i << " expert " << e;
            EXPECT_EQ(IsStandIn(w, g), !own) << "rank " << r << " layer " << i << " expert " << e;
            if (own) {
              EXPECT_EQ(0, std::memcmp(g.raw(), f.raw(), f.nbytes())) << "rank " << r << " layer " << i << " expert " << e;
            } else {
              EXPECT_TRUE(AllZero(g)) << "rank " << r << " layer " << i << " expert " << e;
            }
          }
        }
      }
      // The routed experts held: the plan's -ep share of all of them (stored bytes there, F32
      // here: the same ratio). Everything else: what plain TP holds. Plus the stand-ins, one
      // expert's worth (and a few alignment rows), whatever the layer count.
      const uint64_t own_bytes = OwnExpertBytes(w);
      EXPECT_EQ(own_bytes * planned_full, full_expert_bytes * planned_ep) << "rank " << r;
      uint64_t stand_in_bytes = 0;
      for (const Tensor& b : w.expert_stand_ins) stand_in_bytes += b.nbytes();
      const uint64_t one_expert = full_expert_bytes / static_cast<uint64_t>(E * config->NumMoeLayers());
      EXPECT_GE(stand_in_bytes, one_expert);
      EXPECT_LT(stand_in_bytes, 2 * one_expert);
      EXPECT_EQ(HeldBytes(w), tp_held[static_cast<size_t>(r)] - tp_experts[static_cast<size_t>(r)] + own_bytes +
                                  stand_in_bytes)
          << "rank " << r;
    });
    for (const std::string& e : errors) ASSERT_TRUE(e.empty()) << e;
  }
}

// The mechanism under the logits, at the MoE op (spec §7.2 steps 3-4), on each backend built
// ("cuda": F32 matrices, MXFP4 experts as stored; "cuda-bf16": BF16 matrices, the tensor-core
// decode and prefill kernels): rank r's weights loaded as EP rank r of N, and the fixture's
// first MoE layer. Backend::MoeExperts over the rank's experts (stand-ins for the others) gives
// bit for bit what the whole experts give with the routing weights of the other ranks' slots set
// to zero, i.e. exactly the rank's own (token, slot) contributions; the ranks' rank-ordered sum
// is the one-rank output, bit for bit at top-2 (each token's two terms are added once either
// way) and within rounding at top-4 (partial sums regroup). 9 rows (a decode step) and 80 (a
// prefill chunk past the decode kernels' 64).
class ExpertStandInTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    const std::string& fixture = std::get<0>(GetParam());
    KIMIRT_REQUIRE_FIXTURE(fixture);
    const std::string& device = std::get<1>(GetParam());
    auto be = MakeBackend(device == "cuda-bf16" ? "cuda" : device);
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    backend_ = std::move(be).value();
    if (device == "cuda-bf16") options_.matrix_dtype = DType::kBF16;
    backend_->set_bf16_prefill(options_.matrix_dtype == DType::kBF16);  // as Model::Load sets it
    auto config = LoadModelConfig(FixtureDir(fixture) + "/config.json");
    ASSERT_TRUE(config.ok()) << config.status().ToString();
    auto layout = Layout::Build(*config);
    ASSERT_TRUE(layout.ok()) << layout.status().ToString();
    layout_ = std::make_unique<Layout>(std::move(layout).value());
    auto ckpt = Checkpoint::Open(FixtureDir(fixture));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    ckpt_ = std::move(ckpt).value();
  }
  // Rank `rank` of `ep` EP ranks (ep 1: the whole model).
  ModelWeights Load(int ep, int rank) {
    LoadOptions lo = options_;
    lo.ep = ep;
    auto w = LoadModelWeights(*layout_, *CheckpointWeightSource(*ckpt_), ep, rank, *backend_, lo);
    EXPECT_TRUE(w.ok()) << w.status().ToString();
    return w.ok() ? std::move(w).value() : ModelWeights{};
  }
  std::unique_ptr<Backend> backend_;
  LoadOptions options_;
  std::unique_ptr<Layout> layout_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_P(ExpertStandInTest, EachRankAddsExactlyItsOwnSlots) {
  const ModelConfig& c = layout_->config();
  const ModelWeights full = Load(1, 0);
  ASSERT_FALSE(full.layers.empty());
  size_t layer = 0;
  while (!full.layers[layer].is_moe) ++layer;
  const ExpertWeights& all = full.layers[layer].moe.experts;
  const int64_t E = c.num_experts;
  const int64_t De = c.ExpertHiddenSize();
  const GluParams glu = FfnActivation(c);
  Backend& be = *backend_;
  // MoeExperts on the device; the output on the host.
  auto run = [&](const Tensor& z, const Tensor& idx, const Tensor& w, const ExpertWeights& ex) {
    Tensor out = be.Empty({z.dim(0), De});
    be.MoeExperts(be.Upload(z), be.Upload(idx), be.Upload(w), ex, glu, &out);
    return be.Download(out);
  };
  SplitMix64 rng(15);
  for (int64_t T : {9, 80}) {
    for (int64_t k : {2, 4}) {
      // Distinct experts per token, positive weights, random latents.
      Tensor z = Tensor::Host({T, De}), idx = Tensor::Host({T, k}, DType::kI32), w = Tensor::Host({T, k});
      for (int64_t i = 0; i < z.numel(); ++i) z.f32()[i] = static_cast<float>(rng.Normal());
      for (int64_t t = 0; t < T; ++t) {
        int32_t* row = idx.i32() + t * k;
        for (int64_t j = 0; j < k; ++j) {
          do {
            row[j] = static_cast<int32_t>(rng.Next() % static_cast<uint64_t>(E));
          } while (std::find(row, row + j, row[j]) != row + j);
          w.f32()[t * k + j] = static_cast<float>(0.1 + rng.Uniform());
        }
      }
      const Tensor want = run(z, idx, w, all);
      ASSERT_GT(testing::MaxAbs(want), 0.0f);
      for (int ep : {2, 4}) {
        SCOPED_TRACE(std::to_string(T) + " rows, top-" + std::to_string(k) + ", EP" + std::to_string(ep));
        Tensor sum = Tensor::Host({T, De});  // ((x0 + x1) + x2) + ..., the all-reduce's order
        for (int r = 0; r < ep; ++r) {
          const ModelWeights mine = Load(ep, r);
          ASSERT_EQ(mine.layers.size(), full.layers.size());
          const Tensor got = run(z, idx, w, mine.layers[layer].moe.experts);
          Tensor masked = Tensor::Host({T, k});
          for (int64_t s = 0; s < T * k; ++s) {
            const bool own = idx.i32()[s] / (E / ep) == r;  // rank r: experts [r·E/N, (r+1)·E/N)
            masked.f32()[s] = own ? w.f32()[s] : 0.0f;
          }
          const Tensor ref = run(z, idx, masked, all);
          EXPECT_EQ(0, std::memcmp(got.raw(), ref.raw(), ref.nbytes())) << "rank " << r;
          for (int64_t i = 0; i < sum.numel(); ++i) sum.f32()[i] = r == 0 ? got.f32()[i] : sum.f32()[i] + got.f32()[i];
        }
        if (k == 2) {
          EXPECT_EQ(0, std::memcmp(sum.raw(), want.raw(), want.nbytes()));
        } else {
          EXPECT_LE(testing::MaxAbsDiff(sum, want), 1e-6f * std::max(1.0f, testing::MaxAbs(want)));
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ExpertStandInTest,
                         ::testing::Combine(::testing::Values("tiny-a", "kimi-linear-tiny"),
                                            ::testing::ValuesIn(testing::BuiltDevices({"cuda", "cuda-bf16"}))),
                         testing::FixtureDeviceName);

INSTANTIATE_TEST_SUITE_P(Fixtures, ExpertParallelTest, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(ExpertParallel, ADegreeThatDoesNotDivideTheExpertsIsRefused) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  const std::vector<std::string> errors = OnRanks("tiny-a", 3, 3, [](Model&, Communicator&) {
    ADD_FAILURE() << "tiny-a's 8 experts loaded over 3 EP ranks";
  });
  for (const std::string& e : errors) {
    EXPECT_NE(e.find("the 8 routed experts do not split evenly"), std::string::npos) << e;
    EXPECT_NE(e.find("over 3 ranks"), std::string::npos) << e;
  }
}

TEST(ExpertParallel, AModelWithoutRoutedExpertsIsRefused) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  std::ifstream in(FixtureDir("tiny-a") + "/config.json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  // Every layer dense: first_k_dense_replace = num_hidden_layers (6).
  const std::string from = "\"first_k_dense_replace\": 1,";
  ASSERT_NE(text.find(from), std::string::npos);
  text.replace(text.find(from), from.size(), "\"first_k_dense_replace\": 6,");
  auto config = ParseModelConfig(text, "dense tiny-a");
  ASSERT_TRUE(config.ok()) << config.status().ToString();
  ASSERT_EQ(config->NumMoeLayers(), 0);
  auto layout = Layout::Build(*config);
  ASSERT_TRUE(layout.ok()) << layout.status().ToString();
  Parallelism par;
  par.tp = par.ep = 2;
  const Status s = layout->CheckParallelism(par);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("expert parallelism over 2 ranks needs routed experts"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("6 layers are all dense"), std::string::npos) << s.message();
  par.ep = 1;  // plain TP of the same model is fine
  EXPECT_TRUE(layout->CheckParallelism(par).ok());
}

}  // namespace
}  // namespace kimirt
