#include "kimirt/core/dtype_convert.h"

#include <algorithm>
#include <bit>
#include <cmath>

#include "kimirt/core/check.h"

namespace kimirt {
namespace {

constexpr uint32_t kF32AbsMask = 0x7FFFFFFFu;
constexpr uint32_t kF32Inf = 0x7F800000u;
constexpr uint32_t kF32QuietNan = 0x7FC00000u;

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// A float split for encoding into a narrower binary format whose sign is bit `sign_bit` of the
// code: the sign already moved to that bit, and the magnitude's bits (sign clear).
struct SignMagnitude {
  uint32_t sign;
  uint32_t abs_bits;
};
SignMagnitude SplitSign(float value, int sign_bit) {
  const uint32_t b = Bits(value);
  return {(b >> (31 - sign_bit)) & (1u << sign_bit), b & kF32AbsMask};
}

// v >> shift, rounded to nearest, ties to even. 1 <= shift <= 31.
uint32_t ShiftRightRne(uint32_t v, int shift) {
  const uint32_t q = v >> shift;
  const uint32_t rem = v & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return q + ((rem > half || (rem == half && (q & 1))) ? 1 : 0);
}

// Rounds a finite, non-negative float (its bits, sign clear) RNE to a binary format with `mbits`
// fraction bits, exponent bias `bias` and subnormals. Returns (exponent field << mbits) | fraction.
// Only the low end of the range is handled here: a result past the format's largest finite code is
// returned as is, and each caller decides between inf and saturation.
uint32_t RoundMagnitude(uint32_t abs_bits, int mbits, int bias) {
  const int float_exp_field = static_cast<int>(abs_bits >> 23);
  // Float zeros and subnormals (< 2^-126) are far below half the smallest subnormal of every
  // format that uses this (F16: 2^-25), so they round to zero.
  if (float_exp_field == 0) return 0;
  const int exp = float_exp_field - 127;
  const int min_exp = 1 - bias;  // exponent of the smallest normal
  if (exp >= min_exp) {
    // Re-bias the exponent in place and drop fraction bits. A carry out of the fraction
    // (1.111.. -> 10.000..) correctly bumps the exponent field. exp + bias <= 127 + 15 fits.
    const uint32_t full = (static_cast<uint32_t>(exp + bias) << 23) | (abs_bits & 0x7FFFFFu);
    return ShiftRightRne(full, 23 - mbits);
  }
  // Subnormal in the target: count units of the smallest subnormal, 2^(min_exp - mbits).
  // value = sig * 2^(exp - 23), so units = sig >> (23 + min_exp - mbits - exp).
  const uint32_t sig = (abs_bits & 0x7FFFFFu) | 0x800000u;
  const int shift = 23 + min_exp - mbits - exp;
  // sig < 2^24 is below half of 2^shift once shift >= 25: rounds to zero (and avoids UB shifts).
  if (shift >= 25) return 0;
  return ShiftRightRne(sig, shift);  // may give 1 << mbits: the smallest normal, correctly
}

constexpr float kE2M1Values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                   -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

}  // namespace

float Bf16ToF32(uint16_t bits) { return FromBits(static_cast<uint32_t>(bits) << 16); }

uint16_t F32ToBf16(float value) {
  const uint32_t b = Bits(value);
  // Adding 0x7FFF plus the lowest kept bit rounds to nearest even; a carry into the exponent is
  // right, and float max rounds to inf as IEEE requires. Branch-free so the bulk loop vectorizes.
  const uint32_t rounded = (b + 0x7FFFu + ((b >> 16) & 1u)) >> 16;
  const uint32_t nan = (b >> 16) | 0x0040u;  // quiet bit: payloads only in the low half stay NaN
  return static_cast<uint16_t>((b & kF32AbsMask) > kF32Inf ? nan : rounded);
}

float F16ToF32(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000u) << 16;
  const uint32_t e = (bits >> 10) & 0x1Fu;
  const uint32_t m = bits & 0x3FFu;
  if (e == 0) return FromBits(Bits(static_cast<float>(m) * 0x1p-24f) | sign);  // exact
  if (e == 31) return FromBits(sign | kF32Inf | (m << 13) | (m != 0 ? 0x400000u : 0u));
  return FromBits(sign | ((e + 112) << 23) | (m << 13));  // rebias 15 -> 127
}

uint16_t F32ToF16(float value) {
  const auto [sign, a] = SplitSign(value, 15);
  if (a > kF32Inf) return static_cast<uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a == kF32Inf) return static_cast<uint16_t>(sign | 0x7C00u);
  const uint32_t c = RoundMagnitude(a, 10, 15);
  return static_cast<uint16_t>(sign | std::min(c, 0x7C00u));  // past 65504 after rounding: inf
}

float Fp8E4M3ToF32(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t e = (bits >> 3) & 0xFu;
  const uint32_t m = bits & 0x7u;
  if ((bits & 0x7Fu) == 0x7Fu) return FromBits(sign | kF32QuietNan);
  if (e == 0) return FromBits(Bits(static_cast<float>(m) * 0x1p-9f) | sign);
  return FromBits(sign | ((e + 120) << 23) | (m << 20));  // rebias 7 -> 127
}

uint8_t F32ToFp8E4M3(float value) {
  const auto [sign, a] = SplitSign(value, 7);
  if (a > kF32Inf) return static_cast<uint8_t>(sign | 0x7Fu);
  // Saturate (header: KV-cache outliers). Code 0x7F would be NaN, so 0x7E (448) is the ceiling
  // for everything that rounds past it, inf included.
  const uint32_t c = a == kF32Inf ? 0x7Eu : RoundMagnitude(a, 3, 7);
  return static_cast<uint8_t>(sign | std::min(c, 0x7Eu));
}

float Fp8E5M2ToF32(uint8_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x80u) << 24;
  const uint32_t e = (bits >> 2) & 0x1Fu;
  const uint32_t m = bits & 0x3u;
  if (e == 0) return FromBits(Bits(static_cast<float>(m) * 0x1p-16f) | sign);
  if (e == 31) return FromBits(sign | (m == 0 ? kF32Inf : kF32QuietNan | (m << 21)));
  return FromBits(sign | ((e + 112) << 23) | (m << 21));  // rebias 15 -> 127
}

uint8_t F32ToFp8E5M2(float value) {
  const auto [sign, a] = SplitSign(value, 7);
  if (a > kF32Inf) return static_cast<uint8_t>(sign | 0x7Eu);
  if (a == kF32Inf) return static_cast<uint8_t>(sign | 0x7Cu);
  const uint32_t c = RoundMagnitude(a, 2, 15);
  return static_cast<uint8_t>(sign | std::min(c, 0x7Cu));  // past 57344 after rounding: inf
}

float E2M1ToF32(uint8_t nibble) { return kE2M1Values[nibble & 0xFu]; }

uint8_t F32ToE2M1(float value) {
  const auto [sign, a] = SplitSign(value, 3);
  // E2M1 is a 2-exponent-bit, 1-fraction-bit float with bias 1: codes 1..7 are 0.5 (subnormal),
  // 1, 1.5, 2, 3, 4, 6, so generic RNE gives the even-code ties. Inf and NaN saturate (header).
  const uint32_t c = a >= kF32Inf ? 7u : RoundMagnitude(a, 1, 1);
  return static_cast<uint8_t>(sign | std::min(c, 7u));
}

float E8M0ToF32(uint8_t code) {
  if (code == 255) return FromBits(kF32QuietNan);
  if (code == 0) return FromBits(0x00400000u);  // 2^-127: the float subnormal 0.5 * 2^-126
  return FromBits(static_cast<uint32_t>(code) << 23);
}

void Bf16ToF32(const uint16_t* src, float* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = Bf16ToF32(src[i]);
}

void F32ToBf16(const float* src, uint16_t* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) dst[i] = F32ToBf16(src[i]);
}

void DequantizeMxfp4Row(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out) {
  KIMIRT_CHECK(n >= 0 && n % kMxfp4GroupSize == 0);
  for (int64_t g = 0; g < n / kMxfp4GroupSize; ++g) {
    // A float product is correctly rounded, so it is exact whenever the exact value is a float:
    // an E2M1 value (<= 2 significant bits) times 2^(s-127) always is, down to 0.5 * 2^-127, or it
    // is past float max and becomes inf. A NaN scale gives NaN for every code, 0 * NaN included.
    const float scale = E8M0ToF32(scales[g]);
    float lut[16];
    for (int c = 0; c < 16; ++c) lut[c] = kE2M1Values[c] * scale;
    const uint8_t* p = packed + g * (kMxfp4GroupSize / 2);
    float* o = out + g * kMxfp4GroupSize;
    for (int j = 0; j < kMxfp4GroupSize / 2; ++j) {
      o[2 * j] = lut[p[j] & 0xFu];
      o[2 * j + 1] = lut[p[j] >> 4];
    }
  }
}

void QuantizeMxfp4Row(const float* in, int64_t n, uint8_t* packed, uint8_t* scales) {
  KIMIRT_CHECK(n >= 0 && n % kMxfp4GroupSize == 0);
  for (int64_t g = 0; g < n / kMxfp4GroupSize; ++g) {
    const float* x = in + g * kMxfp4GroupSize;
    uint8_t* p = packed + g * (kMxfp4GroupSize / 2);
    float amax = 0.0f;
    bool finite = true;
    for (int i = 0; i < kMxfp4GroupSize; ++i) {
      if (!std::isfinite(x[i])) finite = false;
      else amax = std::max(amax, std::fabs(x[i]));
    }
    if (!finite) {
      scales[g] = 255;
      std::fill(p, p + kMxfp4GroupSize / 2, uint8_t{0});
      continue;
    }
    int s = 127;
    // ilogb is floor(log2(amax)) exactly, float subnormals included.
    if (amax > 0.0f) s = std::clamp(std::ilogb(amax) - 2 + 127, 0, 254);
    scales[g] = static_cast<uint8_t>(s);
    for (int j = 0; j < kMxfp4GroupSize / 2; ++j) {
      // ldexp by a power of two is exact here: it cannot overflow (amax * 2^(127-s) < 8 for
      // every s chosen above, clamped or not), and it only loses bits of values that land in the
      // float subnormals (< 2^-126), far below E2M1's 0.25 rounding threshold: 0 either way.
      const uint8_t lo = F32ToE2M1(std::ldexp(x[2 * j], 127 - s));
      const uint8_t hi = F32ToE2M1(std::ldexp(x[2 * j + 1], 127 - s));
      p[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

}  // namespace kimirt
