// Tensor-core pieces shared by the few-row GEMMs on BF16 values (decode_gemm.cu, the decode MoE
// experts in moe_kernels.cu; docs/cuda.md "Decode GEMM"): x split into three BF16 parts so the
// MMAs keep F32 accuracy, the m16n8k16 MMA itself, and one 32-k step of six MMAs.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

namespace kimirt::cuda::mma {

// One x value as BF16 bits hi + mid + lo. Each remainder (v − hi, then − mid) is exact in F32
// (the subtrahend is v rounded to fewer bits), and each part takes the next 8 significant bits,
// so hi + mid + lo = v for every normal v (a remainder under BF16's normal range, |v| < ~2⁻¹¹⁰,
// loses bits: irrelevant next to the other terms of a dot product). A non-finite hi gets
// mid = lo = 0, so ±inf stays ±inf instead of inf − inf = NaN. Every kernel that splits x uses
// this one definition, so a row gets the same bits whichever kernel split it.
__device__ __forceinline__ void SplitOne(float v, uint32_t& hi, uint32_t& mid, uint32_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  const float hf = __bfloat162float(h);
  const float r1 = isfinite(hf) ? v - hf : 0.0f;
  const __nv_bfloat16 md = __float2bfloat16_rn(r1);
  hi = __bfloat16_as_ushort(h);
  mid = __bfloat16_as_ushort(md);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(r1 - __bfloat162float(md)));
}

// x's three parts of one lane's 8 k, as the MMA's B registers.
struct XParts {
  uint4 hi, mid, lo;
};

// 16 bytes of a weight, read once: no L1 allocation, it will not be read again this call.
__device__ __forceinline__ uint4 LoadStreaming(const void* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

// Asks L2 to fetch `bytes` (a multiple of 16, 16-byte aligned) at p, with no register and no
// wait (sm_90 bulk prefetch, PTX ISA "cp.async.bulk.prefetch"). A hint: it changes no result.
__device__ __forceinline__ void PrefetchL2(const void* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// d += a · b, m16n8k16, BF16 in, F32 accumulate (PTX ISA "Matrix fragments for mma.m16n8k16").
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One step of 32 k. Lane (g = lane/4, t = lane%4) holds 8 of the step's k as 16-byte words of
// weight rows g (`row_g`) and g + 8 (`row_g8`) and of x row g, the same 8 k in the same
// positions in all three. The fragment layout puts MMA k slots 2t, 2t+1 and 2t+8, 2t+9 in this
// lane (A regs 0/1 and 2/3, B reg 0 and 1), so MMA 1 takes words .x, .y and MMA 2 takes .z, .w:
// both operands use the same map, every k of the step is used once.
//
// The step's six MMAs (lo, mid, then hi: smallest first) start from zero and their sum is added
// to `acc` by an F32 add: the tensor cores' own accumulation truncates (rounds toward zero), which
// over a long chain (k = 9216: 1728 MMAs) biases the result by up to ~1e-5 relative; chains of 6
// whose results are added with round-to-nearest keep the error at F32's level.
__device__ __forceinline__ void Step(float (&acc)[4], const uint4& row_g, const uint4& row_g8, const XParts& xp) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Mma(d, row_g.x, row_g8.x, row_g.y, row_g8.y, xp.lo.x, xp.lo.y);
  Mma(d, row_g.z, row_g8.z, row_g.w, row_g8.w, xp.lo.z, xp.lo.w);
  Mma(d, row_g.x, row_g8.x, row_g.y, row_g8.y, xp.mid.x, xp.mid.y);
  Mma(d, row_g.z, row_g8.z, row_g.w, row_g8.w, xp.mid.z, xp.mid.w);
  Mma(d, row_g.x, row_g8.x, row_g.y, row_g8.y, xp.hi.x, xp.hi.y);
  Mma(d, row_g.z, row_g8.z, row_g.w, row_g8.w, xp.hi.z, xp.hi.w);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += d[i];
}

}  // namespace kimirt::cuda::mma
