// What mla_decode_kernels.cu needs beyond ../decode_gemm_group_emulation/decode_gemm_host.h (and
// the shim it includes) in its host emulation (see ../mla_decode_emulate.sh): the block's shared
// memory as one buffer, __align__, __maxnreg__, and the FP8 E4M3 decode the device's
// __nv_cvt_fp8x2_to_halfraw2 does (every E4M3 value is exact in F32).
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#include "decode_gemm_host.h"

#define __align__(n) alignas(n)
#define __maxnreg__(n)

inline unsigned char* g_smem;  // the running block's shared memory (blocks run one at a time)

// E4M3 (OCP FP8): sign, 4 exponent bits (bias 7), 3 mantissa bits; no infinities, S.1111.111 NaN.
inline float E4m3ToFloat(unsigned code) {
  const unsigned e = (code >> 3) & 15, m = code & 7;
  const float sign = (code & 0x80) != 0 ? -1.0f : 1.0f;
  if (e == 15 && m == 7) return NAN;
  if (e == 0) return sign * std::ldexp(static_cast<float>(m), -9);
  return sign * std::ldexp(static_cast<float>(8 + m), static_cast<int>(e) - 10);
}
