// Counter-based random weights (random_weights.h): each element is a pure function of (seed, name,
// index) — the same bits whichever piece of the tensor is asked for, on any thread count — equal
// to the sequential SplitMix64 stream make-checkpoint --random has always written (drawn here in
// order, as that writer drew it), different per seed and per name, and with the scales the
// recipe promises (linear weights 1/sqrt(fan_in), MXFP4 experts decoded likewise).
#include "kimirt/model/random_weights.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

class RandomWeightsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string config = testing::FixtureDir("tiny-a") + "/config.json";  // K3, MXFP4 experts
    KIMIRT_REQUIRE_FILE(config);
    auto c = LoadModelConfig(config);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    auto l = Layout::Build(*c);
    ASSERT_TRUE(l.ok()) << l.status().ToString();
    layout_.emplace(std::move(l).value());
  }
  const TensorSpec& Spec(const std::string& suffix) const {
    for (const TensorSpec& t : layout_->tensors()) {
      if (t.name.size() >= suffix.size() && t.name.compare(t.name.size() - suffix.size(), suffix.size(), suffix) == 0) {
        return t;
      }
    }
    ADD_FAILURE() << "no tensor ends in " << suffix;
    return layout_->tensors().front();
  }
  std::vector<uint8_t> Whole(const TensorSpec& t, uint64_t seed) const {
    std::vector<uint8_t> b(t.nbytes());
    RandomTensorSlice(layout_->config(), t, seed, -1, 0, 0, b.data());
    return b;
  }
  std::optional<Layout> layout_;
};

const std::string kQ = "layers.1.self_attn.q_proj.weight";  // KDA, BF16 [64, 64]
const std::string kCodes = "layers.1.block_sparse_moe.experts.3.w2.weight_packed";
const std::string kScales = "layers.1.block_sparse_moe.experts.3.w2.weight_scale";

TEST_F(RandomWeightsTest, EqualsTheSequentialStreamMakeCheckpointWrote) {
  // A linear weight: value i = BF16(FastNormal(i-th draw) / sqrt(fan_in)), drawn in order.
  const TensorSpec& q = Spec(kQ);
  ASSERT_EQ(q.dtype, DType::kBF16);
  const std::vector<uint8_t> got = Whole(q, 9);
  SplitMix64 rng(9 ^ HashName(q.name));
  const float sd = static_cast<float>(1.0 / std::sqrt(static_cast<double>(q.shape[1])));
  for (size_t i = 0; i < got.size() / 2; ++i) {
    const uint16_t want = F32ToBf16(0.0f + sd * rng.FastNormal());
    uint16_t bits;
    std::memcpy(&bits, got.data() + 2 * i, 2);
    ASSERT_EQ(bits, want) << "element " << i;
  }
  // MXFP4 codes: 8 bytes per draw, little-endian.
  const TensorSpec& codes = Spec(kCodes);
  const std::vector<uint8_t> c = Whole(codes, 9);
  SplitMix64 crng(9 ^ HashName(codes.name));
  for (size_t i = 0; i < c.size(); i += 8) {
    const uint64_t r = crng.Next();
    for (size_t b = 0; b < 8 && i + b < c.size(); ++b) ASSERT_EQ(c[i + b], static_cast<uint8_t>(r >> (8 * b))) << i + b;
  }
}

TEST_F(RandomWeightsTest, AnyPieceIsTheSameBitsAsTheWholeTensor) {
  for (const std::string& name : {kQ, kCodes, kScales, std::string("layers.1.self_attn.A_log")}) {
    SCOPED_TRACE(name);
    const TensorSpec& t = Spec(name);
    const std::vector<uint8_t> whole = Whole(t, 4);
    const size_t es = DTypeSize(t.dtype);
    const uint64_t n = static_cast<uint64_t>(NumElements(t.shape));
    // Pieces at odd offsets and lengths (MXFP4 code words split anywhere).
    for (uint64_t first : {uint64_t{0}, uint64_t{1}, uint64_t{7}, uint64_t{13}, n / 2 + 3}) {
      for (uint64_t count : {uint64_t{1}, uint64_t{5}, uint64_t{8}, uint64_t{27}}) {
        if (first + count > n) continue;
        std::vector<uint8_t> piece(count * es, 0xAB);
        RandomTensorElements(layout_->config(), t, 4, first, count, piece.data());
        ASSERT_EQ(std::memcmp(piece.data(), whole.data() + first * es, piece.size()), 0) << first << "+" << count;
      }
    }
  }
}

TEST_F(RandomWeightsTest, DeterministicAndDifferentPerSeedAndPerName) {
  const TensorSpec& q = Spec(kQ);
  const TensorSpec& k = Spec("layers.1.self_attn.k_proj.weight");
  ASSERT_EQ(q.shape, k.shape);
  EXPECT_EQ(Whole(q, 1), Whole(q, 1));
  EXPECT_NE(Whole(q, 1), Whole(q, 2));
  EXPECT_NE(Whole(q, 1), Whole(k, 1));
  // Not merely different somewhere: fewer than 1% of elements agree by chance.
  const std::vector<uint8_t> a = Whole(q, 1), b = Whole(q, 2);
  size_t same = 0;
  for (size_t i = 0; i < a.size(); i += 2) same += std::memcmp(&a[i], &b[i], 2) == 0;
  EXPECT_LT(same, a.size() / 2 / 100);
  const TensorSpec& codes = Spec(kCodes);
  EXPECT_NE(Whole(codes, 1), Whole(codes, 2));
}

TEST_F(RandomWeightsTest, ScalesAreTheRecipes) {
  // BF16 linear weight: standard deviation 1/sqrt(fan_in), mean 0.
  const TensorSpec& q = Spec(kQ);
  const std::vector<uint8_t> qb = Whole(q, 3);
  double s = 0, s2 = 0;
  const size_t n = qb.size() / 2;
  for (size_t i = 0; i < n; ++i) {
    uint16_t h;
    std::memcpy(&h, &qb[2 * i], 2);
    const double v = Bf16ToF32(h);
    s += v;
    s2 += v * v;
  }
  const double want = 1.0 / std::sqrt(static_cast<double>(q.shape[1]));
  EXPECT_NEAR(std::sqrt(s2 / static_cast<double>(n)), want, 0.05 * want);
  EXPECT_NEAR(s / static_cast<double>(n), 0.0, 0.05 * want);
  // Norm gains 1 + 0.1·N.
  const std::vector<uint8_t> norm = Whole(Spec("layers.1.input_layernorm.weight"), 3);
  for (size_t i = 0; i < norm.size(); i += 2) {
    uint16_t h;
    std::memcpy(&h, &norm[i], 2);
    EXPECT_NEAR(Bf16ToF32(h), 1.0f, 0.35f);
  }
  // An MXFP4 expert decodes to deviation 1/sqrt(fan_in) too (fan_in = the logical input width).
  const TensorSpec& codes = Spec(kCodes);
  const std::vector<uint8_t> c = Whole(codes, 3), sc = Whole(Spec(kScales), 3);
  const int64_t rows = codes.shape[0], cols = codes.shape[1] * 2;
  std::vector<float> row(static_cast<size_t>(cols));
  double m2 = 0;
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeMxfp4Row(c.data() + r * cols / 2, sc.data() + r * cols / 32, cols, row.data());
    for (float v : row) {
      ASSERT_TRUE(std::isfinite(v));
      m2 += static_cast<double>(v) * v;
    }
  }
  const double want_e = 1.0 / std::sqrt(static_cast<double>(cols));
  EXPECT_NEAR(std::sqrt(m2 / static_cast<double>(rows * cols)), want_e, 0.25 * want_e);
}

}  // namespace
}  // namespace kimirt
