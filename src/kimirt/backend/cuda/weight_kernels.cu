// GEMM kernels for few rows and for BF16-held weights, F32 accumulation (kernels.h): BF16 weights
// are the checkpoint's own values, so results equal the F32-weight path up to summation order.
// Few rows (decode, and decode batches): a warp per output column, row-invariant. Many rows
// (prefill): BF16 weights are widened to F32 chunk by chunk for cuBLAS.
#include "kimirt/backend/cuda/kernels.h"

#include <cuda_bf16.h>

namespace kimirt::cuda {
namespace {

// A warp per output column; rows go by in groups of kGroup (the weight row is re-read per group,
// from cache after the first). Each row's sum runs in the same order — lanes over k, then the
// butterfly — whatever m is, so a row's result does not depend on the other rows (row-invariant:
// Backend::RowInvariantRows).
constexpr int kGroup = 8;

__global__ void GemvKernel(const float* x, const void* w, bool bf16, float* y, int64_t m, int64_t n, int64_t k) {
  const int64_t col = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (col >= n) return;  // whole warps leave together
  for (int64_t r0 = 0; r0 < m; r0 += kGroup) {
    float acc[kGroup];
#pragma unroll
    for (int r = 0; r < kGroup; ++r) acc[r] = 0.0f;
    for (int64_t i = lane; i < k; i += 32) {
      const float wv = WeightAt(w, col * k + i, bf16);
#pragma unroll
      for (int r = 0; r < kGroup; ++r) {
        if (r0 + r < m) acc[r] += x[(r0 + r) * k + i] * wv;
      }
    }
#pragma unroll
    for (int r = 0; r < kGroup; ++r) {
      float v = acc[r];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && r0 + r < m) y[(r0 + r) * n + col] = v;
    }
  }
}

__global__ void Bf16ToF32Kernel(const __nv_bfloat16* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = __bfloat162float(src[i]);
  }
}

}  // namespace

void Gemv(const float* x, const void* w, bool w_bf16, float* y, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n * 32 + kThreads - 1) / kThreads;
  GemvKernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, w, w_bf16, y, m, n, k);
  CheckLaunch("Gemv");
}

void Bf16ToF32(const void* src, float* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  Bf16ToF32Kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(
      static_cast<const __nv_bfloat16*>(src), dst, n);
  CheckLaunch("Bf16ToF32");
}

}  // namespace kimirt::cuda
