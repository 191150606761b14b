#include "kimirt/core/dtype_convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

namespace kimirt {
namespace {

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

// The references below share no code with dtype_convert.cpp: decoding is the textbook formula in
// double, encoding is a search for the nearest decoded value.

// Value of a finite code of a binary format with `ebits`/`mbits` and `bias`, sign included.
double RefDecode(uint32_t code, int ebits, int mbits, int bias) {
  const uint32_t m = code & ((1u << mbits) - 1);
  const uint32_t e = (code >> mbits) & ((1u << ebits) - 1);
  const bool neg = (code >> (ebits + mbits)) & 1;
  const double frac = static_cast<double>(m) / static_cast<double>(1u << mbits);
  const double mag = e == 0 ? std::ldexp(frac, 1 - bias)  // subnormal: 2^(1-bias) * m/2^mbits
                            : std::ldexp(1.0 + frac, static_cast<int>(e) - bias);
  return neg ? -mag : mag;
}

// Magnitudes of codes 0..count-1 (increasing with the code in all these formats). `overflow`,
// when > 0, is appended as one more code: the value the next code would have with an unbounded
// exponent. Rounding to it means "overflow" (inf) in the IEEE formats, as IEEE 754 specifies.
std::vector<double> RefMagnitudes(uint32_t count, int ebits, int mbits, int bias,
                                  double overflow) {
  std::vector<double> v;
  for (uint32_t c = 0; c < count; ++c) v.push_back(RefDecode(c, ebits, mbits, bias));
  if (overflow > 0) v.push_back(overflow);
  return v;
}

// The magnitude code nearest to ax >= 0, ties to the even code; beyond the last value, the last
// code (which gives saturation when the table ends at the largest finite value).
uint32_t RefNearest(const std::vector<double>& mags, double ax) {
  const size_t hi = std::upper_bound(mags.begin(), mags.end(), ax) - mags.begin();
  if (hi == mags.size()) return static_cast<uint32_t>(hi - 1);
  const size_t lo = hi - 1;  // mags[0] == 0 <= ax
  // Both differences are exact in double: the operands are floats within a binade or two.
  const double dlo = ax - mags[lo];
  const double dhi = mags[hi] - ax;
  if (dlo < dhi) return static_cast<uint32_t>(lo);
  if (dhi < dlo) return static_cast<uint32_t>(hi);
  return static_cast<uint32_t>(lo % 2 == 0 ? lo : hi);
}

// Edge inputs (every code value, every midpoint between neighbours and the floats on either side
// of it, both signs) plus `n_random` random floats: a quarter uniform over all non-NaN bit
// patterns, the rest with a float exponent uniform in [lo_exp, hi_exp] and a random fraction.
std::vector<float> TestInputs(const std::vector<double>& mags, int n_random, int lo_exp,
                              int hi_exp, uint64_t seed) {
  std::vector<float> in;
  in.reserve(mags.size() * 10 + n_random);
  for (size_t i = 0; i < mags.size(); ++i) {
    const float v = static_cast<float>(mags[i]);
    if (std::isfinite(v)) in.insert(in.end(), {v, -v});
    if (i + 1 == mags.size()) break;
    const double mid = 0.5 * (mags[i] + mags[i + 1]);
    const float m = static_cast<float>(mid);
    if (static_cast<double>(m) != mid) continue;  // never for these formats; be safe
    for (float x : {m, std::nextafter(m, 0.0f), std::nextafter(m, kInf)}) {
      in.insert(in.end(), {x, -x});
    }
  }
  in.insert(in.end(), {0.0f, -0.0f, std::numeric_limits<float>::max(),
                       -std::numeric_limits<float>::max(), std::numeric_limits<float>::min(),
                       std::numeric_limits<float>::denorm_min(),
                       -std::numeric_limits<float>::denorm_min()});
  std::mt19937_64 rng(seed);
  const uint32_t lo_field = static_cast<uint32_t>(std::max(lo_exp + 127, 0));
  const uint32_t hi_field = static_cast<uint32_t>(std::min(hi_exp + 127, 254));
  std::uniform_int_distribution<uint32_t> field(lo_field, hi_field);
  for (int i = 0; i < n_random; ++i) {
    const uint32_t r = static_cast<uint32_t>(rng());
    float x;
    if (i % 4 == 0) {
      x = FromBits(r);
      if (std::isnan(x) || std::isinf(x)) x = FromBits(r & 0xBF7FFFFFu);  // clear an exp bit
    } else {
      x = FromBits((r & 0x807FFFFFu) | (field(rng) << 23));
    }
    in.push_back(x);
  }
  return in;
}

// Checks encode(x) against the nearest-value reference on every finite input: the reference
// code is the magnitude code with the sign bit `sign_bit` for negative inputs (zero included).
template <typename Encode>
void ExpectMatchesReference(const char* what, Encode encode, const std::vector<double>& mags,
                            uint32_t sign_bit, const std::vector<float>& inputs) {
  int failures = 0;
  for (float x : inputs) {
    if (!std::isfinite(x)) continue;
    const uint32_t want =
        RefNearest(mags, std::fabs(static_cast<double>(x))) | (std::signbit(x) ? sign_bit : 0u);
    const uint32_t got = encode(x);
    if (got != want && ++failures <= 10) {
      ADD_FAILURE() << what << "(" << x << " = 0x" << std::hex << Bits(x) << ") = 0x" << got
                    << ", want 0x" << want;
    }
  }
  EXPECT_EQ(failures, 0) << what << ": mismatches out of " << inputs.size();
}

// ---------------------------------------------------------------------------------------------
// BF16

TEST(Bf16Convert, DecodeAllCodesIsTheShiftAndTheFormula) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const float f = Bf16ToF32(static_cast<uint16_t>(c));
    ASSERT_EQ(Bits(f), c << 16) << std::hex << c;
    const uint32_t e = (c >> 7) & 0xFF;
    if (e != 0xFF) {
      ASSERT_EQ(static_cast<double>(f), RefDecode(c, 8, 7, 127)) << std::hex << c;
      ASSERT_EQ(std::signbit(f), (c & 0x8000) != 0);
    }
  }
}

TEST(Bf16Convert, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const float f = Bf16ToF32(code);
    if (std::isnan(f)) {
      // NaN codes re-encode to a NaN: the same sign and payload, quiet bit set.
      const uint16_t back = F32ToBf16(f);
      ASSERT_TRUE(std::isnan(Bf16ToF32(back))) << std::hex << c;
      ASSERT_EQ(back, code | 0x0040) << std::hex << c;
    } else {
      ASSERT_EQ(F32ToBf16(f), code) << std::hex << c;
    }
  }
}

TEST(Bf16Convert, SpecialValues) {
  EXPECT_EQ(F32ToBf16(0.0f), 0x0000);
  EXPECT_EQ(F32ToBf16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToBf16(kInf), 0x7F80);
  EXPECT_EQ(F32ToBf16(-kInf), 0xFF80);
  EXPECT_EQ(F32ToBf16(1.0f), 0x3F80);
  // Largest bf16 is 0x7F7F; halfway to the next (odd code, tie) and float max overflow to inf.
  EXPECT_EQ(F32ToBf16(FromBits(0x7F7F7FFFu)), 0x7F7F);
  EXPECT_EQ(F32ToBf16(FromBits(0x7F7F8000u)), 0x7F80);
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::max()), 0x7F80);
  // Ties to even: 1 + 2^-8 is halfway between 0x3F80 (even) and 0x3F81.
  EXPECT_EQ(F32ToBf16(FromBits(0x3F808000u)), 0x3F80);
  EXPECT_EQ(F32ToBf16(FromBits(0x3F818000u)), 0x3F82);
  // Subnormals: the smallest float subnormal is below half of bf16's smallest (0x0001).
  EXPECT_EQ(F32ToBf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(F32ToBf16(-std::numeric_limits<float>::denorm_min()), 0x8000);
  EXPECT_EQ(F32ToBf16(FromBits(0x00018000u)), 0x0002);  // tie between 1 and 2
  // NaN stays a quiet NaN with its sign, also when the payload is only in the dropped bits.
  EXPECT_EQ(F32ToBf16(kNan), 0x7FC0);
  EXPECT_EQ(F32ToBf16(-kNan), 0xFFC0);
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(FromBits(0x7F800001u)))));
  EXPECT_TRUE(std::isnan(Bf16ToF32(F32ToBf16(FromBits(0xFF800001u)))));
  EXPECT_TRUE(std::signbit(Bf16ToF32(F32ToBf16(FromBits(0xFF800001u)))));
}

TEST(Bf16Convert, EncodeIsRoundToNearestEven) {
  // Codes 0..0x7F7F are the finite magnitudes; 2^128 stands for overflow to inf (0x7F80).
  const std::vector<double> mags = RefMagnitudes(0x7F80, 8, 7, 127, std::ldexp(1.0, 128));
  const std::vector<float> inputs = TestInputs(mags, 2'000'000, -149, 127, 1);
  ExpectMatchesReference("F32ToBf16", [](float x) { return uint32_t{F32ToBf16(x)}; }, mags,
                         0x8000, inputs);
}

TEST(Bf16Convert, BulkMatchesScalar) {
  std::mt19937 rng(7);
  std::vector<float> f(1000);
  for (float& x : f) x = FromBits(static_cast<uint32_t>(rng()));  // NaNs and infs included
  f[3] = kNan;
  f[4] = -kInf;
  std::vector<uint16_t> h(f.size());
  F32ToBf16(f.data(), h.data(), f.size());
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(h[i], F32ToBf16(f[i])) << i;
  std::vector<float> back(f.size());
  Bf16ToF32(h.data(), back.data(), h.size());
  for (size_t i = 0; i < h.size(); ++i) ASSERT_EQ(Bits(back[i]), Bits(Bf16ToF32(h[i]))) << i;
  F32ToBf16(f.data(), h.data(), 0);  // n = 0 touches nothing
  Bf16ToF32(h.data(), back.data(), 0);
}

// ---------------------------------------------------------------------------------------------
// F16

TEST(F16Convert, DecodeAllCodesMatchesFormula) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const float f = F16ToF32(static_cast<uint16_t>(c));
    const uint32_t e = (c >> 10) & 0x1F;
    const uint32_t m = c & 0x3FF;
    ASSERT_EQ(std::signbit(f), (c & 0x8000) != 0) << std::hex << c;
    if (e == 31) {
      ASSERT_EQ(std::isinf(f), m == 0) << std::hex << c;
      ASSERT_EQ(std::isnan(f), m != 0) << std::hex << c;
    } else {
      // sign * 2^(e-15) * (1 + m/1024), subnormals sign * 2^-14 * m/1024.
      ASSERT_EQ(static_cast<double>(f), RefDecode(c, 5, 10, 15)) << std::hex << c;
    }
  }
}

TEST(F16Convert, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 0x10000; ++c) {
    const uint16_t code = static_cast<uint16_t>(c);
    const float f = F16ToF32(code);
    if (std::isnan(f)) {
      ASSERT_EQ(F32ToF16(f), code | 0x0200) << std::hex << c;  // quieted, payload kept
    } else {
      ASSERT_EQ(F32ToF16(f), code) << std::hex << c;
    }
  }
}

TEST(F16Convert, SpecialValues) {
  EXPECT_EQ(F32ToF16(0.0f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
  EXPECT_EQ(F32ToF16(1.0f), 0x3C00);
  EXPECT_EQ(F32ToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65519.996f), 0x7BFF);
  EXPECT_EQ(F32ToF16(65520.0f), 0x7C00);  // halfway past max, tie to even: inf
  EXPECT_EQ(F32ToF16(-1e30f), 0xFC00);
  EXPECT_EQ(F32ToF16(kInf), 0x7C00);
  EXPECT_EQ(F32ToF16(-kInf), 0xFC00);
  EXPECT_EQ(F32ToF16(0x1p-24f), 0x0001);  // smallest subnormal
  EXPECT_EQ(F32ToF16(0x1p-25f), 0x0000);  // tie with 0: even
  EXPECT_EQ(F32ToF16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);
  EXPECT_EQ(F32ToF16(-0x1p-26f), 0x8000);
  EXPECT_EQ(F32ToF16(0x1.ff8p-15f), 0x03FF);  // largest subnormal
  EXPECT_EQ(F32ToF16(0x1.ffcp-15f), 0x0400);  // + half a step, tie to even: smallest normal
  EXPECT_EQ(F32ToF16(kNan), 0x7E00);
  EXPECT_EQ(F32ToF16(-kNan), 0xFE00);
  EXPECT_TRUE(std::isnan(F16ToF32(F32ToF16(FromBits(0x7F800001u)))));  // payload below kept bits
  EXPECT_TRUE(std::isnan(F16ToF32(0x7C01)));  // signaling NaN decodes as quiet NaN
  EXPECT_EQ(Bits(F16ToF32(0x7C01)) & 0x00400000u, 0x00400000u);
}

TEST(F16Convert, EncodeIsRoundToNearestEven) {
  const std::vector<double> mags = RefMagnitudes(0x7C00, 5, 10, 15, 65536.0);
  const std::vector<float> inputs = TestInputs(mags, 1'000'000, -27, 18, 2);
  ExpectMatchesReference("F32ToF16", [](float x) { return uint32_t{F32ToF16(x)}; }, mags, 0x8000,
                         inputs);
}

// ---------------------------------------------------------------------------------------------
// FP8 E4M3 (fn)

TEST(Fp8E4M3Convert, DecodeAllCodesMatchesFormula) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = Fp8E4M3ToF32(static_cast<uint8_t>(c));
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << std::hex << c;
    if ((c & 0x7F) == 0x7F) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << c;
    } else {
      EXPECT_EQ(static_cast<double>(f), RefDecode(c, 4, 3, 7)) << std::hex << c;
    }
  }
  EXPECT_EQ(Fp8E4M3ToF32(0x7E), 448.0f);
  EXPECT_EQ(Fp8E4M3ToF32(0x01), 0x1p-9f);
  EXPECT_EQ(Fp8E4M3ToF32(0x08), 0x1p-6f);
  EXPECT_EQ(Fp8E4M3ToF32(0x78), 256.0f);  // exponent field 15 is finite in "fn"
}

TEST(Fp8E4M3Convert, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 256; ++c) {
    // NaN codes too: NaN encodes to 0x7F / 0xFF by its sign, which are exactly the NaN codes.
    EXPECT_EQ(F32ToFp8E4M3(Fp8E4M3ToF32(static_cast<uint8_t>(c))), c) << std::hex << c;
  }
}

TEST(Fp8E4M3Convert, SaturatesAndKeepsNan) {
  EXPECT_EQ(F32ToFp8E4M3(448.0f), 0x7E);
  EXPECT_EQ(F32ToFp8E4M3(449.0f), 0x7E);
  EXPECT_EQ(F32ToFp8E4M3(464.0f), 0x7E);  // halfway to the would-be 480: still 448
  EXPECT_EQ(F32ToFp8E4M3(1e9f), 0x7E);
  EXPECT_EQ(F32ToFp8E4M3(-1e9f), 0xFE);
  EXPECT_EQ(F32ToFp8E4M3(kInf), 0x7E);
  EXPECT_EQ(F32ToFp8E4M3(-kInf), 0xFE);
  EXPECT_EQ(F32ToFp8E4M3(std::numeric_limits<float>::max()), 0x7E);
  EXPECT_EQ(F32ToFp8E4M3(kNan), 0x7F);
  EXPECT_EQ(F32ToFp8E4M3(-kNan), 0xFF);
  EXPECT_EQ(F32ToFp8E4M3(0.0f), 0x00);
  EXPECT_EQ(F32ToFp8E4M3(-0.0f), 0x80);
  EXPECT_EQ(F32ToFp8E4M3(0x1p-10f), 0x00);  // half the smallest subnormal: tie to 0
  EXPECT_EQ(F32ToFp8E4M3(0x1.8p-9f), 0x02);  // 1.5 steps: tie to 2
  EXPECT_EQ(F32ToFp8E4M3(-0x1p-11f), 0x80);
}

TEST(Fp8E4M3Convert, EncodeIsRoundToNearestEvenSaturating) {
  // The finite magnitudes 0..0x7E only: the reference's "beyond the last value" is saturation.
  const std::vector<double> mags = RefMagnitudes(0x7F, 4, 3, 7, 0.0);
  ASSERT_EQ(mags.back(), 448.0);
  const std::vector<float> inputs = TestInputs(mags, 200'000, -12, 10, 3);
  ExpectMatchesReference("F32ToFp8E4M3", [](float x) { return uint32_t{F32ToFp8E4M3(x)}; }, mags,
                         0x80, inputs);
}

// ---------------------------------------------------------------------------------------------
// FP8 E5M2

TEST(Fp8E5M2Convert, DecodeAllCodesMatchesFormula) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = Fp8E5M2ToF32(static_cast<uint8_t>(c));
    EXPECT_EQ(std::signbit(f), (c & 0x80) != 0) << std::hex << c;
    const uint32_t e = (c >> 2) & 0x1F;
    if (e == 31) {
      EXPECT_EQ(std::isinf(f), (c & 3) == 0) << std::hex << c;
      EXPECT_EQ(std::isnan(f), (c & 3) != 0) << std::hex << c;
    } else {
      EXPECT_EQ(static_cast<double>(f), RefDecode(c, 5, 2, 15)) << std::hex << c;
    }
  }
  EXPECT_EQ(Fp8E5M2ToF32(0x7B), 57344.0f);
  EXPECT_EQ(Fp8E5M2ToF32(0x01), 0x1p-16f);
}

TEST(Fp8E5M2Convert, AllCodesRoundTrip) {
  for (uint32_t c = 0; c < 256; ++c) {
    const float f = Fp8E5M2ToF32(static_cast<uint8_t>(c));
    const uint8_t back = F32ToFp8E5M2(f);
    if (std::isnan(f)) {
      EXPECT_EQ(back, (c & 0x80) | 0x7E) << std::hex << c;  // quiet NaN, sign kept
    } else {
      EXPECT_EQ(back, c) << std::hex << c;
    }
  }
}

TEST(Fp8E5M2Convert, OverflowsToInfLikeIeee) {
  EXPECT_EQ(F32ToFp8E5M2(57344.0f), 0x7B);
  EXPECT_EQ(F32ToFp8E5M2(61439.996f), 0x7B);
  EXPECT_EQ(F32ToFp8E5M2(61440.0f), 0x7C);  // halfway to 65536, tie to even code 0x7C: inf
  EXPECT_EQ(F32ToFp8E5M2(-1e9f), 0xFC);
  EXPECT_EQ(F32ToFp8E5M2(kInf), 0x7C);
  EXPECT_EQ(F32ToFp8E5M2(-kInf), 0xFC);
  EXPECT_EQ(F32ToFp8E5M2(kNan), 0x7E);
  EXPECT_EQ(F32ToFp8E5M2(-kNan), 0xFE);
  EXPECT_EQ(F32ToFp8E5M2(-0.0f), 0x80);
  EXPECT_EQ(F32ToFp8E5M2(0x1p-17f), 0x00);  // half the smallest subnormal: tie to 0
}

TEST(Fp8E5M2Convert, EncodeIsRoundToNearestEven) {
  const std::vector<double> mags = RefMagnitudes(0x7C, 5, 2, 15, 65536.0);
  const std::vector<float> inputs = TestInputs(mags, 200'000, -19, 18, 4);
  ExpectMatchesReference("F32ToFp8E5M2", [](float x) { return uint32_t{F32ToFp8E5M2(x)}; }, mags,
                         0x80, inputs);
}

// ---------------------------------------------------------------------------------------------
// E2M1 (MXFP4 element)

TEST(E2M1Convert, DecodeTable) {
  const float want[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (uint32_t c = 0; c < 16; ++c) {
    EXPECT_EQ(Bits(E2M1ToF32(static_cast<uint8_t>(c))), Bits(want[c])) << c;
    // Only the low nibble is read.
    EXPECT_EQ(Bits(E2M1ToF32(static_cast<uint8_t>(c | 0xA0))), Bits(want[c])) << c;
    EXPECT_EQ(F32ToE2M1(want[c]), c) << c;  // round trip, -0 included
  }
  EXPECT_TRUE(std::signbit(E2M1ToF32(8)));
}

TEST(E2M1Convert, TiesGoToTheEvenCode) {
  EXPECT_EQ(F32ToE2M1(0.25f), 0);   // 0 | 0.5
  EXPECT_EQ(F32ToE2M1(0.75f), 2);   // 0.5 | 1
  EXPECT_EQ(F32ToE2M1(1.25f), 2);   // 1 | 1.5
  EXPECT_EQ(F32ToE2M1(1.75f), 4);   // 1.5 | 2
  EXPECT_EQ(F32ToE2M1(2.5f), 4);    // 2 | 3
  EXPECT_EQ(F32ToE2M1(3.5f), 6);    // 3 | 4
  EXPECT_EQ(F32ToE2M1(5.0f), 6);    // 4 | 6
  EXPECT_EQ(F32ToE2M1(-0.25f), 8);  // -0
  EXPECT_EQ(F32ToE2M1(-5.0f), 14);
  EXPECT_EQ(F32ToE2M1(std::nextafter(0.25f, 1.0f)), 1);
  EXPECT_EQ(F32ToE2M1(std::nextafter(5.0f, 0.0f)), 6);
  EXPECT_EQ(F32ToE2M1(std::nextafter(5.0f, 9.0f)), 7);
}

TEST(E2M1Convert, SaturatesAndMapsNanToMax) {
  EXPECT_EQ(F32ToE2M1(7.0f), 7);
  EXPECT_EQ(F32ToE2M1(1e30f), 7);
  EXPECT_EQ(F32ToE2M1(-1e30f), 15);
  EXPECT_EQ(F32ToE2M1(kInf), 7);
  EXPECT_EQ(F32ToE2M1(-kInf), 15);
  EXPECT_EQ(F32ToE2M1(kNan), 7);
  EXPECT_EQ(F32ToE2M1(-kNan), 15);
  EXPECT_EQ(F32ToE2M1(0.0f), 0);
  EXPECT_EQ(F32ToE2M1(-0.0f), 8);
  EXPECT_EQ(F32ToE2M1(-1e-30f), 8);
}

TEST(E2M1Convert, EncodeMatchesNearestSearch) {
  const std::vector<double> mags = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  std::vector<float> inputs = TestInputs(mags, 100'000, -4, 4, 5);
  std::mt19937 rng(6);
  std::uniform_real_distribution<float> u(-8.0f, 8.0f);
  for (int i = 0; i < 100'000; ++i) inputs.push_back(u(rng));
  ExpectMatchesReference("F32ToE2M1", [](float x) { return uint32_t{F32ToE2M1(x)}; }, mags, 8,
                         inputs);
}

// ---------------------------------------------------------------------------------------------
// E8M0 (MX scale)

TEST(E8M0Convert, AllCodesArePowersOfTwo) {
  for (uint32_t c = 0; c < 255; ++c) {
    const float f = E8M0ToF32(static_cast<uint8_t>(c));
    EXPECT_EQ(static_cast<double>(f), std::ldexp(1.0, static_cast<int>(c) - 127)) << c;
  }
  EXPECT_EQ(Bits(E8M0ToF32(0)), 0x00400000u);  // 2^-127, a float subnormal
  EXPECT_EQ(E8M0ToF32(127), 1.0f);
  EXPECT_EQ(E8M0ToF32(254), 0x1p127f);
  EXPECT_TRUE(std::isnan(E8M0ToF32(255)));
}

// ---------------------------------------------------------------------------------------------
// MXFP4 rows

TEST(Mxfp4, DequantizeHandBuiltRowLowNibbleFirst) {
  std::vector<uint8_t> packed(32, 0);
  const uint8_t scales[2] = {128, 126};  // x2, x0.5
  packed[0] = 0x72;   // element 0: code 2 (1.0), element 1: code 7 (6.0)
  packed[1] = 0xF8;   // element 2: code 8 (-0.0), element 3: code 15 (-6.0)
  packed[15] = 0x3A;  // element 30: code 10 (-1.0), element 31: code 3 (1.5)
  packed[16] = 0x51;  // element 32: code 1 (0.5), element 33: code 5 (3.0)
  std::vector<float> want(64, 0.0f);
  want[0] = 2.0f;
  want[1] = 12.0f;
  want[2] = -0.0f;
  want[3] = -12.0f;
  want[30] = -2.0f;
  want[31] = 3.0f;
  want[32] = 0.25f;
  want[33] = 1.5f;
  std::vector<float> out(64, 123.0f);
  DequantizeMxfp4Row(packed.data(), scales, 64, out.data());
  for (int k = 0; k < 64; ++k) EXPECT_EQ(Bits(out[k]), Bits(want[k])) << k;
}

TEST(Mxfp4, DequantizeIsExactForEveryScaleAndCode) {
  // One group per scale 0..255, each holding every code twice (in both nibble positions).
  constexpr int kGroups = 256;
  std::vector<uint8_t> packed(kGroups * 16);
  std::vector<uint8_t> scales(kGroups);
  for (int g = 0; g < kGroups; ++g) {
    scales[g] = static_cast<uint8_t>(g);
    for (int j = 0; j < 16; ++j) packed[g * 16 + j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  }
  std::vector<float> out(kGroups * 32);
  DequantizeMxfp4Row(packed.data(), scales.data(), kGroups * 32, out.data());
  const double e2m1[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int g = 0; g < kGroups; ++g) {
    for (int k = 0; k < 32; ++k) {
      const float got = out[g * 32 + k];
      if (g == 255) {
        EXPECT_TRUE(std::isnan(got)) << k;  // NaN scale: every element, zeros included
        continue;
      }
      const int code = k % 2 == 0 ? (k / 2) : 15 - (k / 2);
      const double mag = std::ldexp(e2m1[code & 7], g - 127);
      const double want = (code & 8) ? -mag : mag;
      if (mag > std::numeric_limits<float>::max()) {
        EXPECT_TRUE(std::isinf(got) && std::signbit(got) == (want < 0)) << g << " " << code;
      } else {
        EXPECT_EQ(static_cast<double>(got), want) << g << " " << code;  // exact, subnormals too
        EXPECT_EQ(std::signbit(got), (code & 8) != 0) << g << " " << code;
      }
    }
  }
  EXPECT_EQ(out[0 * 32 + 2], 0x1p-128f);  // scale 0, code 1: 0.5 * 2^-127
  EXPECT_TRUE(std::isinf(out[254 * 32 + 8]));  // scale 254, code 4: 2 * 2^127 = 2^128
}

// Scale the quantizer must pick for group `g` of `in`: floor(log2(amax)) - 2 + 127, computed in
// double (the implementation uses ilogb), clamped to [0, 254]; 127 for an all-zero group.
int RefScale(const std::vector<float>& in, int g) {
  double amax = 0;
  for (int k = 0; k < 32; ++k) amax = std::max(amax, std::fabs(double{in[g * 32 + k]}));
  if (amax == 0) return 127;
  return std::clamp(static_cast<int>(std::floor(std::log2(amax))) - 2 + 127, 0, 254);
}

// `in` (whole 32-element groups) quantized to MXFP4 and dequantized again; *scales receives
// the scale the quantizer chose for each group.
std::vector<float> Mxfp4RoundTrip(const std::vector<float>& in, std::vector<uint8_t>* scales) {
  const auto n = static_cast<int64_t>(in.size());
  std::vector<uint8_t> packed(in.size() / 2);
  scales->assign(in.size() / 32, 0);
  QuantizeMxfp4Row(in.data(), n, packed.data(), scales->data());
  std::vector<float> out(in.size());
  DequantizeMxfp4Row(packed.data(), scales->data(), n, out.data());
  return out;
}

TEST(Mxfp4, QuantizeRoundTripIsExactForRepresentableGroups) {
  // Each group: random E2M1 codes times 2^e, e in [-124, 125], which keeps the chosen scale in
  // [0, 254] (it is e - 3 .. e for the group's largest magnitude 0.5 .. 6).
  constexpr int kGroups = 2000;
  std::mt19937 rng(8);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_int_distribution<int> exp(-124, 125);
  std::vector<float> in(kGroups * 32);
  for (int g = 0; g < kGroups; ++g) {
    const int e = g == 0 ? 0 : exp(rng);
    for (int k = 0; k < 32; ++k) {
      // Group 0 is all zeros of both signs; group 1 holds a single nonzero element.
      int c = g == 0 ? (k % 2) * 8 : g == 1 ? (k == 17 ? 5 : 0) : code(rng);
      in[g * 32 + k] = std::ldexp(E2M1ToF32(static_cast<uint8_t>(c)), e);
    }
  }
  std::vector<uint8_t> scales;
  const std::vector<float> out = Mxfp4RoundTrip(in, &scales);
  for (int g = 0; g < kGroups; ++g) {
    ASSERT_EQ(scales[g], RefScale(in, g)) << g;
    for (int k = 0; k < 32; ++k) {
      ASSERT_EQ(Bits(out[g * 32 + k]), Bits(in[g * 32 + k])) << g << " " << k;
    }
  }
  EXPECT_EQ(scales[0], 127);
}

TEST(Mxfp4, QuantizeRandomNormalErrorIsHalfAStep) {
  // Error bound, per element, with y = |x| / 2^(s-127) the element at the group's scale
  // (y < 8 since amax / 2^(s-127) is in [4, 8)): E2M1 steps are 0.5 on [0, 2], 1 on [2, 4] and 2
  // on [4, 6], so RNE is off by at most half a step: 0.25, 0.5 or 1 (times 2^(s-127)). Above 6
  // the element is clipped, off by y - 6 < 2. Relative to the element this means < 25% for every
  // y >= 1 (worst: ties 1.25, 2.5, 5 at 20%, clipping just below 8 at 25%); smaller elements can
  // lose everything (y < 0.25 -> 0), which the absolute bound covers.
  constexpr int kGroups = 4000;
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exp(-30, 30);
  std::vector<float> in(kGroups * 32);
  for (int g = 0; g < kGroups; ++g) {
    const int e = exp(rng);
    for (int k = 0; k < 32; ++k) in[g * 32 + k] = std::ldexp(normal(rng), e);
  }
  std::vector<uint8_t> scales;
  const std::vector<float> out = Mxfp4RoundTrip(in, &scales);
  const std::vector<double> mags = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  for (int g = 0; g < kGroups; ++g) {
    const int s = RefScale(in, g);
    ASSERT_EQ(scales[g], s) << g;
    const double unit = std::ldexp(1.0, s - 127);
    for (int k = 0; k < 32; ++k) {
      const double x = in[g * 32 + k];
      const double q = out[g * 32 + k];
      const double y = std::fabs(x) / unit;
      ASSERT_LT(y, 8.0);
      const double bound = y <= 2 ? 0.25 : y <= 4 ? 0.5 : y <= 6 ? 1.0 : y - 6;
      const double err = std::fabs(q - x);
      ASSERT_LE(err, bound * unit) << g << " " << k << " x=" << x << " q=" << q;
      if (y >= 1) {
        ASSERT_LT(err, 0.25 * std::fabs(x)) << g << " " << k;
      }
      // And it is exactly the nearest-search reference at that scale.
      const double ref = mags[RefNearest(mags, y)] * unit;
      ASSERT_EQ(q, std::signbit(x) ? -ref : ref) << g << " " << k;
    }
  }
}

TEST(Mxfp4, QuantizeSpecialGroups) {
  std::vector<float> in(4 * 32, 1.0f);
  in[5] = kNan;                       // group 0: NaN -> NaN scale
  in[32 + 7] = -kInf;                 // group 1: inf -> NaN scale
  for (int k = 0; k < 32; ++k) {      // group 2: amax 1.5 * 2^-126 -> scale clamped to 0
    in[64 + k] = k == 3 ? -0x1.8p-126f : 0x1p-128f;
  }
  for (int k = 0; k < 32; ++k) in[96 + k] = 0x1p100f * (k % 4);  // group 3: amax 3 * 2^100
  std::vector<uint8_t> packed(4 * 16, 0xEE);
  std::vector<uint8_t> scales(4);
  QuantizeMxfp4Row(in.data(), 4 * 32, packed.data(), scales.data());
  EXPECT_EQ(scales[0], 255);
  EXPECT_EQ(scales[1], 255);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(packed[j], 0) << j;
  EXPECT_EQ(scales[2], 0);
  EXPECT_EQ(scales[3], 100 + 1 - 2 + 127);
  std::vector<float> out(4 * 32);
  DequantizeMxfp4Row(packed.data(), scales.data(), 4 * 32, out.data());
  for (int k = 0; k < 64; ++k) EXPECT_TRUE(std::isnan(out[k])) << k;
  // Group 2 at scale 2^-127: -1.5 * 2^-126 = -3 * 2^-127 is exact; 2^-128 = 0.5 * 2^-127 too.
  EXPECT_EQ(out[64 + 3], -0x1.8p-126f);
  EXPECT_EQ(out[64 + 0], 0x1p-128f);
  for (int k = 0; k < 32; ++k) EXPECT_EQ(out[96 + k], in[96 + k]) << k;
}

}  // namespace
}  // namespace kimirt
