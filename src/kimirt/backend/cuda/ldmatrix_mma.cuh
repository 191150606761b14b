// Shared-memory fragment loads and the m16n8k16 BF16 MMA for attention kernels that keep their
// operands in shared memory (mla_prefill_kernels.cu, mla_decode_kernels.cu). PTX ISA "Matrix
// fragments for mma.m16n8k16": A is 16 × 16 (row), B 16 × 8 (col), C/D 16 × 8 in F32; lane
// (g = lane / 4, t = lane % 4) holds C elements (g, 2t), (g, 2t + 1), (g + 8, 2t), (g + 8, 2t + 1).
#pragma once

#include <cuda_bf16.h>

namespace kimirt::cuda {

__device__ __forceinline__ unsigned SmemAddr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Four 8 × 8 b16 matrices; lanes 8i .. 8i + 7 give the row addresses of matrix i.
__device__ __forceinline__ void Ldmatrix4(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}
// The same, each matrix transposed (a B operand from rows that are k).
__device__ __forceinline__ void Ldmatrix4Trans(unsigned (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(SmemAddr(smem)));
}

// Two F32 as a BF16 pair (round to nearest even), `lo` in the low half: the element of the
// lower column index, as the mma fragments order them.
__device__ __forceinline__ unsigned PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}

// d += a · b for one m16n8k16 tile (BF16 operands, F32 accumulators).
__device__ __forceinline__ void Mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

}  // namespace kimirt::cuda
