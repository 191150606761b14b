// Causal softmax attention for MLA on CUDA (kernels.h; spec §6.4, §6.6).
//
// One block per (token, head). Positions go by in tiles of kTile: each thread scores one
// position of the tile, the block takes the tile's max and rescales its running sums (the
// online softmax), then each thread accumulates its share of the value dims over the tile in
// position order. Every sum has a fixed order, so results are deterministic; they differ from
// the CPU reference (one softmax over all scores) only by rounding. The per-head part of the
// key and the value are read through strides, which lets one kernel serve both forms:
//   expanded: key = [W_UK c_s ‖ k_s], value = W_UV c_s, from one kv_b projection of the cache;
//   absorbed: key = [c_s ‖ k_s], value = c_s, with the query absorbed beforehand (AbsorbQuery)
//             and the output expanded afterwards (AbsorbOutput).
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kTile = 128;  // = threads per block

__device__ __forceinline__ float WarpMaxAll(float v) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  return v;
}
constexpr int kValuesPerThread = static_cast<int>(kAttentionMaxValueDim / kTile);

__global__ void CausalAttentionKernel(AttentionArgs a) {
  extern __shared__ float qs[];  // the query, da + db
  __shared__ float scratch[33];
  __shared__ float p[kTile];
  const int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H;
  const int64_t dq = a.da + a.db;
  const float* q = a.q + t * a.q_t + h * a.q_h;
  for (int64_t i = threadIdx.x; i < dq; i += blockDim.x) qs[i] = q[i];
  __syncthreads();
  const int64_t len = a.start + t + 1;
  float m = -INFINITY, l = 0.0f;
  float acc[kValuesPerThread];
  for (int i = 0; i < kValuesPerThread; ++i) acc[i] = 0.0f;
  for (int64_t s0 = 0; s0 < len; s0 += kTile) {
    const int64_t s = s0 + threadIdx.x;
    float score = -INFINITY;
    if (s < len) {
      const float* ka = a.ka + s * a.ka_s + h * a.ka_h;
      float dot = 0.0f;
      for (int64_t i = 0; i < a.da; ++i) dot += qs[i] * ka[i];
      const float* kb = a.kb + s * a.kb_s;
      for (int64_t i = 0; i < a.db; ++i) dot += qs[a.da + i] * kb[i];
      score = a.scale * dot;
    }
    const float m_new = fmaxf(m, BlockMax(score, scratch));  // finite: the tile has a position
    const float e = s < len ? expf(score - m_new) : 0.0f;
    p[threadIdx.x] = e;
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * correction + BlockSum(e, scratch);  // BlockSum's barriers also publish p[]
    const int64_t n = len - s0 < kTile ? len - s0 : kTile;
#pragma unroll
    for (int r = 0; r < kValuesPerThread; ++r) {  // unrolled: acc stays in registers
      const int64_t dim = threadIdx.x + int64_t{r} * kTile;
      if (dim < a.dv) {
        float sum = acc[r] * correction;
        for (int64_t j = 0; j < n; ++j) sum += p[j] * a.v[(s0 + j) * a.v_s + h * a.v_h + dim];
        acc[r] = sum;
      }
    }
    m = m_new;
    __syncthreads();  // p[] is rewritten by the next tile
  }
  float* o = a.o + t * a.o_t + h * a.o_h;
  const float inv = 1.0f / l;
#pragma unroll
  for (int r = 0; r < kValuesPerThread; ++r) {
    const int64_t dim = threadIdx.x + int64_t{r} * kTile;
    if (dim < a.dv) o[dim] = acc[r] * inv;
  }
}

// The absorb GEMVs (spec §6.6) read each head's [dn | dv, r] slice of kv_b once per call for
// every row, spread over many blocks; a row's sums have one fixed order whatever the other
// rows, so rows stay batch-invariant. Rows go in chunks of kAbsorbRows (registers).
constexpr int kAbsorbRows = 8;
constexpr int kAbsorbCols = 64;    // AbsorbQuery: latent columns per block, one per thread
constexpr int kAbsorbSplit = 4;    // AbsorbQuery: dn split over this many thread groups
constexpr int kAbsorbOutWarps = 8;  // AbsorbOutput: output dims per block, one per warp
constexpr int kAbsorbMaxLatent = static_cast<int>(kMlaDecodeMaxLatent);

// The 16-byte kernels below deal the rows' chunks over grid z as well (AbsorbChunkBlocks): a chunk's
// sums are the same code whichever block runs it, so the bits do not move; one block walking all
// of a batch's chunks in turn made the two GEMVs grow with the batch (Nsight Compute, 2-layer
// Kimi-Linear-48B on an H100: 5.2 and 5.4 µs at batch 1, 25.0 and 47.9 at batch 32, where the
// weights they read are the same 4.25 MB). Each block reads its weights again: from L2, since
// the chunks' blocks run together.
constexpr int64_t kAbsorbMaxChunkBlocks = 64;
unsigned AbsorbChunkBlocks(int64_t T) {
  return static_cast<unsigned>(std::clamp<int64_t>((T + kAbsorbRows - 1) / kAbsorbRows, 1, kAbsorbMaxChunkBlocks));
}

// The absorb kernels' shared steps. q_s of head h, rows t0 .. t1 − 1, copied after qc's r columns.
__device__ __forceinline__ void CopyRope(const float* q, int64_t t0, int64_t t1, int64_t H, int64_t dn, int64_t dr,
                                         int64_t r, int64_t h, float* qc) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t i = threadIdx.x; i < dr; i += blockDim.x) qc[(t * H + h) * (r + dr) + r + i] = q[(t * H + h) * (dn + dr) + dn + i];
  }
}
// ō of head h, rows t0 .. t0 + rows − 1, into shared memory (the block's threads strided; a row's
// elements in 32-bit index math: no 64-bit division an element).
__device__ __forceinline__ void StageRows(const float* o_bar, int64_t t0, int rows, int64_t H, int64_t h, int64_t r,
                                          float (*ob)[kAbsorbMaxLatent]) {
  for (int b = 0; b < rows; ++b) {
    const float* src = o_bar + ((t0 + b) * H + h) * r;
    for (int j = threadIdx.x; j < static_cast<int>(r); j += blockDim.x) ob[b][j] = src[j];
  }
}

// qc[t,h,j] = Σ_i q_n[t,h,i] W_UK,h[i,j] for j < r; then q_s copied after it. Block (h, 64
// columns): thread (g, c) sums i ≡ g (mod 4) ascending for column c, the four partial sums are
// added in g order. The weight loads of a thread are independent, so they overlap.
__global__ void __launch_bounds__(kAbsorbCols* kAbsorbSplit)
    AbsorbQueryKernel(const float* q, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r,
                      const void* w_kvb, bool bf16, float* qc) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float part[kAbsorbSplit][kAbsorbRows][kAbsorbCols];
  const int64_t h = blockIdx.x;
  const int c = threadIdx.x % kAbsorbCols, g = threadIdx.x / kAbsorbCols;
  const int64_t j = int64_t{blockIdx.y} * kAbsorbCols + c;
  const int64_t w_uk = h * (dn + dv) * r;  // element offset of W_UK,h
  for (int64_t t0 = 0; t0 < T; t0 += kAbsorbRows) {
    const int rows = static_cast<int>(T - t0 < kAbsorbRows ? T - t0 : kAbsorbRows);
    float acc[kAbsorbRows];
#pragma unroll
    for (int b = 0; b < kAbsorbRows; ++b) acc[b] = 0.0f;
    if (j < r) {
#pragma unroll 4
      for (int64_t i = g; i < dn; i += kAbsorbSplit) {
        const float w = WeightAt(w_kvb, w_uk + i * r + j, bf16);
#pragma unroll
        for (int b = 0; b < kAbsorbRows; ++b) {
          if (b < rows) acc[b] += q[((t0 + b) * H + h) * (dn + dr) + i] * w;
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kAbsorbRows; ++b) part[g][b][c] = acc[b];
    __syncthreads();
    if (g == 0 && j < r) {
      for (int b = 0; b < rows; ++b) {
        float sum = part[0][b][c];
#pragma unroll
        for (int k = 1; k < kAbsorbSplit; ++k) sum += part[k][b][c];
        qc[((t0 + b) * H + h) * (r + dr) + j] = sum;
      }
    }
    __syncthreads();
  }
  if (blockIdx.y == 0) CopyRope(q, 0, T, H, dn, dr, r, h, qc);
}

// o[t,h,i] = Σ_j W_UV,h[i,j] ō[t,h,j]. Block (h, 8 output dims), warp per dim: lane holds the
// weight row's elements j ≡ lane (mod 32) in registers, sums them ascending per row, then the
// fixed butterfly. The rows' ō go through shared memory kAbsorbRows at a time.
__global__ void __launch_bounds__(kAbsorbOutWarps * 32)
    AbsorbOutputKernel(const float* o_bar, int64_t T, int64_t H, int64_t dn, int64_t dv, int64_t r,
                       const void* w_kvb, bool bf16, float* o) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float ob[kAbsorbRows][kAbsorbMaxLatent];
  const int64_t h = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t{blockIdx.y} * kAbsorbOutWarps + warp;
  constexpr int kPerLane = kAbsorbMaxLatent / 32;
  float w[kPerLane];
  const int64_t w_uv = (h * (dn + dv) + dn) * r;  // element offset of W_UV,h
#pragma unroll
  for (int k = 0; k < kPerLane; ++k) {
    const int64_t jj = lane + 32 * k;
    w[k] = i < dv && jj < r ? WeightAt(w_kvb, w_uv + i * r + jj, bf16) : 0.0f;
  }
  for (int64_t t0 = 0; t0 < T; t0 += kAbsorbRows) {
    const int rows = static_cast<int>(T - t0 < kAbsorbRows ? T - t0 : kAbsorbRows);
    __syncthreads();  // the last chunk is consumed
    StageRows(o_bar, t0, rows, H, h, r, ob);
    __syncthreads();
    if (i >= dv) continue;
    for (int b = 0; b < rows; ++b) {
      float sum = 0.0f;
#pragma unroll
      for (int k = 0; k < kPerLane; ++k) {
        if (lane + 32 * k < r) sum += w[k] * ob[b][lane + 32 * k];
      }
      sum = WarpSum(sum);
      if (lane == 0) o[((t0 + b) * H + h) * dv + i] = sum;
    }
  }
}

// The same two GEMVs with 16-byte weight loads, for latents of a multiple of 8 (the models' 512;
// AbsorbQuery / AbsorbOutput pick them by shape alone, so a row's order never depends on T).
// Measured on an H200 (Kimi-Linear's 32 heads, BF16 kv_b, one row, Nsight Compute): the
// element-wise kernels above took 8.5 and 6.3 µs for 4.25 MB each (0.1 of HBM): 2-byte loads,
// four in flight a thread.
//
// qc[t,h,j]: block (h, 64 columns), thread (g, cg) takes columns 8cg .. 8cg + 7 and rows
// i ≡ g (mod 16) ascending (its loads independent, in flight together), the 16 partial sums
// added in g order. The nope width is a template argument (the models' 128), so a thread's rows
// are a constant count, all loaded before the sums.
constexpr int kAq8Cols = 64, kAq8Groups = 16;
template <int kDn>
__global__ void __launch_bounds__(kAq8Groups * 8)
    AbsorbQuery8Kernel(const float* q, int64_t T, int64_t H, int64_t dr, int64_t dv, int64_t r, const void* w_kvb,
                       bool bf16, float* qc) {
  static_assert(kDn % kAq8Groups == 0, "the nope dims dealt evenly");
  constexpr int kRowsPerThread = kDn / kAq8Groups;
  constexpr int64_t dn = kDn;
  __shared__ __align__(16) float part[kAq8Groups][kAbsorbRows][kAq8Cols];
  const int64_t h = blockIdx.x;
  const int cg = threadIdx.x % 8, g = threadIdx.x / 8;
  const int64_t j = int64_t{blockIdx.y} * kAq8Cols + 8 * cg;
  const int64_t w_uk = h * (dn + dv) * r;  // element offset of W_UK,h
  // The thread's weight rows, all loaded before any is used (a loop that used each as it came,
  // with run-time bounds, ran at one load latency a row), and before PdlWait: no kernel writes
  // the weights, so under PDL they stream in while the kernel ahead finishes.
  float w[kRowsPerThread][8] = {};
  if (j < r) {
#pragma unroll
    for (int k = 0; k < kRowsPerThread; ++k) Weights8At(w_kvb, w_uk + (g + k * kAq8Groups) * r + j, bf16, w[k]);
  }
  PdlWait();  // launched with LaunchPdl (pdl.cuh)
  PdlTrigger();
  for (int64_t t0 = blockIdx.z * int64_t{kAbsorbRows}; t0 < T; t0 += gridDim.z * int64_t{kAbsorbRows}) {
    const int rows = static_cast<int>(T - t0 < kAbsorbRows ? T - t0 : kAbsorbRows);
    float acc[kAbsorbRows][8] = {};
    if (j < r) {
#pragma unroll
      for (int b = 0; b < kAbsorbRows; ++b) {
        if (b < rows) {
#pragma unroll
          for (int k = 0; k < kRowsPerThread; ++k) {
            const float x = q[((t0 + b) * H + h) * (kDn + dr) + g + k * kAq8Groups];
#pragma unroll
            for (int c = 0; c < 8; ++c) acc[b][c] += x * w[k][c];
          }
        }
      }
    }
#pragma unroll
    for (int b = 0; b < kAbsorbRows; ++b) {
      float4* dst = reinterpret_cast<float4*>(&part[g][b][8 * cg]);
      dst[0] = make_float4(acc[b][0], acc[b][1], acc[b][2], acc[b][3]);
      dst[1] = make_float4(acc[b][4], acc[b][5], acc[b][6], acc[b][7]);
    }
    __syncthreads();
    for (int e = threadIdx.x; e < rows * kAq8Cols; e += blockDim.x) {
      const int b = e / kAq8Cols, col = e % kAq8Cols;
      const int64_t jj = int64_t{blockIdx.y} * kAq8Cols + col;
      if (jj >= r) continue;
      float sum = part[0][b][col];
#pragma unroll
      for (int k = 1; k < kAq8Groups; ++k) sum += part[k][b][col];
      qc[((t0 + b) * H + h) * (r + dr) + jj] = sum;
    }
    if (blockIdx.y == 0) CopyRope(q, t0, t0 + rows, H, dn, dr, r, h, qc);
    __syncthreads();
  }
}

// o[t,h,i]: block (h, 8 output dims), warp per dim; lane holds the weight row's elements
// 8·lane + 256u .. + 7 (u = 0, 1) in registers (loaded before PdlWait, as AbsorbQuery8's), sums
// them in that order per row, then the fixed butterfly. The rows' ō go through shared memory
// kAbsorbRows at a time.
__global__ void __launch_bounds__(kAbsorbOutWarps * 32)
    AbsorbOutput8Kernel(const float* o_bar, int64_t T, int64_t H, int64_t dn, int64_t dv, int64_t r,
                        const void* w_kvb, bool bf16, float* o) {
  __shared__ __align__(16) float ob[kAbsorbRows][kAbsorbMaxLatent];
  const int64_t h = blockIdx.x;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t i = int64_t{blockIdx.y} * kAbsorbOutWarps + warp;
  constexpr int kChunks = kAbsorbMaxLatent / 256;
  float w[kChunks][8] = {};
  const int64_t w_uv = (h * (dn + dv) + dn) * r;  // element offset of W_UV,h
#pragma unroll
  for (int u = 0; u < kChunks; ++u) {
    const int64_t jj = 8 * lane + 256 * u;
    if (i < dv && jj < r) Weights8At(w_kvb, w_uv + i * r + jj, bf16, w[u]);
  }
  PdlWait();  // launched with LaunchPdl (pdl.cuh); the weights above are no kernel's output
  PdlTrigger();
  for (int64_t t0 = blockIdx.z * int64_t{kAbsorbRows}; t0 < T; t0 += gridDim.z * int64_t{kAbsorbRows}) {
    const int rows = static_cast<int>(T - t0 < kAbsorbRows ? T - t0 : kAbsorbRows);
    __syncthreads();  // the last chunk is consumed
    StageRows(o_bar, t0, rows, H, h, r, ob);
    __syncthreads();
    if (i >= dv) continue;
    for (int b = 0; b < rows; ++b) {
      float sum = 0.0f;
#pragma unroll
      for (int u = 0; u < kChunks; ++u) {
        const int jj = 8 * lane + 256 * u;
        if (jj >= r) continue;
        const float4 x = *reinterpret_cast<const float4*>(&ob[b][jj]);
        const float4 y = *reinterpret_cast<const float4*>(&ob[b][jj + 4]);
        sum += w[u][0] * x.x, sum += w[u][1] * x.y, sum += w[u][2] * x.z, sum += w[u][3] * x.w;
        sum += w[u][4] * y.x, sum += w[u][5] * y.y, sum += w[u][6] * y.z, sum += w[u][7] * y.w;
      }
      sum = WarpSum(sum);
      if (lane == 0) o[((t0 + b) * H + h) * dv + i] = sum;
    }
  }
}

// --- paged absorbed decode (kernels.h MlaPagedDecode) ---

constexpr int kDecodeHeads = 8;  // heads per thread block, one warp each
constexpr int kDecodeTile = 16;  // positions staged in shared memory at a time
constexpr int kDecodeThreads = kDecodeHeads * 32;
constexpr int kDecodeMaxRow = static_cast<int>(kMlaDecodeMaxLatent + kMlaDecodeMaxRope);
constexpr int kLatentPerLane = static_cast<int>(kMlaDecodeMaxLatent / 32);
constexpr int kRowPerLane = kDecodeMaxRow / 32;
constexpr int kTileLoads = (kDecodeTile * kDecodeMaxRow + kDecodeThreads - 1) / kDecodeThreads;
// Splits: at least kMinSplit positions (two tensor-core tiles: a short context still spreads over
// a few blocks), at most kMaxSplits per sequence (bounds the scratch).
constexpr int64_t kMinSplit = 64, kMaxSplits = 256;
// The splits a sequence of `context` positions takes at most: 64, and 128 from 32K positions on,
// where the ring2 split (two blocks an SM) makes the extra blocks pay: measured on one H200, batch
// 1, BF16, 32 heads (docs/cuda.md "MLA decode on tensor cores",
// bench/results/2026-12-01-h200-mla-decode-ring4-ring2-splits*.json): 32K 66.2 µs
// at 64 (ring4) → 63.5 at 128 (ring2), 128K 171 → 133; below 32K 128 splits were slower (8K:
// 35.6 → 42.7). A function of the context alone (batch invariance). KIMIRT_MLA_DECODE_SPLITS
// (1..256), for trials, sets one bound for every context; read once a process, so every step of a
// run uses the same schedule.
constexpr int64_t kLongContext = 32768;
int64_t MaxSplits(int64_t context) {
  static const int64_t from_env = [] {
    const char* env = std::getenv("KIMIRT_MLA_DECODE_SPLITS");
    const int64_t v = env != nullptr ? std::atoll(env) : 0;
    return v >= 1 && v <= kMaxSplits ? v : int64_t{0};
  }();
  if (from_env > 0) return from_env;
  return context >= kLongContext ? 128 : 64;
}

// Element e of stored row `row` (row index over [blocks, layers, block_size]), widened to F32 as
// KvGather does.
__device__ __forceinline__ float LatentAt(const PagedDecodeArgs& a, int64_t row, int e, int w) {
  const int64_t i = row * w + e;
  if (a.kind == 0) return static_cast<const float*>(a.values)[i];
  if (a.kind == 1) return __bfloat162float(static_cast<const __nv_bfloat16*>(a.values)[i]);
  const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(a.values)[i], __NV_E4M3);
  return __half2float(__half(h)) * a.scales[row * 2 + (e < a.r ? 0 : 1)];
}


// One block per (work item = split of a sequence, group of kDecodeHeads heads); warp w owns head
// group·8 + w, its lane the query elements lane + 32k in registers. Per tile of positions staged
// in shared memory (each row read from the cache once per block): scores q̄·c + q_s·k_s (one
// lane-strided sum over the row, then the butterfly), the online-softmax rescale, and ō += p·c
// with lane owning dims lane + 32k. Writes the split's unnormalized ō and its (max, sum).
__global__ void __launch_bounds__(kDecodeThreads)
    MlaPagedDecodeSplitKernel(PagedDecodeArgs a, const float* qc, float* part_o, float* part_ml) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float tile[kDecodeTile][kDecodeMaxRow];
  const int64_t work = blockIdx.x;
  if (work >= *a.work_count) return;  // the whole block: past this step's work list
  const int64_t b = a.work[3 * work], s0 = a.work[3 * work + 1], s1 = a.work[3 * work + 2];
  const int w = static_cast<int>(a.r + a.dr), r = static_cast<int>(a.r);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t h = int64_t{blockIdx.y} * kDecodeHeads + warp;
  float qr[kRowPerLane];
#pragma unroll
  for (int k = 0; k < kRowPerLane; ++k) {
    const int e = lane + 32 * k;
    qr[k] = h < a.H && e < w ? qc[(b * a.H + h) * w + e] : 0.0f;
  }
  const int32_t* table = a.tables + a.table_begin[b];
  float m = -INFINITY, l = 0.0f;
  float acc[kLatentPerLane];
#pragma unroll
  for (int k = 0; k < kLatentPerLane; ++k) acc[k] = 0.0f;
  // The tile's rows are loaded into registers one tile ahead (all of a thread's loads issued
  // together, so their latencies overlap, and the next tile's in flight during this one's math).
  float buf[kTileLoads];
  auto load = [&](int64_t t0) {
    const int n = static_cast<int>(s1 - t0 < kDecodeTile ? s1 - t0 : kDecodeTile);
#pragma unroll
    for (int k = 0; k < kTileLoads; ++k) {
      const int idx = static_cast<int>(threadIdx.x) + k * kDecodeThreads, j = idx / w, e = idx % w;
      buf[k] = 0.0f;
      if (j < n) {
        const int64_t p = t0 + j;
        const int64_t row = (int64_t{table[p / a.block_size]} * a.layers + a.layer) * a.block_size + p % a.block_size;
        buf[k] = LatentAt(a, row, e, w);
      }
    }
  };
  load(s0);
  for (int64_t t0 = s0; t0 < s1; t0 += kDecodeTile) {
    const int n = static_cast<int>(s1 - t0 < kDecodeTile ? s1 - t0 : kDecodeTile);
    __syncthreads();  // the last tile is consumed
#pragma unroll
    for (int k = 0; k < kTileLoads; ++k) {
      const int idx = static_cast<int>(threadIdx.x) + k * kDecodeThreads, j = idx / w, e = idx % w;
      if (j < n) tile[j][e] = buf[k];
    }
    __syncthreads();
    if (t0 + kDecodeTile < s1) load(t0 + kDecodeTile);
    if (h >= a.H) continue;  // warp-uniform; the barriers above are still met
    float sc[kDecodeTile];
    float m_new = m;
#pragma unroll
    for (int j = 0; j < kDecodeTile; ++j) {
      if (j < n) {
        float dot = 0.0f;
#pragma unroll
        for (int k = 0; k < kRowPerLane; ++k) {
          if (lane + 32 * k < w) dot += qr[k] * tile[j][lane + 32 * k];
        }
        sc[j] = a.scale * WarpSum(dot);
        m_new = fmaxf(m_new, sc[j]);
      }
    }
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l *= correction;
#pragma unroll
    for (int k = 0; k < kLatentPerLane; ++k) acc[k] *= correction;
#pragma unroll
    for (int j = 0; j < kDecodeTile; ++j) {
      if (j < n) {
        const float pj = expf(sc[j] - m_new);
        l += pj;
#pragma unroll
        for (int k = 0; k < kLatentPerLane; ++k) {
          const int dim = lane + 32 * k;
          if (dim < r) acc[k] += pj * tile[j][dim];
        }
      }
    }
    m = m_new;
  }
  if (h >= a.H) return;
  float* po = part_o + (work * a.H + h) * a.r;
#pragma unroll
  for (int k = 0; k < kLatentPerLane; ++k) {
    const int dim = lane + 32 * k;
    if (dim < r) po[dim] = acc[k];
  }
  if (lane == 0) {
    part_ml[(work * a.H + h) * 2] = m;
    part_ml[(work * a.H + h) * 2 + 1] = l;
  }
}

// ō = Σ_j e^{m_j − M} ō_j / Σ_j e^{m_j − M} l_j over the sequence's splits j. Block (sequence ·
// head, 128 latent dims), 512 threads. One warp takes the split weights e^{m_j − M} into shared
// memory and the denominator (lane i sums splits i, i + 32, … ascending, then a fixed xor
// butterfly); then 4 groups of 128 threads sum each dim over splits j ≡ group (mod 4) ascending,
// and the four partials are added in group order. Every order is fixed by the split count alone
// (a function of the context: batch-invariant). Measured on an H200 at 32K context, 128 splits,
// 32 heads (Nsight Compute, base clocks): 15.3 µs with one thread summing the denominator and
// each thread walking all splits of its dim; the loads were a serial chain.
constexpr int kCombineDims = 128, kCombineGroups = 4, kCombineAhead = 16;
__global__ void __launch_bounds__(kCombineDims* kCombineGroups)
    MlaPagedDecodeCombineKernel(PagedDecodeArgs a, const float* part_o, const float* part_ml, float* o_bar) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float e[kMaxSplits];
  __shared__ float partial[kCombineGroups - 1][kCombineDims];
  __shared__ float inv_sum;
  const int64_t b = blockIdx.x / a.H, h = blockIdx.x % a.H;
  const int64_t j0 = a.split_begin[b], n = a.split_begin[b + 1] - j0;  // n <= kMaxSplits (MlaDecodeSplitLen)
  const int q = threadIdx.x / kCombineDims, d = threadIdx.x % kCombineDims;
  const int64_t dim = int64_t{blockIdx.y} * kCombineDims + d;
  const float* po = part_o + (j0 * a.H + h) * a.r + dim;
  const int64_t stride = a.H * a.r;
  // KIMIRT_MLA_L2_HINTS: the parts were stored evict-last for this read; read once, they go
  // evict-first so they do not hold L2 from the kernels after.
  const bool hinted = a.l2_hints;
  const uint64_t policy = hinted ? L2Policy(L2Hint::kEvictFirst) : 0;
  const auto part = [&](int64_t j) { return hinted ? LoadHinted(po + j * stride, policy) : po[j * stride]; };
  // This thread's first kCombineAhead parts, loaded while warp 0 works out the weights (they do
  // not need them): 32 splits all ahead, 128 (32K) half. The sum below keeps its order.
  float ahead[kCombineAhead];
#pragma unroll
  for (int i = 0; i < kCombineAhead; ++i) {
    const int64_t j = q + int64_t{i} * kCombineGroups;
    ahead[i] = dim < a.r && j < n ? part(j) : 0.0f;
  }
  if (threadIdx.x < 32) {
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < n; j += 32) mx = fmaxf(mx, part_ml[((j0 + j) * a.H + h) * 2]);
    mx = WarpMaxAll(mx);
    float sum = 0.0f;
    for (int64_t j = threadIdx.x; j < n; j += 32) {
      const float* ml = part_ml + ((j0 + j) * a.H + h) * 2;
      e[j] = expf(ml[0] - mx);
      sum += e[j] * ml[1];
    }
    sum = WarpSum(sum);
    if (threadIdx.x == 0) inv_sum = 1.0f / sum;
  }
  __syncthreads();
  float v = 0.0f;
  if (dim < a.r) {
#pragma unroll
    for (int i = 0; i < kCombineAhead; ++i) {
      const int64_t j = q + int64_t{i} * kCombineGroups;
      if (j < n) v += e[j] * ahead[i];
    }
#pragma unroll 8
    for (int64_t j = q + int64_t{kCombineAhead} * kCombineGroups; j < n; j += kCombineGroups) v += e[j] * part(j);
  }
  if (q > 0) partial[q - 1][d] = v;
  __syncthreads();
  if (q > 0 || dim >= a.r) return;
#pragma unroll
  for (int i = 0; i < kCombineGroups - 1; ++i) v += partial[i][d];
  o_bar[(b * a.H + h) * a.r + dim] = v * inv_sum;
}

}  // namespace

int64_t MlaDecodeSplitLen(int64_t context) {
  const int64_t splits = MaxSplits(context);
  const int64_t per_split = (context + splits - 1) / splits;
  return std::max(kMinSplit, (per_split + 63) / 64 * 64);
}

std::vector<int32_t> MlaDecodePersistSchedule(std::span<const int32_t> work, int64_t blocks) {
  // An item's cost: its tiles (mla_decode_wgmma.cu's 32 positions) and one more for writing its
  // ō and (max, sum), 64 KB at 32 heads against a tile's 36 KB read.
  constexpr int64_t kTilePositions = 32;
  const size_t n = work.size() / 3;
  std::vector<int64_t> before(n + 1, 0);  // the cost of the items ahead of each
  for (size_t i = 0; i < n; ++i) {
    before[i + 1] = before[i] + (work[3 * i + 2] - work[3 * i + 1] + kTilePositions - 1) / kTilePositions + 1;
  }
  // Block p starts at the first item whose cost ahead reaches p shares of the total.
  std::vector<int32_t> begin(static_cast<size_t>(blocks) + 1);
  size_t i = 0;
  for (int64_t p = 0; p < blocks; ++p) {
    while (i < n && before[i] * blocks < p * before[n]) ++i;
    begin[static_cast<size_t>(p)] = static_cast<int32_t>(i);
  }
  begin[static_cast<size_t>(blocks)] = static_cast<int32_t>(n);
  return begin;
}

void MlaPagedDecode(const PagedDecodeArgs& step, const float* qc, float* part_o, float* part_ml, float* o_bar,
                    cudaStream_t s) {
  // On by default: 1-4% off the op at batch 1-32 on an H100, the same bits (docs/cuda.md "The
  // warp-specialized split"); KIMIRT_MLA_L2_HINTS=0 (read once a process) turns them off.
  static const bool hints = [] {
    const char* v = std::getenv("KIMIRT_MLA_L2_HINTS");
    return v == nullptr || v[0] != '0';
  }();
  // The latent rows asked evict-first where the step's splits are one wave (a block an item: batch
  // 1), where it took 3-5% off the op on an H100; with blocks streaming many items it cost 3-4% at
  // 128K and batch 32 (docs/cuda.md "The latent rows asked evict-first"). A hint, so the same bits
  // either way. KIMIRT_MLA_L2_ROW_HINT=0 / 1 (read once a process) forces it.
  static const int row_hint_env = [] {
    const char* v = std::getenv("KIMIRT_MLA_L2_ROW_HINT");
    return v == nullptr || v[0] == '\0' ? -1 : v[0] == '1' ? 1 : 0;
  }();
  PagedDecodeArgs a = step;
  a.l2_hints = hints;
  a.l2_row_hint = row_hint_env >= 0 ? row_hint_env == 1 : hints && a.num_work <= SmCount();
  if (a.r > kMlaDecodeMaxLatent || a.dr > kMlaDecodeMaxRope) {
    std::fprintf(stderr, "kimirt: paged MLA decode with latent %lld / rope %lld exceeds the kernel's %lld / %lld\n",
                 static_cast<long long>(a.r), static_cast<long long>(a.dr),
                 static_cast<long long>(kMlaDecodeMaxLatent), static_cast<long long>(kMlaDecodeMaxRope));
    std::abort();
  }
  if (a.B == 0 || a.H == 0) return;
  if (MlaPagedDecodeTcSupported(a)) {
    MlaPagedDecodeSplitTc(a, qc, part_o, part_ml, s);
  } else {
    const dim3 grid(static_cast<unsigned>(a.num_work), static_cast<unsigned>((a.H + kDecodeHeads - 1) / kDecodeHeads));
    LaunchPdl("MlaPagedDecodeSplit", MlaPagedDecodeSplitKernel, grid, dim3(kDecodeThreads), 0, s, a, qc, part_o, part_ml);
    CheckLaunch("MlaPagedDecodeSplit");
  }
  const dim3 combine(static_cast<unsigned>(a.B * a.H), static_cast<unsigned>((a.r + kCombineDims - 1) / kCombineDims));
  LaunchPdl("MlaPagedDecodeCombine", MlaPagedDecodeCombineKernel, combine, dim3(kCombineDims * kCombineGroups), 0, s, a, static_cast<const float*>(part_o), static_cast<const float*>(part_ml), o_bar);
  CheckLaunch("MlaPagedDecodeCombine");
}

void CausalAttention(const AttentionArgs& a, cudaStream_t s) {
  if (a.dv > kAttentionMaxValueDim || a.da + a.db > kAttentionMaxQueryDim) {
    std::fprintf(stderr, "kimirt: attention with value dim %lld / query dim %lld exceeds the kernel's %lld / %lld\n",
                 static_cast<long long>(a.dv), static_cast<long long>(a.da + a.db),
                 static_cast<long long>(kAttentionMaxValueDim), static_cast<long long>(kAttentionMaxQueryDim));
    std::abort();
  }
  if (a.T == 0 || a.H == 0) return;
  const size_t smem = static_cast<size_t>(a.da + a.db) * sizeof(float);
  CausalAttentionKernel<<<static_cast<unsigned>(a.T * a.H), kTile, smem, s>>>(a);
  CheckLaunch("CausalAttention");
}

void AbsorbQuery(const float* q, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r,
                 const void* w_kvb, bool w_bf16, float* qc, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  if (r % 8 == 0 && dn == 128) {  // 16-byte weight loads (the models' widths)
    const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>((r + kAq8Cols - 1) / kAq8Cols),
                    AbsorbChunkBlocks(T));
    LaunchPdl("AbsorbQuery", AbsorbQuery8Kernel<128>, grid, dim3(kAq8Groups * 8), 0, s, q, T, H, dr, dv, r, w_kvb, w_bf16, qc);
    CheckLaunch("AbsorbQuery");
    return;
  }
  const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>((r + kAbsorbCols - 1) / kAbsorbCols));
  LaunchPdl("AbsorbQuery", AbsorbQueryKernel, grid, dim3(kAbsorbCols * kAbsorbSplit), 0, s, q, T, H, dn, dr, dv, r, w_kvb, w_bf16, qc);
  CheckLaunch("AbsorbQuery");
}

void AbsorbOutput(const float* o_bar, int64_t T, int64_t H, int64_t dn, int64_t dv, int64_t r, const void* w_kvb,
                  bool w_bf16, float* o, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  if (r > kAbsorbMaxLatent) {
    std::fprintf(stderr, "kimirt: MLA absorbed output with latent %lld exceeds the kernel's %d\n",
                 static_cast<long long>(r), kAbsorbMaxLatent);
    std::abort();
  }
  // Row chunks over grid z for the 16-byte kernel only (the element-wise one walks them all).
  const dim3 grid(static_cast<unsigned>(H), static_cast<unsigned>((dv + kAbsorbOutWarps - 1) / kAbsorbOutWarps),
                  r % 8 == 0 ? AbsorbChunkBlocks(T) : 1u);
  LaunchPdl("AbsorbOutput", r % 8 == 0 ? AbsorbOutput8Kernel : AbsorbOutputKernel, grid, dim3(kAbsorbOutWarps * 32), 0, s,
            o_bar, T, H, dn, dv, r, w_kvb, w_bf16, o);  // 16-byte weight loads where the latent allows
  CheckLaunch("AbsorbOutput");
}

}  // namespace kimirt::cuda
