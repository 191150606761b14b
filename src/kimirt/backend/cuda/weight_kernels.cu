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
// block copies the chunk of its kCols weight rows into shared memory, 16 bytes a thread at a
// time, and asks L2 for the next chunk (so the few blocks a router has, e.g. 224 for 896 experts,
// keep HBM busy: a warp reading its own column, as before, had ~1 KB in flight and ran at a few
// percent of bandwidth); then, 8 rows at a time, the rows' chunk of x into shared memory and
// warp w sums row w of the 8 against all kCols columns. Each (row, column) sum runs in the order
// of a plain warp-per-column dot product — lane j takes k = j, j+32, ... ascending across the
// chunks, then the butterfly — whatever m is, so a row's result does not depend on the other rows
// (row-invariant: Backend::RowInvariantRows), and it has the bits it had before this layout (the
// router's logits, and so its choices, unchanged).
constexpr int kWarps = 8;
constexpr int kCols = 4;
constexpr int kGroup = 8;                       // rows per pass over a chunk: a warp each
constexpr int kGroups = kGemvMaxRows / kGroup;  // row groups of a decode batch
constexpr int kChunk = 1024;  // a multiple of 32: each lane's k sequence is the same in every chunk
static_assert(kGroup == kWarps, "a warp per row of a group");

// The chunk [k0, k0 + len) of `rows` rows (row r at src + r·k, zeros for r ≥ valid) into dst.
// vec: k % 4 == 0 and src 16-byte aligned, so float4 loads.
__device__ __forceinline__ void StageChunk(const void* src, bool bf16, bool vec, int64_t k, int64_t k0, int64_t len,
                                           int rows, int64_t valid, float (*dst)[kChunk]) {
  if (vec && !bf16) {
    const int64_t q4 = len / 4;  // len is a multiple of 4 when k is
    for (int64_t i = threadIdx.x; i < rows * q4; i += kWarps * 32) {
      const int r = static_cast<int>(i / q4);
      const int64_t q = i % q4;
      reinterpret_cast<float4*>(dst[r])[q] =
          r < valid ? __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(src) + r * k + k0) + q)
                    : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  } else {
    for (int64_t i = threadIdx.x; i < rows * len; i += kWarps * 32) {
      const int r = static_cast<int>(i / len);
      const int64_t q = i % len;
      dst[r][q] = r < valid ? WeightAt(src, r * k + k0 + q, bf16) : 0.0f;
    }
  }
}

__global__ void __launch_bounds__(kWarps * 32) GemvKernel(const float* x, bool x_vec, const void* w, bool bf16,
                                                         bool vec, float* y, int64_t m, int64_t n, int64_t k) {
  __shared__ __align__(16) float ws[kCols][kChunk];
  __shared__ __align__(16) float xs[kGroup][kChunk];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t col0 = int64_t{blockIdx.x} * kCols;
  const size_t elem = bf16 ? 2 : 4;
  const void* wb = static_cast<const char*>(w) + col0 * k * elem;
  float acc[kGroups][kCols];
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
#pragma unroll
    for (int c = 0; c < kCols; ++c) acc[g][c] = 0.0f;
  }
  for (int64_t k0 = 0; k0 < k; k0 += kChunk) {
    const int64_t len = k - k0 < kChunk ? k - k0 : kChunk;
    __syncthreads();  // the previous chunk is consumed
    if (vec && threadIdx.x < kCols && col0 + threadIdx.x < n && k0 + kChunk < k) {
      // The next chunk of this block's weight rows into L2 (a hint: 16-byte multiples, aligned).
      const int64_t next = k - k0 - kChunk < kChunk ? k - k0 - kChunk : kChunk;
      const char* p = static_cast<const char*>(wb) + (threadIdx.x * k + k0 + kChunk) * elem;
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(static_cast<uint32_t>(next * elem))
                   : "memory");
    }
    StageChunk(wb, bf16, vec, k, k0, len, kCols, n - col0, ws);
#pragma unroll
    for (int g = 0; g < kGroups; ++g) {
      if (g * kGroup >= m) break;  // the same for the whole block
      if (g > 0) __syncthreads();  // the previous group's x is consumed
      StageChunk(x + g * kGroup * k, false, x_vec, k, k0, len, kGroup, m - g * kGroup, xs);
      __syncthreads();
      if (g * kGroup + warp < m) {
        for (int64_t i = lane; i < len; i += 32) {
          const float xv = xs[warp][i];
#pragma unroll
          for (int c = 0; c < kCols; ++c) acc[g][c] += xv * ws[c][i];
        }
      }
    }
  }
#pragma unroll
  for (int g = 0; g < kGroups; ++g) {
    const int64_t row = g * kGroup + warp;
    if (g * kGroup >= m) break;
#pragma unroll
    for (int c = 0; c < kCols; ++c) {
      float v = acc[g][c];
      for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
      if (lane == 0 && row < m && col0 + c < n) y[row * n + col0 + c] = v;
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
  // vec: 16-byte aligned rows, so float4 staging and the L2 prefetch (BF16: element-wise, no hint).
  const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0 && !w_bf16;
  const bool x_vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  const int64_t blocks = (n + kCols - 1) / kCols;
  GemvKernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(x, x_vec, w, w_bf16, vec, y, m, n, k);
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
