// Weight sources (weight_source.h) hand the loader exactly a rank's slice: for every tensor of a
// K3 config with MXFP4 experts (tiny-a) and of a Kimi-Linear one, each TP 2 rank's slice (as
// SliceFor places it, experts as stored and widened; and under expert parallelism) from the
// random source is, bit for bit, that slice cut from the whole tensor — and the checkpoint
// source cuts the fixture's stored tensors the same way. Then, through the loader: the weights
// a TP 2 rank holds from the random source are the TP 1 weights' slices (the MXFP4 experts
// widened on the CPU, including a slice that cuts a scale group), and an EP rank holds its own
// experts whole and zeros for the others.
#include "kimirt/model/weight_source.h"

#include <gtest/gtest.h>

#include <cstring>
#include <optional>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/model/random_weights.h"
#include "kimirt/model/weight_binding.h"
#include "kimirt/model/weights.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

// The bytes of indices [begin, begin + length) along `dim` of a row-major tensor of `shape`.
std::vector<uint8_t> Cut(const uint8_t* whole, const Shape& shape, size_t es, int dim, int64_t begin, int64_t length) {
  if (dim < 0) return std::vector<uint8_t>(whole, whole + static_cast<size_t>(NumElements(shape)) * es);
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < dim; ++i) outer *= shape[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < shape.size(); ++i) inner *= shape[i];
  const int64_t n = shape[static_cast<size_t>(dim)];
  std::vector<uint8_t> out;
  for (int64_t o = 0; o < outer; ++o) {
    const uint8_t* p = whole + static_cast<size_t>((o * n + begin) * inner) * es;
    out.insert(out.end(), p, p + static_cast<size_t>(length * inner) * es);
  }
  return out;
}

std::vector<uint8_t> Bytes(const Tensor& t) {
  const uint8_t* p = static_cast<const uint8_t*>(t.raw());
  return std::vector<uint8_t>(p, p + t.nbytes());
}

class WeightSourceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FILE(testing::FixtureDir(GetParam()) + "/config.json");
    auto c = LoadModelConfig(testing::FixtureDir(GetParam()));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto l = Layout::Build(*c);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    layout_.emplace(std::move(l).value());
    auto ckpt = Checkpoint::Open(testing::FixtureDir(GetParam()));
    ASSERT_TRUE(ckpt.ok()) << ckpt.status().ToString();
    ckpt_ = std::move(ckpt).value();
  }
  std::optional<Layout> layout_;
  std::unique_ptr<Checkpoint> ckpt_;
};

TEST_P(WeightSourceTest, EachRanksSliceIsTheWholeTensorsCut) {
  const std::unique_ptr<WeightSource> random = RandomWeightSource(layout_->config(), 21);
  const std::unique_ptr<WeightSource> stored = CheckpointWeightSource(*ckpt_);
  ASSERT_TRUE(stored->Check(*layout_).ok());
  ASSERT_TRUE(random->Check(*layout_).ok());
  int sliced = 0, mxfp4_sliced = 0;
  for (const TensorSpec& t : layout_->tensors()) {
    SCOPED_TRACE(t.name);
    Result<Tensor> rw = random->Read(t, -1, 0, 0);
    Result<Tensor> sw = stored->Read(t, -1, 0, 0);
    ASSERT_TRUE(rw.ok() && sw.ok());
    ASSERT_EQ(rw->shape(), t.shape);
    ASSERT_EQ(rw->dtype(), t.dtype);
    std::vector<uint8_t> want(t.nbytes());
    RandomTensorSlice(layout_->config(), t, 21, -1, 0, 0, want.data());
    ASSERT_EQ(Bytes(*rw), want);
    // TP 2 (experts as stored, and widened: the CPU's slices) and EP 2.
    for (int variant = 0; variant < 3; ++variant) {
      Parallelism par;
      par.tp = 2;
      par.ep = variant == 2 ? 2 : 1;
      par.experts_dequantized = variant == 1;
      if (!layout_->CheckParallelism(par).ok()) continue;
      for (int rank = 0; rank < 2; ++rank) {
        const TensorSlice s = layout_->SliceFor(t, par, rank);
        if (!s.loaded) continue;
        Result<Tensor> rp = random->Read(t, s.dim, s.begin, s.length);
        Result<Tensor> sp = stored->Read(t, s.dim, s.begin, s.length);
        ASSERT_TRUE(rp.ok() && sp.ok()) << rp.status().ToString() << sp.status().ToString();
        const size_t es = DTypeSize(t.dtype);
        EXPECT_EQ(Bytes(*rp), Cut(want.data(), t.shape, es, s.dim, s.begin, s.length)) << "variant " << variant << " rank " << rank;
        EXPECT_EQ(Bytes(*sp), Cut(static_cast<const uint8_t*>(sw->raw()), t.shape, DTypeSize(sw->dtype()), s.dim,
                                  s.begin, s.length))
            << "variant " << variant << " rank " << rank;
        if (s.dim >= 0 && s.length < t.shape[static_cast<size_t>(s.dim)]) {
          ++sliced;
          mxfp4_sliced += IsMxfp4Codes(t.role) || IsMxfp4Scales(t.role);
        }
      }
    }
  }
  EXPECT_GT(sliced, 50);  // the test saw real slices, not only whole tensors
  if (layout_->config().quantization.routed_experts_mxfp4) EXPECT_GT(mxfp4_sliced, 0);
}

// One rank's ModelWeights from the random source on the CPU.
ModelWeights LoadRank(const Layout& layout, const WeightSource& src, Backend& be, int tp, int ep, int rank) {
  LoadOptions lo;
  lo.ep = ep;
  Result<ModelWeights> w = LoadModelWeights(layout, src, tp, rank, be, lo);
  EXPECT_TRUE(w.ok()) << w.status().ToString();
  return w.ok() ? std::move(w).value() : ModelWeights{};
}

// `part` is [begin, begin + length) along `dim` of `full` (F32), padding after it zero.
void ExpectSlice(const Tensor& part, const Tensor& full, int dim, int64_t begin, int64_t length, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(part.rank(), full.rank());
  const std::vector<uint8_t> want = Cut(static_cast<const uint8_t*>(full.raw()), full.shape(), 4, dim, begin, length);
  for (int i = 0; i < part.rank(); ++i) {
    if (i != dim) ASSERT_EQ(part.dim(i), full.dim(i));
  }
  const uint8_t* p = static_cast<const uint8_t*>(part.raw());
  EXPECT_EQ(Cut(p, part.shape(), 4, dim, 0, length), want);
  const int64_t pad = part.dim(dim) - length;
  ASSERT_GE(pad, 0);
  EXPECT_EQ(Cut(p, part.shape(), 4, dim, length, pad), std::vector<uint8_t>(Cut(p, part.shape(), 4, dim, length, pad).size(), 0));
}

TEST_P(WeightSourceTest, TensorParallelRanksHoldTheirSlicesOfTheFullWeights) {
  const std::unique_ptr<WeightSource> random = RandomWeightSource(layout_->config(), 5);
  auto be = MakeBackend("cpu");
  ASSERT_TRUE(be.ok());
  const ModelWeights full = LoadRank(*layout_, *random, **be, 1, 1, 0);
  const ModelConfig& c = layout_->config();
  size_t kda = 0, moe = 0;
  while (!full.layers[kda].is_kda) ++kda;
  while (!full.layers[moe].is_moe) ++moe;
  for (int rank = 0; rank < 2; ++rank) {
    const ModelWeights w = LoadRank(*layout_, *random, **be, 2, 1, rank);
    ASSERT_EQ(w.layers.size(), full.layers.size());
    const int64_t P = c.KdaProjDim() / 2, I = c.moe_intermediate_size / 2, V = (c.vocab_size + 1) / 2;
    ExpectSlice(w.layers[kda].kda.q, full.layers[kda].kda.q, 0, rank * P, P, "KDA q (column)");
    ExpectSlice(w.layers[kda].kda.o, full.layers[kda].kda.o, 1, rank * P, P, "KDA o (row)");
    const int64_t H = c.linear_attn.num_heads / 2;
    ExpectSlice(w.layers[kda].kda.a_log, full.layers[kda].kda.a_log, 0, rank * H, H, "A_log (head vector)");
    ExpectSlice(w.embed, full.embed, 0, rank * V, std::min(V, c.vocab_size - rank * V), "embedding (vocab)");
    for (int64_t e : {int64_t{0}, c.num_experts - 1}) {
      const ExpertWeights& fx = full.layers[moe].moe.experts;
      const ExpertWeights& wx = w.layers[moe].moe.experts;
      const size_t k = static_cast<size_t>(e);
      ExpectSlice(wx.gate[k], fx.gate[k], 0, rank * I, I, "expert gate (rows)");
      ExpectSlice(wx.up[k], fx.up[k], 0, rank * I, I, "expert up (rows)");
      // w2 along its input: with MXFP4 a half of 16 cuts tiny-a's 32-wide scale groups.
      ExpectSlice(wx.down[k], fx.down[k], 1, rank * I, I, "expert down (columns)");
    }
  }
  // Expert parallelism: own experts whole, the others zero stand-ins.
  for (int rank = 0; rank < 2; ++rank) {
    const ModelWeights w = LoadRank(*layout_, *random, **be, 2, 2, rank);
    const ExpertWeights& fx = full.layers[moe].moe.experts;
    const ExpertWeights& wx = w.layers[moe].moe.experts;
    const int64_t per = c.num_experts / 2;
    for (int64_t e = 0; e < c.num_experts; ++e) {
      const size_t k = static_cast<size_t>(e);
      const bool own = e / per == rank;
      for (const auto& [got, want] : {std::pair{&wx.gate[k], &fx.gate[k]}, {&wx.down[k], &fx.down[k]}}) {
        ASSERT_EQ(got->shape(), want->shape());
        if (own) {
          EXPECT_EQ(Bytes(*got), Bytes(*want)) << "EP rank " << rank << " expert " << e;
        } else {
          EXPECT_EQ(Bytes(*got), std::vector<uint8_t>(got->nbytes(), 0)) << "EP rank " << rank << " expert " << e;
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, WeightSourceTest, ::testing::Values("tiny-a", "kimi-linear-tiny"),
                         [](const auto& info) { return std::string(info.param == "tiny-a" ? "TinyA" : "KimiLinearTiny"); });

}  // namespace
}  // namespace kimirt
