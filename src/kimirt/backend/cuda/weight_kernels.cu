// GEMM kernels for few rows and for BF16-held weights, F32 accumulation (kernels.h): BF16 weights
// are the checkpoint's own values, so results equal the F32-weight path up to summation order.
// Few rows (decode, and decode batches) with F32-held weights: Gemv, a warp per output column on
// the FP32 cores, row-invariant (BF16-held weights go to decode_gemm.cu's tensor-core kernel,
// which reads the weight once for all rows). Many rows (prefill): BF16 weights are widened to F32
// chunk by chunk for cuBLAS.
#include "kimirt/backend/cuda/kernels.h"

#include <cuda_bf16.h>

namespace kimirt::cuda {
namespace {

// A block of 8 warps covers 32 output columns, 4 per warp, so each element of x, staged in
// shared memory a chunk of k at a time, serves 4 columns (before: x was read from cache once per
// column, which cost more than the weight at batch 1 and 6× more at batch 32). Rows go by in
// groups of kGroup. Each (row, column) sum runs in the same order as a plain warp-per-column dot
// product — lane j takes k = j, j+32, ... ascending, then the butterfly — whatever m is, so a row's
// result does not depend on the other rows (row-invariant: Backend::RowInvariantRows).
constexpr int kGroup = 8;
constexpr int kColsPerWarp = 4;
constexpr int kWarps = 8;
constexpr int kChunk = 512;  // a multiple of 32: each lane's k sequence is the same in every chunk

__global__ void __launch_bounds__(kWarps * 32) GemvKernel(const float* x, const void* w, bool bf16, float* y,
                                                         int64_t m, int64_t n, int64_t k) {
  __shared__ float xs[kGroup][kChunk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t col0 = (int64_t{blockIdx.x} * kWarps + warp) * kColsPerWarp;
  for (int64_t r0 = 0; r0 < m; r0 += kGroup) {
    float acc[kGroup][kColsPerWarp];
#pragma unroll
    for (int r = 0; r < kGroup; ++r) {
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) acc[r][c] = 0.0f;
    }
    for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
      __syncthreads();  // the previous chunk is consumed
      for (int idx = threadIdx.x; idx < kGroup * kChunk; idx += kWarps * 32) {
        const int r = idx / kChunk, i = idx % kChunk;
        xs[r][i] = (r0 + r < m && k0 + i < k) ? x[(r0 + r) * k + k0 + i] : 0.0f;
      }
      __syncthreads();
      const int64_t len = k - k0 < kChunk ? k - k0 : kChunk;
      for (int64_t i = lane; i < len; i += 32) {
        float wv[kColsPerWarp];
#pragma unroll
        for (int c = 0; c < kColsPerWarp; ++c) {
          wv[c] = col0 + c < n ? WeightAt(w, (col0 + c) * k + k0 + i, bf16) : 0.0f;
        }
#pragma unroll
        for (int r = 0; r < kGroup; ++r) {
          const float xv = xs[r][i];
#pragma unroll
          for (int c = 0; c < kColsPerWarp; ++c) acc[r][c] += xv * wv[c];
        }
      }
    }
#pragma unroll
    for (int r = 0; r < kGroup; ++r) {
#pragma unroll
      for (int c = 0; c < kColsPerWarp; ++c) {
        float v = acc[r][c];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && r0 + r < m && col0 + c < n) y[(r0 + r) * n + col0 + c] = v;
      }
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
  constexpr int64_t kColsPerBlock = kWarps * kColsPerWarp;
  const int64_t blocks = (n + kColsPerBlock - 1) / kColsPerBlock;
  GemvKernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(x, w, w_bf16, y, m, n, k);
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
