// GEMMs against BF16-held weights with F32 activations and F32 accumulation (kernels.h): the
// weights are the checkpoint's own BF16 values, so the results equal the F32-weight path up to
// summation order. Few rows (decode): a warp per output column reads the weight row once for
// all rows of x. Many rows (prefill): the weight is widened to F32 chunk by chunk for cuBLAS.
#include "kimirt/backend/cuda/kernels.h"

#include <cuda_bf16.h>

namespace kimirt::cuda {
namespace {

__global__ void GemvBf16Kernel(const float* x, const __nv_bfloat16* w, float* y, int m, int64_t n, int64_t k) {
  const int64_t col = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (col >= n) return;  // whole warps leave together
  const __nv_bfloat16* row = w + col * k;
  float acc[kGemvMaxRows];
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) acc[r] = 0.0f;
  for (int64_t i = lane; i < k; i += 32) {
    const float wv = __bfloat162float(row[i]);
#pragma unroll
    for (int r = 0; r < kGemvMaxRows; ++r) {
      if (r < m) acc[r] += x[r * k + i] * wv;
    }
  }
#pragma unroll
  for (int r = 0; r < kGemvMaxRows; ++r) {
    float v = acc[r];
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0 && r < m) y[r * n + col] = v;
  }
}

__global__ void Bf16ToF32Kernel(const __nv_bfloat16* src, float* dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    dst[i] = __bfloat162float(src[i]);
  }
}

}  // namespace

void GemvBf16(const float* x, const void* w, float* y, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  if (m == 0 || n == 0) return;
  constexpr int kThreads = 256;
  const int64_t blocks = (n * 32 + kThreads - 1) / kThreads;
  GemvBf16Kernel<<<static_cast<unsigned>(blocks), kThreads, 0, s>>>(x, static_cast<const __nv_bfloat16*>(w), y,
                                                                     static_cast<int>(m), n, k);
  CheckLaunch("GemvBf16");
}

void Bf16ToF32(const void* src, float* dst, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256;
  Bf16ToF32Kernel<<<static_cast<unsigned>(blocks < 65536 ? blocks : 65536), 256, 0, s>>>(
      static_cast<const __nv_bfloat16*>(src), dst, n);
  CheckLaunch("Bf16ToF32");
}

}  // namespace kimirt::cuda
