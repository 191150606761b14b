// GEMM kernels for few rows and for BF16-held weights, F32 accumulation (kernels.h): BF16 weights
// are the checkpoint's own values, so results equal the F32-weight path up to summation order.
// Few rows (decode, and decode batches) with F32-held weights: Gemv, a warp-per-column dot
// product order on the FP32 cores, row-invariant (BF16-held weights go to decode_gemm.cu's tensor-core kernel,
// which reads the weight once for all rows). Many rows (prefill): BF16 weights are widened to F32
// chunk by chunk for cuBLAS.
#include "kimirt/backend/cuda/kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/mma_bf16.cuh"
#include "kimirt/backend/cuda/pdl.cuh"

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
// The general kernel (GemvKernel): BF16-held weights, and rows or x not 16-byte aligned.
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
      mma::PrefetchL2(p, static_cast<uint32_t>(next * elem));
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

// The staged kernel (GemvStagedKernel): F32 weight rows and x rows 16-byte aligned (k % 4 == 0),
// the router's case. Why a second kernel (issue 12): GemvKernel ran the router at 12 µs for
// 2.4 MB (Kimi-Linear-48B, batch 1; ~0.5 µs of HBM) and 46 µs at batch 32: 64 blocks, each
// chunk's weight a dependent round trip through registers, a __syncthreads per chunk and per
// 8-row group, one warp of eight computing at m ≤ 8, and a plain launch.
//
// A block takes `cols` output columns (weight rows) for all m rows; `cols` is ceil(n / 132), so
// there is about one block per multiprocessor (K3: 896 experts → 7 columns, 128 blocks; 48B:
// 256 → 2, 128 blocks). k goes in chunks of `chunk` (a multiple of 32), kStages chunks of the
// block's weight rows and of x in shared memory, copied by cp.async (nothing held in registers
// while in flight) kStages − 1 chunks ahead of the one being summed, one __syncthreads a chunk.
// The weight is never the previous kernel's output, so before PdlWait the block asks L2 for all
// of its weight rows (cp.async.bulk.prefetch.L2) and copies its first chunks of them; x only
// after PdlWait. x is read once per block (at m = 64 and K3's k that is 1.8 MB a block from
// L2, against the old 8-row passes per 1,024-k chunk).
//
// The sum's order is GemvKernel's: a warp is four octets of eight threads; octet o sums one
// column, thread t of it keeps the accumulators of "lane" residues j = 4t .. 4t + 3, i.e. of k ≡ j
// (mod 32), ascending over the chunks, one FMA per k as `acc += xv * w` compiles; the butterfly
// over j's bits 4, 3, 2 is a shuffle across the octet's threads (xor 4, 2, 1), over bits 1 and 0
// an add of the thread's own accumulators in the same pairing. So every (row, column) has
// GemvKernel's bits (the router's logits and choices unchanged), and a row's bits do not depend on
// m, on the other rows or on `cols`/`chunk`/kRows, which change only who computes what.
// Items: an item is (a 4-column group, kRows rows); warp w sums items w and w + 8.
constexpr int kStagedWarps = 8;
constexpr int kStagedThreads = kStagedWarps * 32;
constexpr int kOctetCols = 4;        // columns per item: an octet each
constexpr int kItemsPerWarp = 2;     // accumulators per thread: kItemsPerWarp · kRows · 4
constexpr int kStages = 3;           // chunks in shared memory: one summed, two in flight
constexpr int64_t kMaxChunk = 1024;  // k per chunk at most (at m = 1, K3: 7 chunks, 96 KB)
constexpr size_t kStagedSmemBudget = 192 * 1024;
// About one block per H200 multiprocessor. A constant, not the device's count: cols changes only
// the work's split, never a bit, but a fixed plan keeps runs comparable across GPUs.
constexpr int64_t kTargetBlocks = 132;
constexpr int64_t kPrefetchFloats = 1024;  // 4 KB a cp.async.bulk.prefetch.L2

// The chunk [k0, k0 + len) of `rows` rows (row r at src + r·k) into dst (row r at dst + r·chunk),
// 16 bytes a copy; len % 4 == 0, src rows 16-byte aligned.
__device__ __forceinline__ void CopyChunk(const float* src, int64_t k, int64_t k0, int64_t len, int rows,
                                          float* dst, int chunk) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t q4 = len / 4;
  for (int r = warp; r < rows; r += kStagedWarps) {
    const float* s = src + r * k + k0;
    float* d = dst + static_cast<int64_t>(r) * chunk;
    for (int64_t q = lane; q < q4; q += 32) CpAsync16(d + 4 * q, s + 4 * q);
  }
}

template <int kRows>
__global__ void __launch_bounds__(kStagedThreads, 1) GemvStagedKernel(const float* __restrict__ x,
                                                                  const float* __restrict__ w, float* __restrict__ y,
                                                                  int m, int64_t n, int64_t k, int cols, int chunk) {
  extern __shared__ __align__(16) float smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t col0 = int64_t{blockIdx.x} * cols;
  const int cv = static_cast<int>(n - col0 < cols ? n - col0 : cols);  // this block's columns
  const float* wb = w + col0 * k;
  const int64_t slot = static_cast<int64_t>(cols + m) * chunk;  // w rows [cols][chunk], then x [m][chunk]
  const int64_t chunks = (k + chunk - 1) / chunk;
  auto len_of = [&](int64_t c) { return k - c * chunk < chunk ? k - c * chunk : int64_t{chunk}; };
  auto copy_w = [&](int64_t c) {
    if (c < chunks) CopyChunk(wb, k, c * chunk, len_of(c), cv, smem + c % kStages * slot, chunk);
  };
  auto copy_x = [&](int64_t c) {
    if (c < chunks) CopyChunk(x, k, c * chunk, len_of(c), m, smem + c % kStages * slot + int64_t{cols} * chunk, chunk);
  };

  // Before PdlWait (pdl.cuh): only the weight. All of it past the first kStages − 1 chunks into
  // L2, 4 KB a request; the first chunks into shared memory.
  const int64_t ahead = (kStages - 1) * int64_t{chunk};
  const int64_t pieces = k > ahead ? (k - ahead + kPrefetchFloats - 1) / kPrefetchFloats : 0;
  for (int64_t i = threadIdx.x; i < cv * pieces; i += kStagedThreads) {
    const int64_t r = i / pieces, b = ahead + i % pieces * kPrefetchFloats;
    const int64_t len = k - b < kPrefetchFloats ? k - b : kPrefetchFloats;
    mma::PrefetchL2(wb + r * k + b, static_cast<uint32_t>(len * sizeof(float)));
  }
  for (int c = 0; c < kStages - 1; ++c) {
    copy_w(c);
    CpAsyncCommit();
  }
  PdlWait();
  PdlTrigger();
  for (int c = 0; c < kStages - 1; ++c) {
    copy_x(c);
    CpAsyncCommit();
  }

  // This warp's items: the column and rows of each (clamped into range: a clamped lane repeats a
  // valid one's work and stores nothing).
  const int octet = lane / 8, t = lane & 7;
  const int groups = (cv + kOctetCols - 1) / kOctetCols;
  const int items = groups * ((m + kRows - 1) / kRows);
  int col[kItemsPerWarp], row0[kItemsPerWarp];
#pragma unroll
  for (int i = 0; i < kItemsPerWarp; ++i) {
    const int item = warp + i * kStagedWarps;
    const int c = item % groups * kOctetCols + octet;
    col[i] = c < cv ? c : cv - 1;
    row0[i] = item / groups * kRows;
  }
  float acc[kItemsPerWarp][kRows][4];
#pragma unroll
  for (int i = 0; i < kItemsPerWarp; ++i) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][r][e] = 0.0f;
    }
  }

  for (int64_t c = 0; c < chunks; ++c) {
    CpAsyncWait<kStages - 2>();  // chunk c has landed (the kStages − 2 newer groups may be in flight)
    __syncthreads();             // ... for every thread's copies; and chunk c − 1's slot is free
    copy_w(c + kStages - 1);
    copy_x(c + kStages - 1);
    CpAsyncCommit();
    const float* ws = smem + c % kStages * slot;
    const float* xs = ws + int64_t{cols} * chunk;
    const int len = static_cast<int>(len_of(c));
#pragma unroll
    for (int i = 0; i < kItemsPerWarp; ++i) {
      if (warp + i * kStagedWarps >= items) break;  // the same for the whole warp
      const float* wr = ws + static_cast<int64_t>(col[i]) * chunk + 4 * t;
      const float* xr[kRows];
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        const int row = row0[i] + r < m ? row0[i] + r : m - 1;
        xr[r] = xs + static_cast<int64_t>(row) * chunk + 4 * t;
      }
      // k = k0 + s + 4t + e: residue 4t + e, s ascending. The acc += xv · w of GemvKernel, as one
      // FMA (nvcc contracts it to FFMA there; __fmaf_rn says so here).
      auto step = [&](int s) {
        const float4 wv = *reinterpret_cast<const float4*>(wr + s);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float4 xv = *reinterpret_cast<const float4*>(xr[r] + s);
          acc[i][r][0] = __fmaf_rn(xv.x, wv.x, acc[i][r][0]);
          acc[i][r][1] = __fmaf_rn(xv.y, wv.y, acc[i][r][1]);
          acc[i][r][2] = __fmaf_rn(xv.z, wv.z, acc[i][r][2]);
          acc[i][r][3] = __fmaf_rn(xv.w, wv.w, acc[i][r][3]);
        }
      };
      const int full = len / 32 * 32;
#pragma unroll 4
      for (int s = 0; s < full; s += 32) step(s);
      // A last chunk no multiple of 32 long: its last step only where k < its end (len % 4 == 0,
      // so a thread's four k are all in or all out), as GemvKernel's lanes past k stop.
      if (full + 4 * t < len) step(full);
    }
  }
  CpAsyncWaitAll();  // nothing is left in flight (the last groups are empty), but leave none behind

  // The butterfly v += shfl_xor(v, 16, 8, 4, 2, 1) of "lane" j = 4t + e: bits 4, 3, 2 of j are
  // bits 2, 1, 0 of t (xor 4, 2, 1 across the octet), then bits 1 and 0 are e's: lane 0's
  // (v0 + v2) + (v1 + v3).
#pragma unroll
  for (int i = 0; i < kItemsPerWarp; ++i) {
    const int item = warp + i * kStagedWarps;
    if (item >= items) break;
    const int c = item % groups * kOctetCols + octet;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      float v[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v[e] = acc[i][r][e];
        for (int off = 4; off > 0; off >>= 1) v[e] += __shfl_xor_sync(0xffffffffu, v[e], off);
      }
      const float sum = (v[0] + v[2]) + (v[1] + v[3]);
      const int row = row0[i] + r;
      if (t == 0 && c < cv && row < m) y[static_cast<int64_t>(row) * n + col0 + c] = sum;
    }
  }
}

template <int kRows>
void LaunchStaged(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  static bool configured = false;  // the attribute is per function; setting it again is harmless
  if (!configured) {
    const cudaError_t e = cudaFuncSetAttribute(GemvStagedKernel<kRows>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(kStagedSmemBudget));
    if (e != cudaSuccess) {
      std::fprintf(stderr, "kimirt: Gemv: cudaFuncSetAttribute: %s\n", cudaGetErrorString(e));
      std::abort();
    }
    configured = true;
  }
  // Columns a block: about one block a multiprocessor, at most what kItemsPerWarp items a warp cover.
  const int64_t row_groups = (m + kRows - 1) / kRows;
  const int64_t max_cols = kOctetCols * (kItemsPerWarp * kStagedWarps / row_groups);
  const int64_t cols = std::min((n + kTargetBlocks - 1) / kTargetBlocks, max_cols);
  // The largest chunk (a multiple of 32, ≤ kMaxChunk, no longer than k needs) whose kStages slots fit.
  const int64_t fit = static_cast<int64_t>(kStagedSmemBudget / (kStages * (cols + m) * sizeof(float))) / 32 * 32;
  const int64_t chunk = std::min({fit, kMaxChunk, (k + 31) / 32 * 32});
  const size_t smem = static_cast<size_t>(kStages * (cols + m) * chunk) * sizeof(float);
  const int64_t blocks = (n + cols - 1) / cols;
  LaunchPdl("Gemv", GemvStagedKernel<kRows>, dim3(static_cast<unsigned>(blocks)), dim3(kStagedThreads), smem, s, x, w,
            y, static_cast<int>(m), n, k, static_cast<int>(cols), static_cast<int>(chunk));
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
  if (vec && x_vec && k > 0) {  // the staged kernel, the same bits (its comment); kRows: rows an item
    const float* wf = static_cast<const float*>(w);
    if (m == 1) {
      LaunchStaged<1>(x, wf, y, m, n, k, s);
    } else if (m == 2) {
      LaunchStaged<2>(x, wf, y, m, n, k, s);
    } else if (m <= 4) {
      LaunchStaged<4>(x, wf, y, m, n, k, s);
    } else {
      LaunchStaged<8>(x, wf, y, m, n, k, s);
    }
    return;
  }
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
