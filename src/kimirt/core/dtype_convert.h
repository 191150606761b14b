// Value conversions between float and the narrow element types of Kimi checkpoints and of our
// caches: BF16, F16, OCP FP8 (E4M3 "fn", E5M2), the MXFP4 element E2M1 and the MX scale E8M0.
//
// Every encoder rounds to nearest, ties to even (RNE), from the exact float value, so results
// match PyTorch / the OCP reference on every input; the tests check this exhaustively where the
// format is small enough. The formats differ in what they do past their range, on purpose:
//   BF16, F16, E5M2: IEEE semantics. Overflow after rounding gives +-inf, NaN stays a quiet NaN
//                    with its sign. These are weight and activation formats; an inf must show.
//   E4M3:            saturating. |x| > 448 (inf included) gives +-448, NaN gives 0x7F / 0xFF
//                    (the sign is kept). We store the KV cache in E4M3: one outlier activation
//                    must cost precision in one element, not poison attention with a NaN (E4M3
//                    "fn" has no inf, so a non-saturating encoder would have to produce NaN).
//   E2M1:            saturating to +-6; NaN gives +-6 by its sign bit, like an infinity. An
//                    element cannot carry NaN; in MXFP4 the group scale does (0xFF).
// Decoders are exact: every code of every format here is a float (E8M0 code 0 = 2^-127 is a float
// subnormal).
#pragma once

#include <cstddef>
#include <cstdint>

namespace kimirt {

// Elements per E8M0 scale in MXFP4 (compressed-tensors "mxfp4-pack-quantized", OCP MX).
inline constexpr int64_t kMxfp4GroupSize = 32;
// Largest finite values.
inline constexpr float kFp8E4M3Max = 448.0f;
inline constexpr float kFp8E5M2Max = 57344.0f;
inline constexpr float kE2M1Max = 6.0f;

// BF16: the top half of a float. Decoding is the 16-bit shift (NaN payloads, signaling or not,
// are carried unchanged); encoding is RNE, NaN -> quiet NaN with the sign and top payload bits.
float Bf16ToF32(uint16_t bits);
uint16_t F32ToBf16(float value);

// IEEE binary16. Decoding turns a signaling NaN into a quiet one (as F16C / CUDA do).
float F16ToF32(uint16_t bits);
uint16_t F32ToF16(float value);

// OCP FP8 E4M3 "fn": bias 7, no infinities, S.1111.111 = NaN, max finite 448, subnormals in
// steps of 2^-9. Encoding saturates (see above); NaN -> 0x7F, or 0xFF for a negative NaN.
float Fp8E4M3ToF32(uint8_t bits);
uint8_t F32ToFp8E4M3(float value);

// OCP FP8 E5M2: bias 15, IEEE-like (S.11111.00 = inf, S.11111.xx = NaN), max finite 57344.
// Encoding: values that round past 57344 (|x| >= 61440) give +-inf; NaN -> 0x7E / 0xFE.
float Fp8E5M2ToF32(uint8_t bits);
uint8_t F32ToFp8E5M2(float value);

// MXFP4 element E2M1: bit 3 = sign, bits 0-2 index {0, 0.5, 1, 1.5, 2, 3, 4, 6}; code 8 = -0.
// Only the low 4 bits of `nibble` are read. Encoding: RNE among those magnitudes with ties to the
// even code (0.25 -> 0, 0.75 -> 1, 5 -> 4), saturating to +-6, sign of zero kept; NaN -> +-6.
float E2M1ToF32(uint8_t nibble);
uint8_t F32ToE2M1(float value);

// OCP E8M0 scale: 2^(code - 127); code 255 = NaN. Code 0 = 2^-127 exactly (a float subnormal).
float E8M0ToF32(uint8_t code);

// Bulk BF16 <-> F32 with the scalar semantics above (loops the compiler can vectorize).
void Bf16ToF32(const uint16_t* src, float* dst, size_t n);
void F32ToBf16(const float* src, uint16_t* dst, size_t n);

// Dequantizes one MXFP4 row (compressed-tensors mxfp4-pack-quantized). `n` logical elements, a
// multiple of kMxfp4GroupSize (checked). `packed` holds n/2 bytes: byte j has element 2j in its
// LOW nibble and element 2j+1 in its HIGH nibble. `scales` holds n/32 E8M0 codes; scales[g]
// covers elements 32g..32g+31. out[k] = E2M1(code_k) * 2^(scales[k/32] - 127), exactly: results
// in the float subnormal range are exact (the smallest is 0.5 * 2^-127), products past the float
// range are +-inf (e.g. 2 * 2^127), and a NaN scale (255) makes all 32 outputs NaN, zeros too.
void DequantizeMxfp4Row(const uint8_t* packed, const uint8_t* scales, int64_t n, float* out);

// The inverse, used by our checkpoint writer for test weights. Per group of 32, the scale is the
// OCP MX recommended one: s = floor(log2(amax)) - emax_elem + 127 with emax_elem = 2 (E2M1's
// largest binade, 4..6), so amax / 2^(s-127) lies in [4, 8); elements are then F32ToE2M1(x /
// 2^(s-127)) (exact power-of-two scaling), which clips the part of [6, 8) above 6 to 6.
//   - s is clamped to [0, 254]; only the low end can bind for finite inputs (amax < 2^-125).
//   - amax == 0 (all zeros): s = 127 (scale 1.0); element codes keep the sign of each zero.
//   - a NaN or +-inf anywhere in the group: s = 255 (NaN) and all 32 codes 0. MX has no inf, and a
//     silently finite group would hide the bad weight; a NaN group shows it.
// Inputs that are an E2M1 value times one power of two per group round-trip exactly (when that
// power keeps s inside [0, 254]). Writes n/2 bytes of `packed` and n/32 of `scales`.
void QuantizeMxfp4Row(const float* in, int64_t n, uint8_t* packed, uint8_t* scales);

}  // namespace kimirt
