// GEMM kernels for few rows and for BF16-held weights, F32 accumulation (kernels.h): BF16 weights
// are the checkpoint's own values, so results equal the F32-weight path up to summation order.
// Few rows (decode, and decode batches) with F32-held weights, and the router held BF16 as stored:
// Gemv, a warp-per-column dot product order on the FP32 cores, row-invariant (other BF16-held
// weights go to decode_gemm.cu's tensor-core kernel, which reads the weight once for all rows).
// Many rows (prefill): BF16 weights are widened to F32 chunk by chunk for cuBLAS.
#include "kimirt/backend/cuda/kernels.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/dynamic_smem.cuh"
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
// The general kernel (GemvKernel): rows or x not 16-byte aligned.
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

// The staged kernel (GemvStagedKernel): weight rows (F32, or BF16 staged as they lie: K3's router
// as stored) and x rows 16-byte aligned, the router's case. Why a second kernel (issue 12):
// GemvKernel ran the router at 12 µs for 2.4 MB (Kimi-Linear-48B, batch 1; ~0.5 µs of HBM) and
// 46 µs at batch 32: 64 blocks, each
// chunk's weight a dependent round trip through registers, a __syncthreads per chunk and per
// 8-row group, one warp of eight computing at m ≤ 8, and a plain launch.
//
// A block takes `cols` output columns (weight rows) and `rows` rows of x (all m, or a slice of
// 8-row groups at large m: PlanStaged), about one block per multiprocessor. k goes in chunks of
// `chunk` (a multiple of 32): kStages chunks of the block's weight rows and x rows in shared
// memory, copied by cp.async (nothing held in registers while in flight) kStages − 1 chunks ahead
// of the one being summed, one __syncthreads a chunk. The weight is never the previous kernel's
// output, so before PdlWait the block asks L2 for all of its weight rows
// (cp.async.bulk.prefetch.L2) and copies its first chunks of them; x only after PdlWait.
//
// The sum's order is GemvKernel's: lane j of a warp sums x[k]·w[k] for k ≡ j (mod 32) ascending,
// across the chunks, in one accumulator, one FMA a term (`acc += xv * w` as nvcc compiles it),
// then the butterfly v += shfl_xor(v, 16, 8, 4, 2, 1). A warp sums a tile of kR rows × kC
// columns at once (each x and w value loaded once for the tile), so every (row, column) has
// GemvKernel's bits — the router's logits and choices unchanged — and a row's bits depend on
// nothing but its x and w: not on m, the other rows, the tile or the plan, which only decide who
// computes what (row-invariant: Backend::RowInvariantRows).
constexpr int kStagedWarps = 8;
constexpr int kStagedThreads = kStagedWarps * 32;
constexpr int kItemsPerWarp = 2;     // tiles a warp sums at once (accumulators: 2 · kR · kC)
constexpr int kMaxItems = kItemsPerWarp * kStagedWarps;
constexpr int kStages = 3;           // chunks in shared memory: one summed, two in flight
constexpr int64_t kMaxChunk = 1024;  // F32 k per chunk at most (m = 1, K3: 7 chunks); BF16 twice
constexpr int64_t kStagedSmemBudget = 192 * 1024;
// About one block per H200 multiprocessor. A constant, not the device's count: the plan changes
// only the work's split, never a bit, but a fixed plan keeps runs comparable across GPUs.
constexpr int64_t kTargetBlocks = 132;
constexpr int64_t kPrefetchBytes = 4096;  // a cp.async.bulk.prefetch.L2

// The chunk [k0, k0 + len) of `count` rows (row r at src + r·k) into dst (row r at dst + r·chunk),
// 16 bytes a copy; len a multiple of 16 bytes' elements, src rows 16-byte aligned.
template <typename T>
__device__ __forceinline__ void CopyChunk(const T* src, int64_t k, int64_t k0, int64_t len, int count, T* dst,
                                          int chunk) {
  constexpr int64_t kPer = 16 / sizeof(T);
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t q16 = len / kPer;
  for (int r = warp; r < count; r += kStagedWarps) {
    const T* s = src + r * k + k0;
    T* d = dst + static_cast<int64_t>(r) * chunk;
    for (int64_t q = lane; q < q16; q += 32) CpAsync16(d + kPer * q, s + kPer * q);
  }
}

// A staged weight value as F32: F32 as held, BF16 widened (exact: the F32 it stands for).
__device__ __forceinline__ float StagedWeight(const float* p) { return *p; }
__device__ __forceinline__ float StagedWeight(const uint16_t* p) { return __uint_as_float(uint32_t{*p} << 16); }

// The bytes of one stage's slot: w [cols][chunk] (TW), then x [rows][chunk] (F32); 16-byte
// multiples, since chunk is a multiple of 32.
template <typename TW>
__host__ __device__ constexpr int64_t StagedSlotBytes(int64_t cols, int64_t rows, int64_t chunk) {
  return cols * chunk * static_cast<int64_t>(sizeof(TW)) + rows * chunk * static_cast<int64_t>(sizeof(float));
}

// Block (blockIdx.x, blockIdx.y): columns [blockIdx.x · cols, + cols) of rows [blockIdx.y · rows,
// + rows) of y [m, n]. TW: the weight as held, F32 or BF16 (uint16_t; staged as it lies, half the
// bytes, and widened as it is read: the same F32 values in the same sums, so the same bits).
template <typename TW, int kR, int kC>
__global__ void __launch_bounds__(kStagedThreads, 1)
    GemvStagedKernel(const float* __restrict__ x, const TW* __restrict__ w, float* __restrict__ y, int m,
                     int64_t n, int64_t k, int rows, int cols, int chunk) {
  extern __shared__ __align__(16) uint8_t staged_smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
  const int64_t col0 = int64_t{blockIdx.x} * cols, row_begin = int64_t{blockIdx.y} * rows;
  const int cv = static_cast<int>(n - col0 < cols ? n - col0 : cols);  // this block's columns and rows
  const int rv = static_cast<int>(m - row_begin < rows ? m - row_begin : rows);
  const TW* wb = w + col0 * k;
  const float* xb = x + row_begin * k;
  const int64_t slot = StagedSlotBytes<TW>(cols, rows, chunk);
  const int64_t chunks = (k + chunk - 1) / chunk;
  auto w_slot = [&](int64_t c) { return reinterpret_cast<TW*>(staged_smem + c % kStages * slot); };
  auto x_slot = [&](int64_t c) {
    return reinterpret_cast<float*>(staged_smem + c % kStages * slot + int64_t{cols} * chunk * int64_t{sizeof(TW)});
  };
  auto len_of = [&](int64_t c) { return k - c * chunk < chunk ? k - c * chunk : int64_t{chunk}; };
  auto copy_w = [&](int64_t c) {
    if (c < chunks) CopyChunk(wb, k, c * chunk, len_of(c), cv, w_slot(c), chunk);
  };
  auto copy_x = [&](int64_t c) {
    if (c < chunks) CopyChunk(xb, k, c * chunk, len_of(c), rv, x_slot(c), chunk);
  };

  // Before PdlWait (pdl.cuh): only the weight. All of it past the first kStages − 1 chunks into
  // L2, 4 KB a request; the first chunks into shared memory.
  constexpr int64_t kPiece = kPrefetchBytes / sizeof(TW);
  const int64_t ahead = (kStages - 1) * int64_t{chunk};
  const int64_t pieces = k > ahead ? (k - ahead + kPiece - 1) / kPiece : 0;
  for (int64_t i = threadIdx.x; i < cv * pieces; i += kStagedThreads) {
    const int64_t r = i / pieces, b = ahead + i % pieces * kPiece;
    const int64_t len = k - b < kPiece ? k - b : kPiece;
    mma::PrefetchL2(wb + r * k + b, static_cast<uint32_t>(len * sizeof(TW)));
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

  // This warp's tiles (items warp and warp + 8): columns c0 + [0, kC), rows r0 + [0, kR), those
  // past the block's clamped to its last (they repeat a valid sum and store nothing).
  const int col_tiles = (cv + kC - 1) / kC;
  const int items = col_tiles * ((rv + kR - 1) / kR);
  int c0[kItemsPerWarp], r0[kItemsPerWarp];
#pragma unroll
  for (int i = 0; i < kItemsPerWarp; ++i) {
    const int item = warp + i * kStagedWarps;
    c0[i] = item % col_tiles * kC;
    r0[i] = item / col_tiles * kR;
  }
  float acc[kItemsPerWarp][kR][kC];
#pragma unroll
  for (int i = 0; i < kItemsPerWarp; ++i) {
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int c = 0; c < kC; ++c) acc[i][r][c] = 0.0f;
    }
  }

  for (int64_t ch = 0; ch < chunks; ++ch) {
    CpAsyncWait<kStages - 2>();  // chunk ch has landed (the kStages − 2 newer groups may be in flight)
    __syncthreads();             // ... for every thread's copies; and chunk ch − 1's slot is free
    copy_w(ch + kStages - 1);
    copy_x(ch + kStages - 1);
    CpAsyncCommit();
    const TW* ws = w_slot(ch);
    const float* xs = x_slot(ch);
    const int len = static_cast<int>(len_of(ch));
#pragma unroll
    for (int i = 0; i < kItemsPerWarp; ++i) {
      if (warp + i * kStagedWarps >= items) break;  // the same for the whole warp
      const TW* wr[kC];
      const float* xr[kR];
#pragma unroll
      for (int c = 0; c < kC; ++c) wr[c] = ws + static_cast<int64_t>(min(c0[i] + c, cv - 1)) * chunk + lane;
#pragma unroll
      for (int r = 0; r < kR; ++r) xr[r] = xs + static_cast<int64_t>(min(r0[i] + r, rv - 1)) * chunk + lane;
      // k = k0 + s + lane, s ascending; one FMA a term (nvcc contracts GemvKernel's acc += xv · w
      // to FFMA; __fmaf_rn says so here).
      auto step = [&](int s) {
        float wv[kC], xv[kR];
#pragma unroll
        for (int c = 0; c < kC; ++c) wv[c] = StagedWeight(wr[c] + s);
#pragma unroll
        for (int r = 0; r < kR; ++r) xv[r] = xr[r][s];
#pragma unroll
        for (int r = 0; r < kR; ++r) {
#pragma unroll
          for (int c = 0; c < kC; ++c) acc[i][r][c] = __fmaf_rn(xv[r], wv[c], acc[i][r][c]);
        }
      };
      const int full = len / 32 * 32;
#pragma unroll 2
      for (int s = 0; s < full; s += 32) step(s);
      // A last chunk no multiple of 32 long: its last step only in lanes whose k is inside, as
      // GemvKernel's lanes stop at k.
      if (full + lane < len) step(full);
    }
  }
  CpAsyncWaitAll();  // the last groups are empty; leave nothing in flight

#pragma unroll
  for (int i = 0; i < kItemsPerWarp; ++i) {
    if (warp + i * kStagedWarps >= items) break;
#pragma unroll
    for (int r = 0; r < kR; ++r) {
#pragma unroll
      for (int c = 0; c < kC; ++c) {
        float v = acc[i][r][c];
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        if (lane == 0 && r0[i] + r < rv && c0[i] + c < cv) y[(row_begin + r0[i] + r) * n + col0 + c0[i] + c] = v;
      }
    }
  }
}

// How a call is cut: rows of x and columns a block, its tile, and the chunk that fits.
struct StagedPlan {
  int tile = 0;  // index into kTiles
  int64_t rows = 0, row_blocks = 0, cols = 0, col_blocks = 0, chunk = 0;
};
struct Tile {
  int r, c;
};
// Small tiles keep warps busy when a block has few (row, column) pairs (decode: ~7 columns, m ≤ 8);
// 8 × 8 loads 16 values for 64 FMAs, what shared memory's 128 bytes a cycle feed (batches).
constexpr Tile kTiles[] = {{1, 1}, {2, 2}, {4, 2}, {8, 2}, {8, 8}};

// The plan of least estimated time a step (32 k) per multiprocessor: the larger of a scheduler's
// issue (its share of the tiles, each kR + kC loads and kR · kC FMAs), shared memory's wavefronts
// (kR + kC a tile) and L2's (~32 bytes a cycle: 4 cycles a staged row of either operand), times
// the waves of blocks; of equal ones, the least issue and shared-memory time (at m ≤ 8 the
// weight's HBM time is the same for every plan, so the tile is what is left to choose). Rows split
// into 8-row groups only past 8 rows: a slice of the rows per block trades re-reading the weight
// from L2 for reading less of x (at m = 64 and K3's k, x is 1.8 MB a block). Estimates, not
// measurements: the plan moves time, never bits.
StagedPlan PlanStaged(int64_t m, int64_t n, int64_t k, int64_t w_bytes = sizeof(float)) {
  StagedPlan best;
  int64_t best_cost = -1, best_compute = 0;
  for (int64_t rows = m <= 8 ? m : 8;; rows += 8) {
    if (rows > m) rows = m;
    const int64_t row_blocks = (m + rows - 1) / rows;
    for (int t = 0; t < static_cast<int>(sizeof(kTiles) / sizeof(kTiles[0])); ++t) {
      const Tile tile = kTiles[t];
      const int64_t row_tiles = (rows + tile.r - 1) / tile.r;
      if (row_tiles > kMaxItems) continue;
      const int64_t max_cols = tile.c * (kMaxItems / row_tiles);
      const int64_t cols = std::min((n * row_blocks + kTargetBlocks - 1) / kTargetBlocks, max_cols);
      const int64_t col_blocks = (n + cols - 1) / cols;
      const int64_t items = row_tiles * ((cols + tile.c - 1) / tile.c);
      const int64_t issue = (items + 3) / 4 * (tile.r + tile.c + tile.r * tile.c + 3);
      const int64_t lds = items * (tile.r + tile.c);
      const int64_t l2 = 4 * (rows + cols);
      const int64_t waves = (col_blocks * row_blocks + kTargetBlocks - 1) / kTargetBlocks;
      const int64_t cost = waves * std::max({issue, lds, l2}), compute = waves * std::max(issue, lds);
      if (best_cost < 0 || cost < best_cost || (cost == best_cost && compute < best_compute)) {
        best_cost = cost;
        best_compute = compute;
        best.tile = t;
        best.rows = rows;
        best.row_blocks = row_blocks;
        best.cols = cols;
        best.col_blocks = col_blocks;
      }
    }
    if (rows == m) break;
  }
  // The largest chunk (a multiple of 32, ≤ kMaxChunk's bytes of weight a row, no longer than k
  // needs) whose kStages slots fit in half the budget, so that under PDL the block starts beside a
  // predecessor holding shared memory; the whole budget where that would leave chunks under 256.
  // BF16 weights (w_bytes 2) take chunks of up to twice the k: the same bytes a chunk, half the
  // chunks, each a wait and a barrier (at the same chunks K3's router took 14.7 µs as stored and
  // 15.0 widened, moe_bench on one H100: the chunk count, not the bytes, set its time).
  const int64_t row_bytes = kStages * (best.cols * w_bytes + best.rows * int64_t{sizeof(float)});
  const int64_t half = kStagedSmemBudget / 2 / row_bytes / 32 * 32;
  const int64_t fit = half >= 256 ? half : kStagedSmemBudget / row_bytes / 32 * 32;
  best.chunk = std::min({fit, kMaxChunk * int64_t{sizeof(float)} / w_bytes, (k + 31) / 32 * 32});
  return best;
}

template <typename TW, int kR, int kC>
void LaunchStaged(const float* x, const TW* w, float* y, int64_t m, int64_t n, int64_t k, const StagedPlan& p,
                  cudaStream_t s) {
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(GemvStagedKernel<TW, kR, kC>, kStagedSmemBudget, false, "Gemv", &configured);
  LaunchPdl("Gemv", GemvStagedKernel<TW, kR, kC>,
            dim3(static_cast<unsigned>(p.col_blocks), static_cast<unsigned>(p.row_blocks)), dim3(kStagedThreads),
            static_cast<size_t>(kStages * StagedSlotBytes<TW>(p.cols, p.rows, p.chunk)), s, x, w, y,
            static_cast<int>(m), n, k, static_cast<int>(p.rows), static_cast<int>(p.cols), static_cast<int>(p.chunk));
}

// The plan decides only who computes what and in which chunks, never a bit.
template <typename TW>
void LaunchStagedPlan(const float* x, const TW* w, float* y, int64_t m, int64_t n, int64_t k, cudaStream_t s) {
  const StagedPlan p = PlanStaged(m, n, k, sizeof(TW));
  static_assert(sizeof(kTiles) / sizeof(kTiles[0]) == 5, "a launch for every tile");
  switch (p.tile) {
    case 0: LaunchStaged<TW, kTiles[0].r, kTiles[0].c>(x, w, y, m, n, k, p, s); break;
    case 1: LaunchStaged<TW, kTiles[1].r, kTiles[1].c>(x, w, y, m, n, k, p, s); break;
    case 2: LaunchStaged<TW, kTiles[2].r, kTiles[2].c>(x, w, y, m, n, k, p, s); break;
    case 3: LaunchStaged<TW, kTiles[3].r, kTiles[3].c>(x, w, y, m, n, k, p, s); break;
    default: LaunchStaged<TW, kTiles[4].r, kTiles[4].c>(x, w, y, m, n, k, p, s); break;
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
  // The staged kernel (the same bits: its comment) where x's and w's rows are 16-byte aligned:
  // F32 weights, or BF16 ones staged as they lie (K3's router as stored: half the bytes).
  const bool w_aligned = reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const bool x_vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  if (x_vec && w_aligned && k > 0 && k % (w_bf16 ? 8 : 4) == 0) {
    if (w_bf16) {
      LaunchStagedPlan(x, static_cast<const uint16_t*>(w), y, m, n, k, s);
    } else {
      LaunchStagedPlan(x, static_cast<const float*>(w), y, m, n, k, s);
    }
    return;
  }
  // vec: float4 staging and the L2 prefetch (BF16: element-wise, no hint).
  const bool vec = k % 4 == 0 && w_aligned && !w_bf16;
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
