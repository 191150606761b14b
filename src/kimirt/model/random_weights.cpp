// Counter-based random weights (random_weights.h): each tensor's recipe from its role, then
// element i from SplitMix64::At(seed ^ FNV-1a(name), i) alone.
#include "kimirt/model/random_weights.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/parallel_for.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

// How a tensor's elements are drawn.
struct Recipe {
  enum Kind : uint8_t { kNormal, kLogRates, kDtBias, kCodes, kScales } kind = kNormal;
  float mean = 0, stddev = 1;  // kNormal: mean + stddev · FastNormal
  int64_t heads = 0;           // kLogRates: log U(1, 16) below this index, 0 past it
  int low_exponent = 0;        // kScales: E8M0 code 127 + low, or + 1 with probability `upper`
  double upper = 0;
};

Recipe Normal(double stddev, double mean = 0.0) {
  Recipe r;
  r.mean = static_cast<float>(mean);
  r.stddev = static_cast<float>(stddev);
  return r;
}

Recipe RecipeOf(const ModelConfig& c, const TensorSpec& t) {
  using R = TensorRole;
  const TensorRole role = t.role;
  Recipe r;
  if (IsMxfp4Codes(role)) {
    // Random weights at MXFP4's own resolution, so multi-GB expert sets (K3: 30 G values a
    // layer) are made at memory speed: codes are random bytes (every E2M1 code equally likely,
    // mean square 68.5/8), and each group's scale is one of two neighbouring powers of two, the
    // upper with the probability that makes the decoded matrix's standard deviation
    // 1/sqrt(fan_in), like every other weight (spec §2.9 for the format).
    r.kind = Recipe::kCodes;
    return r;
  }
  if (IsMxfp4Scales(role)) {
    const double fan_in = static_cast<double>(t.shape[1] * kMxfp4GroupSize);
    const double code_ms = 68.5 / 8.0, want_ms = 1.0 / fan_in;
    r.kind = Recipe::kScales;
    r.low_exponent = static_cast<int>(std::floor(0.5 * std::log2(want_ms / code_ms)));
    r.upper = (want_ms / (code_ms * std::ldexp(1.0, 2 * r.low_exponent)) - 1.0) / 3.0;  // in [0, 1)
    return r;
  }
  const double fan_in = static_cast<double>(t.shape.size() >= 2 ? t.shape.back() : 1);
  if (role == R::kKdaALog) {
    // log(U(1, 16)) for the real heads; K3's zero padding after them (spec §2.4).
    r.kind = Recipe::kLogRates;
    r.heads = c.linear_attn.num_heads;
    return r;
  }
  if (role == R::kKdaDtBias) {
    // The softplus gate (Kimi-Linear, no lower bound): the Mamba-style init of FLA's KDA layer,
    // dt log-uniform in [1e-3, 1e-1] and dt_bias its inverse softplus, so softplus(f + dt_bias)
    // starts near dt. N(0, 0.1) gave softplus ≈ 0.7 and decays of up to −11 a token (α =
    // −exp(A_log)·softplus, spec §5.3) that no trained model has: they sent the chunked kernel to
    // its exact token-by-token fallback, 58% of an 8K prefill of the 2-layer 48B (ncu,
    // 2026-12-01). The bounded gate (K3: α ∈ (−5, 0) by construction) keeps N(0, 0.1), and so do
    // the built-in model's weights.
    if (c.linear_attn.gate_lower_bound.has_value()) return Normal(0.1);
    r.kind = Recipe::kDtBias;
    return r;
  }
  if (role == R::kKdaConvQ || role == R::kKdaConvK || role == R::kKdaConvV) return Normal(0.5);
  if (role == R::kRouterBias) return Normal(0.01);
  if (t.category == Category::kNorm) return Normal(0.1, 1.0);
  if (role == R::kEmbed) return Normal(1.0);
  if (role == R::kRouter) return Normal(2.5 / std::sqrt(fan_in));  // router: decisive top-k margins
  if (role == R::kKdaDecayB) return Normal(0.3 / std::sqrt(fan_in));
  if (role == R::kVisionPatchProj || role == R::kVisionPosEmb) return Normal(0.02);
  return Normal(1.0 / std::sqrt(fan_in));
}

// The hot loops (all but a few KB of a model) are built twice, for AVX-512 (x86-64-v4, where
// the 64-bit multiplies of the mix vectorize: about 2.5× faster) and for any x86-64, the better
// picked at run time. Both give the same bits: the integer steps are exact, and this file is
// compiled with -ffp-contract=off (model/CMakeLists.txt) so no build fuses m + sd·x into an FMA.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KIMIRT_HOT_LOOP __attribute__((target_clones("arch=x86-64-v4", "default")))
#else
#define KIMIRT_HOT_LOOP
#endif

// mean + stddev · FastNormal of outputs [first, first + count), as F32.
KIMIRT_HOT_LOOP void NormalF32(float mean, float stddev, uint64_t state, uint64_t first, size_t count, float* out) {
  const uint64_t base = state + (first + 1) * SplitMix64::kGamma;
  for (size_t k = 0; k < count; ++k) {
    out[k] = mean + stddev * SplitMix64::FastNormalOf(SplitMix64::Mix(base + k * SplitMix64::kGamma));
  }
}

// The same rounded to BF16 (nearest, ties to even: F32ToBf16 on the finite values these are).
KIMIRT_HOT_LOOP void NormalBf16(float mean, float stddev, uint64_t state, uint64_t first, size_t count,
                                uint16_t* out) {
  const uint64_t base = state + (first + 1) * SplitMix64::kGamma;
  for (size_t k = 0; k < count; ++k) {
    const float v = mean + stddev * SplitMix64::FastNormalOf(SplitMix64::Mix(base + k * SplitMix64::kGamma));
    uint32_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    out[k] = static_cast<uint16_t>((bits + 0x7FFFu + ((bits >> 16) & 1u)) >> 16);
  }
}

// MXFP4 codes, 8 bytes an output: output w's bytes (little-endian) are bytes 8w..8w+7.
KIMIRT_HOT_LOOP void CodeWords(uint64_t state, uint64_t first_word, size_t words, uint8_t* out) {
  for (size_t w = 0; w < words; ++w) {
    const uint64_t r = SplitMix64::At(state, first_word + w);
    for (int b = 0; b < 8; ++b) out[8 * w + static_cast<size_t>(b)] = static_cast<uint8_t>(r >> (8 * b));
  }
}

// MXFP4 scales: E8M0 code `low`, or low + 1 where output i's uniform falls below `upper`.
KIMIRT_HOT_LOOP void ScaleCodes(uint8_t low, double upper, uint64_t state, uint64_t first, size_t count,
                                uint8_t* out) {
  for (size_t k = 0; k < count; ++k) {
    out[k] = static_cast<uint8_t>(low + (SplitMix64::UniformOf(SplitMix64::At(state, first + k)) < upper ? 1 : 0));
  }
}

// Elements [first, end) made `fill(i, n, block)` an aligned block at a time and copied to the
// bytes at `out` (which need not be aligned for T).
template <typename T, typename Fill>
void InBlocks(uint64_t first, uint64_t end, uint8_t* out, Fill fill) {
  constexpr size_t kBlock = 4096 / sizeof(T);
  alignas(64) T block[kBlock];
  for (uint64_t i = first; i < end; i += kBlock) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kBlock, end - i));
    fill(i, n, block);
    std::memcpy(out, block, n * sizeof(T));
    out += n * sizeof(T);
  }
}

}  // namespace

void RandomTensorElements(const ModelConfig& config, const TensorSpec& t, uint64_t seed, uint64_t first,
                          uint64_t count, uint8_t* out) {
  const Recipe r = RecipeOf(config, t);
  const uint64_t state = seed ^ HashName(t.name);
  const uint64_t end = first + count;
  if (r.kind == Recipe::kCodes) {
    // Byte i is byte i % 8 (little-endian) of output i / 8.
    uint64_t i = first;
    auto byte = [&](uint64_t k) { return static_cast<uint8_t>(SplitMix64::At(state, k >> 3) >> (8 * (k & 7))); };
    for (; i < end && (i & 7) != 0; ++i) *out++ = byte(i);
    const uint64_t words = (end - i) / 8;
    CodeWords(state, i >> 3, static_cast<size_t>(words), out);
    out += 8 * words;
    for (i += 8 * words; i < end; ++i) *out++ = byte(i);
    return;
  }
  if (r.kind == Recipe::kScales) {
    ScaleCodes(static_cast<uint8_t>(127 + r.low_exponent), r.upper, state, first, static_cast<size_t>(count), out);
    return;
  }
  if (r.kind == Recipe::kLogRates || r.kind == Recipe::kDtBias) {
    // A few values a layer, one at a time: log(U(1, 16)) for the real heads and K3's zero padding
    // after them (spec §2.4); or dt_bias = dt + log(−expm1(−dt)), dt = 10^U(−3, −1).
    for (uint64_t i = first; i < end; ++i) {
      const double u = SplitMix64::UniformOf(SplitMix64::At(state, i));
      float v;
      if (r.kind == Recipe::kDtBias) {
        const double dt = std::max(1e-4, std::exp(std::log(1e-3) + u * (std::log(1e-1) - std::log(1e-3))));
        v = static_cast<float>(dt + std::log(-std::expm1(-dt)));
      } else {
        v = static_cast<int64_t>(i) < r.heads ? static_cast<float>(std::log(1.0 + 15.0 * u)) : 0.0f;
      }
      if (t.dtype == DType::kBF16) {
        const uint16_t b = F32ToBf16(v);
        std::memcpy(out, &b, sizeof(b));
      } else {
        std::memcpy(out, &v, sizeof(v));
      }
      out += DTypeSize(t.dtype);
    }
    return;
  }
  switch (t.dtype) {
    case DType::kF32:
      InBlocks<float>(first, end, out, [&](uint64_t i, size_t n, float* b) { NormalF32(r.mean, r.stddev, state, i, n, b); });
      return;
    case DType::kBF16:
      InBlocks<uint16_t>(first, end, out,
                         [&](uint64_t i, size_t n, uint16_t* b) { NormalBf16(r.mean, r.stddev, state, i, n, b); });
      return;
    default:
      // The layout stores floats only as BF16 or F32; anything else is left zero.
      std::memset(out, 0, static_cast<size_t>(count) * DTypeSize(t.dtype));
      return;
  }
}

void RandomTensorSlice(const ModelConfig& config, const TensorSpec& t, uint64_t seed, int dim, int64_t begin,
                       int64_t length, uint8_t* out) {
  // The slice is `outer` runs of `run` consecutive elements; run o starts at element
  // (o · size + begin) · inner of the full tensor.
  int64_t outer = 1, inner = 1, size = NumElements(t.shape);
  if (dim < 0) {
    begin = 0;
    length = size;
  } else {
    size = t.shape[static_cast<size_t>(dim)];
    for (int i = 0; i < dim; ++i) outer *= t.shape[static_cast<size_t>(i)];
    for (size_t i = static_cast<size_t>(dim) + 1; i < t.shape.size(); ++i) inner *= t.shape[i];
  }
  const uint64_t run = static_cast<uint64_t>(length * inner);
  const uint64_t total = static_cast<uint64_t>(outer) * run;
  const size_t es = DTypeSize(t.dtype);
  // Pieces of 64 K elements (a multiple of 8, so MXFP4 code words are not split between pieces of
  // one run): small enough to balance the pool, large enough that scheduling costs nothing.
  constexpr uint64_t kPiece = uint64_t{1} << 16;
  ParallelFor(static_cast<int64_t>((total + kPiece - 1) / kPiece), [&](int64_t piece) {
    uint64_t at = static_cast<uint64_t>(piece) * kPiece;
    const uint64_t stop = std::min(total, at + kPiece);
    while (at < stop) {
      const uint64_t o = at / run, j = at % run;
      const uint64_t n = std::min(run - j, stop - at);
      const uint64_t first = (o * static_cast<uint64_t>(size) + static_cast<uint64_t>(begin)) * static_cast<uint64_t>(inner) + j;
      RandomTensorElements(config, t, seed, first, n, out + at * es);
      at += n;
    }
  });
}

}  // namespace kimirt
