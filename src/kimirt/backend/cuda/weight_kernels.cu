// GEMM kernels for few rows and for BF16-held weights, F32 accumulation (kernels.h): BF16 weights
// are the checkpoint's own values, so results equal the F32-weight path up to summation order.
// Few rows (decode, and decode batches) with F32-held weights: Gemv, a warp-per-column dot
// product order on the FP32 cores, row-invariant (BF16-held weights go to decode_gemm.cu's tensor-core kernel,
// which reads the weight once for all rows). Many rows (prefill): BF16 weights are widened to F32
// chunk by chunk for cuBLAS.
#include "kimirt/backend/cuda/kernels.h"

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

// A block covers kCols output columns (weight rows) for all m rows, k in chunks of kChunk: the
// block first copies the chunk of its kCols weight rows into shared memory, 16 bytes a thread
// at a time (32 KB in flight per block, so the few blocks a router has, e.g. 224 for 896
// experts, keep HBM busy: a warp reading its own column, as before, had ~1 KB in flight and ran
// at a few percent of bandwidth), then warp w takes rows w, w + 8, ... against all kCols columns.
// Each (row, column) sum runs in the order of a plain warp-per-column dot product — lane j takes
// k = j, j+32, ... ascending across the chunks, then the butterfly — whatever m is, so a row's
// result does not depend on the other rows (row-invariant: Backend::RowInvariantRows), and it
// has the bits it had before this layout (the router's logits, and so its choices, unchanged).
constexpr int kWarps = 8;
constexpr int kCols = 4;
constexpr int kRowsPerWarp = 8;     // kGemvMaxRows / kWarps
constexpr int kChunk = 2048;        // a multiple of 32: each lane's k sequence is the same in every chunk
static_assert(kWarps * kRowsPerWarp == kGemvMaxRows, "a warp's rows cover a decode batch");

__global__ void __launch_bounds__(kWarps * 32) GemvKernel(const float* x, const void* w, bool bf16, bool vec, float* y,
                                                         int64_t m, int64_t n, int64_t k) {
  __shared__ __align__(16) float ws[kCols][kChunk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t col0 = int64_t{blockIdx.x} * kCols;
  float acc[kRowsPerWarp][kCols];
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[r][c] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t len = k - k0 < kChunk ? k - k0 : kChunk;
    __syncthreads();  // the previous chunk is consumed
    if (vec && !bf16 && len % 4 == 0) {
      for (int i = threadIdx.x; i < kCols * len / 4; i += kWarps * 32) {
        const int c = static_cast<int>(i / (len / 4));
        const int64_t q = i % (len / 4);
        reinterpret_cast<float4*>(ws[c])[q] =
            col0 + c < n ? __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(w) + (col0 + c) * k + k0) + q)
                         : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    } else {
      for (int i = threadIdx.x; i < kCols * len; i += kWarps * 32) {
        const int c = static_cast<int>(i / len);
        const int64_t q = i % len;
        ws[c][q] = col0 + c < n ? WeightAt(w, (col0 + c) * k + k0 + q, bf16) : 0.0f;
      }
    }
    __syncthreads();
#pragma unroll
    for (int r = 0; r < kRowsPerWarp; ++r) {
      const int64_t row = warp + int64_t{kWarps} * r;
      if (row >= m) break;  // the same for the whole warp
      const float* xr = x + row * k + k0;
      for (int64_t i = lane; i < len; i += 32) {
        const float xv = __ldg(xr + i);
#pragma unroll
        for (int c = 0; c < kCols; ++c) acc[r][c] += xv * ws[c][i];
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRowsPerWarp; ++r) {
    const int64_t row = warp + int64_t{kWarps} * r;
    if (row >= m) break;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float v = acc[r][c];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && col0 + c < n) y[row * n + col0 + c] = v;
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
  if (m > kGemvMaxRows) {
    std::fprintf(stderr, "kimirt: Gemv takes up to %lld rows, got %lld\n", static_cast<long long>(kGemvMaxRows),
                 static_cast<long long>(m));
    std::abort();
  }
  const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const int64_t blocks = (n + kCols - 1) / kCols;
  GemvKernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(x, w, w_bf16, vec, y, m, n, k);
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
