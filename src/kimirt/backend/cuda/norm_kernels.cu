// Row normalizations on CUDA (kernels.h): RMSNorm (spec §3.1), the KDA output's gated RMSNorm
// (spec §3.2) and the Block AttnRes mix (spec §8.2). One block per row; the row's sums go
// through the deterministic block reduction.
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/cluster.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// rsqrt(mean(row²) + eps) of one row, by the whole block.
__device__ float InverseRms(const float* row, int64_t n, float eps, float* scratch) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  ss = BlockSum(ss, scratch);
  return 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
}

__global__ void RmsNormKernel(const float* x, const float* w, float eps, int64_t n, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float scratch[33];
  const float* r = x + blockIdx.x * n;
  const float inv = InverseRms(r, n, eps, scratch);
  float* out = y + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = w[i] * (r[i] * inv);
}

// RmsNormKernel's arithmetic in its order (thread i: elements i, i + 256, ... summed in turn,
// then BlockSum), so the same bits, for rows of up to kThreads · kNormHeld elements held in
// registers: every load of the row and the gains goes out at once, the gains before the wait on
// the kernel before (they are weights, pdl.cuh). The loops above wait one L2 (or HBM) round trip
// per element a thread owns, as the stores to y may alias x and w: ~7 µs a 2,304-wide row,
// measured (Nsight Compute, 2-layer Kimi-Linear-48B decode), where the data is 18 KB.
// kAdd (AddRmsNorm): the row is a + b, AddKernel's sum, stored to h before it is normalized.
// kHeld elements a thread: 12 for rows up to 3,072 (Kimi-Linear's 2,304), kNormHeld up to 8,192
// (K3's 7,168). With 32 for every width, Kimi-Linear's rows took 112-152 registers a thread (one or
// two 256-thread blocks an SM) and a 2,048-token prefill chunk's norms ran at 0.6-1.4 TB/s
// (54-60 µs a call, Nsight Compute); at 12, 48-60 registers.
constexpr int kNormHeld = 32;
constexpr int kNormHeldShort = 12;

// The held row's RMSNorm once every thread holds its elements (thread i: i, i + 256, ...): the
// squares summed in turn, BlockSum, then out[i] = w_of(j) · (x · inv). RmsNormHeldKernel's ending
// and AttnResMixHeldKernel's (kNorm), one code, so one set of bits.
template <int kHeld, class W>
__device__ __forceinline__ void NormHeldRow(const float (&xv)[kHeld], W&& w_of, int64_t n, float eps, float* scratch,
                                            float* __restrict__ out) {
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    if (threadIdx.x + int64_t{j} * kThreads < n) ss += xv[j] * xv[j];
  }
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if (i < n) out[i] = w_of(j) * (xv[j] * inv);
  }
}

template <bool kAdd, int kHeld>
__global__ void __launch_bounds__(kThreads)
    RmsNormHeldKernel(const float* __restrict__ x, const float* __restrict__ b, const float* __restrict__ w,
                      float eps, int64_t n, float* __restrict__ h, float* __restrict__ y) {
  __shared__ float scratch[33];
  float wv[kHeld], xv[kHeld];
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    wv[j] = i < n ? w[i] : 0.0f;
  }
  PdlWait();
  PdlTrigger();
  const int64_t row = blockIdx.x * n;
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int64_t i = threadIdx.x + int64_t{j} * kThreads;
    if constexpr (kAdd) {
      xv[j] = i < n ? x[row + i] + b[row + i] : 0.0f;
    } else {
      xv[j] = i < n ? x[row + i] : 0.0f;
    }
  }
  if constexpr (kAdd) {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      const int64_t i = threadIdx.x + int64_t{j} * kThreads;
      if (i < n) h[row + i] = xv[j];
    }
  }
  NormHeldRow<kHeld>(xv, [&](int j) { return wv[j]; }, n, eps, scratch, y + row);
}

__global__ void GatedRmsNormKernel(const float* x, const float* g, const float* w, float eps, int64_t K, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float scratch[33];
  const float* xr = x + blockIdx.x * K;
  const float* gr = g + blockIdx.x * K;
  const float rstd = InverseRms(xr, K, eps, scratch);
  float* yr = y + blockIdx.x * K;
  // Weight before gate (spec §3.2).
  for (int64_t d = threadIdx.x; d < K; d += blockDim.x) yr[d] = xr[d] * rstd * w[d] * Sigmoid(gr[d]);
}

// K = 128 (every model's KDA head): a warp a row, 8 rows a block, with GatedRmsNormKernel's
// arithmetic in its order, so its bits: lane l holds elements l, l + 32, l + 64, l + 96 (the
// 128-thread block's threads l of warps 0-3), each group's squares go through a warp's
// butterfly, then the four sums through warp 0's (BlockSum: lanes 4-31 add zeros). The block
// kernel (two barriers a row) took 79 µs for a 2,048-token chunk's 65,536 rows (Nsight Compute),
// ~4x the time of its bytes.
constexpr int kGatedRowsPerBlock = 8;
__global__ void __launch_bounds__(32 * kGatedRowsPerBlock)
    GatedRmsNorm128Kernel(const float* x, const float* g, const float* w, float eps, int64_t rows, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  constexpr int K = 128;
  const int lane = threadIdx.x & 31;
  const int64_t row = blockIdx.x * int64_t{kGatedRowsPerBlock} + threadIdx.x / 32;
  if (row >= rows) return;
  const float* xr = x + row * K;
  const float* gr = g + row * K;
  float v[4], sum[4];
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    v[q] = xr[lane + 32 * q];
    sum[q] = v[q] * v[q];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) sum[q] += __shfl_xor_sync(0xffffffffu, sum[q], off);
  }
  float t = lane == 0 ? sum[0] : lane == 1 ? sum[1] : lane == 2 ? sum[2] : lane == 3 ? sum[3] : 0.0f;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) t += __shfl_xor_sync(0xffffffffu, t, off);
  const float rstd = 1.0f / sqrtf(t / static_cast<float>(K) + eps);
  float* yr = y + row * K;
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int d = lane + 32 * q;
    yr[d] = v[q] * rstd * w[d] * Sigmoid(gr[d]);  // weight before gate (spec §3.2)
  }
}

// The candidates' weights from their scores, by one thread, in place (spec §8.2).
__device__ void SoftmaxInPlace(float* score, int n) {
  float mx = -INFINITY;
  for (int i = 0; i < n; ++i) mx = fmaxf(mx, score[i]);
  float z = 0.0f;
  for (int i = 0; i < n; ++i) z += (score[i] = expf(score[i] - mx));
  for (int i = 0; i < n; ++i) score[i] /= z;
}

// f(i, candidate i's values) for every candidate, two at a time through two register rows (a
// and b), the next one's loads (load(i, row)) in flight while one is used (constant indices: a
// run-time row index would put them in local memory).
template <int kHeld, class Load, class F>
__device__ __forceinline__ void EachCandidate(int n, Load&& load, F&& f) {
  float a[kHeld], b[kHeld];
  load(0, a);
  for (int i = 0; i < n; i += 2) {
    if (i + 1 < n) load(i + 1, b);
    f(i, a);
    if (i + 1 < n) {
      if (i + 2 < n) load(i + 2, a);
      f(i + 1, b);
    }
  }
}

// Once every score is in `score` (by the block's threads): the softmax (thread 0's, in place),
// then o = Σ_i p_i · v_i over this thread's elements, the candidates in order, one FMA each.
template <int kHeld, class EachCand>
__device__ __forceinline__ void SoftmaxThenMix(float* score, int n, EachCand&& each_candidate, float (&o)[kHeld]) {
  __syncthreads();
  if (threadIdx.x == 0) SoftmaxInPlace(score, n);
  __syncthreads();
#pragma unroll
  for (int j = 0; j < kHeld; ++j) o[j] = 0.0f;
  each_candidate([&](int i, const float(&v)[kHeld]) {
    const float p = score[i];
#pragma unroll
    for (int j = 0; j < kHeld; ++j) o[j] += p * v[j];
  });
}

__global__ void AttnResMixKernel(const AttnResCandidates cands, const float* proj, const float* norm_w, float eps,
                                 int64_t D, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float scratch[33];
  __shared__ float score[kAttnResMaxCandidates];
  const int64_t t = blockIdx.x;
  const int n = cands.n;
  for (int i = 0; i < n; ++i) {
    const float* v = cands.p[i] + t * D;
    float ss = 0.0f, dot = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      ss += v[d] * v[d];
      dot += norm_w[d] * proj[d] * v[d];  // the key-norm gain folded into the pseudo-query
    }
    ss = BlockSum(ss, scratch);
    dot = BlockSum(dot, scratch);
    // q · (v · rsqrt(mean(v²) + eps)) = rsqrt(...) · (q · v)
    if (threadIdx.x == 0) score[i] = dot / sqrtf(ss / static_cast<float>(D) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) SoftmaxInPlace(score, n);
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < n; ++i) o += score[i] * cands.p[i][t * D + d];
    y[t * D + d] = o;
  }
}

// AttnResMixKernel's arithmetic in its order, so its bits, for rows of up to kThreads · kHeld
// (K3's 7,168): thread i's elements i, i + 256, ... held in registers, so a candidate's row goes
// out as one batch of loads (the next candidate's while this one is summed) instead of one L2 or
// HBM round trip per element a thread owns — the loop kernel above took ~26 µs a call at K3's
// width with one or two candidates (the kernel tracer, 2-layer K3 decode on an H100), and its
// mix loop one round trip per (element, candidate), which a real depth of ~9 candidates
// multiplies. The per-thread sums are the loop's (ascending, one FMA a term, the key-norm gain
// times the pseudo-query rounded first); each candidate's warp sums (WarpSum) are BlockSum's first
// stage, its per-warp sums wait in shared memory, and the second stage (the 8 warp sums through
// one warp's butterfly) runs for every candidate after one barrier, candidate i in warp i % 8:
// BlockSum's tree, so BlockSum's results. The softmax is thread 0's as before; the mix sums the
// candidates in order, one FMA each.
//
// kNorm (AttnResMixNorm): the mix is the next norm's input and nothing else's, so it is not
// stored: RMSNorm(out_w, out_eps) of it is, by NormHeldRow (RmsNormHeldKernel's ending: its bits).
// The norm's gains go to shared memory before the wait (each thread its own, so no barrier),
// where they cost no registers beside the mix's.
template <int kHeld, bool kNorm = false>
__global__ void __launch_bounds__(kThreads)
    AttnResMixHeldKernel(const AttnResCandidates cands, const float* __restrict__ proj,
                         const float* __restrict__ norm_w, float eps, int64_t D, float* __restrict__ y,
                         const float* __restrict__ out_w = nullptr, float out_eps = 0.0f) {
  constexpr int kWarps = kThreads / 32;
  __shared__ float warp_ss[kAttnResMaxCandidates][kWarps], warp_dot[kAttnResMaxCandidates][kWarps];
  __shared__ float score[kAttnResMaxCandidates];
  __shared__ float gain[kNorm ? kHeld : 1][kNorm ? kThreads : 1];
  __shared__ float norm_scratch[kNorm ? 33 : 1];  // BlockSum's (score is still being read by the mix)
  const int64_t t = blockIdx.x;
  const int n = cands.n, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  auto in = [&](int j) { return threadIdx.x + int64_t{j} * kThreads < D; };
  float q[kHeld];  // the pseudo-query with the key-norm gain folded in: weights, read before the wait
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    const int64_t d = threadIdx.x + int64_t{j} * kThreads;
    q[j] = in(j) ? norm_w[d] * proj[d] : 0.0f;
    if constexpr (kNorm) gain[j][threadIdx.x] = in(j) ? out_w[d] : 0.0f;
  }
  PdlWait();
  PdlTrigger();
  auto load = [&](int i, float(&v)[kHeld]) {
    const float* row = cands.p[i] + t * D;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) v[j] = in(j) ? row[threadIdx.x + int64_t{j} * kThreads] : 0.0f;
  };
  auto warp_sums = [&](int i, const float(&v)[kHeld]) {
    float ss = 0.0f, dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      if (in(j)) {
        ss += v[j] * v[j];
        dot += q[j] * v[j];
      }
    }
    ss = WarpSum(ss);
    dot = WarpSum(dot);
    if (lane == 0) warp_ss[i][warp] = ss, warp_dot[i][warp] = dot;
  };
  auto each_candidate = [&](auto&& f) { EachCandidate<kHeld>(n, load, f); };
  each_candidate(warp_sums);
  __syncthreads();
  for (int i = warp; i < n; i += kWarps) {
    const float ss = WarpSum(lane < kWarps ? warp_ss[i][lane] : 0.0f);
    const float dot = WarpSum(lane < kWarps ? warp_dot[i][lane] : 0.0f);
    if (lane == 0) score[i] = dot / sqrtf(ss / static_cast<float>(D) + eps);
  }
  float o[kHeld];
  SoftmaxThenMix<kHeld>(score, n, each_candidate, o);
  if constexpr (kNorm) {
    NormHeldRow<kHeld>(o, [&](int j) { return gain[j][threadIdx.x]; }, D, out_eps, norm_scratch, y + t * D);
  } else {
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      if (in(j)) y[t * D + threadIdx.x + int64_t{j} * kThreads] = o[j];
    }
  }
}
constexpr int kAttnResHeld = 32;  // up to 8,192 wide (K3: 7,168)

// The mix over a cluster of kMixCluster blocks a row: the held kernel's one block (one SM) read
// every candidate twice, n × 28 KB × 2 at K3's width through one SM's share of L2 (7-10 µs a call
// at the 2-layer K3's 2 candidates on an H100; K3 has up to 9 and two mixes a layer). Block `rank` owns the
// slice [rank · slice, + slice) of the row, a thread ≤ kMixClusterHeld elements of it (i, i + 256,
// ...). Each candidate's squares and dot go thread → warp (WarpSum) → block (the warps in order)
// → the cluster (the blocks' sums read by rank through distributed shared memory, in rank order):
// the same sums in every block, so every block computes the same scores and softmax; each then
// mixes its slice. kNorm: the mixed row's RMSNorm the same way. Another fixed order than the
// held kernels' (not their bits), the same whatever T: a row's cluster reads nothing of another's.
constexpr int kMixCluster = 8;
constexpr int kMixClusterHeld = 4;  // up to 8 · 256 · 4 = 8,192 wide
template <bool kNorm>
__global__ void __launch_bounds__(kThreads)
    AttnResMixClusterKernel(const AttnResCandidates cands, const float* __restrict__ proj,
                            const float* __restrict__ norm_w, float eps, int64_t D, float* __restrict__ y,
                            const float* __restrict__ out_w, float out_eps) {
  constexpr int kWarps = kThreads / 32, kHeld = kMixClusterHeld;
  __shared__ float warp_ss[kAttnResMaxCandidates][kWarps], warp_dot[kAttnResMaxCandidates][kWarps];
  __shared__ float block_ss[kAttnResMaxCandidates], block_dot[kAttnResMaxCandidates];  // read by the cluster
  __shared__ float score[kAttnResMaxCandidates];
  __shared__ float norm_warp[kWarps], norm_block;  // norm_block read by the cluster
  const int rank = static_cast<int>(blockIdx.x);    // grid (kMixCluster, T): one cluster a row
  const int64_t t = blockIdx.y;
  const int n = cands.n, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t slice = (D + kMixCluster - 1) / kMixCluster;
  const int64_t begin = rank * slice, end = begin + slice < D ? begin + slice : D;
  auto at = [&](int j) { return begin + threadIdx.x + int64_t{j} * kThreads; };
  auto in = [&](int j) { return at(j) < end; };
  float q[kHeld], g[kHeld];  // weights: read before the wait
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    q[j] = in(j) ? norm_w[at(j)] * proj[at(j)] : 0.0f;
    g[j] = kNorm && in(j) ? out_w[at(j)] : 0.0f;
  }
  PdlWait();
  PdlTrigger();
  auto load = [&](int i, float(&v)[kHeld]) {
    const float* row = cands.p[i] + t * D;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) v[j] = in(j) ? row[at(j)] : 0.0f;
  };
  auto each_candidate = [&](auto&& f) { EachCandidate<kHeld>(n, load, f); };
  each_candidate([&](int i, const float(&v)[kHeld]) {
    float ss = 0.0f, dot = 0.0f;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) {
      ss += v[j] * v[j];  // zero past the slice
      dot += q[j] * v[j];
    }
    ss = WarpSum(ss);
    dot = WarpSum(dot);
    if (lane == 0) warp_ss[i][warp] = ss, warp_dot[i][warp] = dot;
  });
  __syncthreads();
  for (int i = warp; i < n; i += kWarps) {
    const float ss = WarpSum(lane < kWarps ? warp_ss[i][lane] : 0.0f);
    const float dot = WarpSum(lane < kWarps ? warp_dot[i][lane] : 0.0f);
    if (lane == 0) block_ss[i] = ss, block_dot[i] = dot;
  }
  ClusterArrive();  // every block's sums written (release) ...
  ClusterWait();    // ... and visible here (acquire)
  for (int i = threadIdx.x; i < n; i += kThreads) {
    float ss = LoadClusterShared(&block_ss[i], 0), dot = LoadClusterShared(&block_dot[i], 0);
    for (int r = 1; r < kMixCluster; ++r) {
      ss += LoadClusterShared(&block_ss[i], r);
      dot += LoadClusterShared(&block_dot[i], r);
    }
    score[i] = dot / sqrtf(ss / static_cast<float>(D) + eps);
  }
  float o[kHeld];
  SoftmaxThenMix<kHeld>(score, n, each_candidate, o);
  float inv = 1.0f;
  if constexpr (kNorm) {
    float ss = 0.0f;
#pragma unroll
    for (int j = 0; j < kHeld; ++j) ss += o[j] * o[j];
    ss = WarpSum(ss);
    if (lane == 0) norm_warp[warp] = ss;
    __syncthreads();
    if (warp == 0) {
      const float b = WarpSum(lane < kWarps ? norm_warp[lane] : 0.0f);
      if (lane == 0) norm_block = b;
    }
    ClusterArrive();
    ClusterWait();
    float total = LoadClusterShared(&norm_block, 0);
    for (int r = 1; r < kMixCluster; ++r) total += LoadClusterShared(&norm_block, r);
    inv = 1.0f / sqrtf(total / static_cast<float>(D) + out_eps);
  }
#pragma unroll
  for (int j = 0; j < kHeld; ++j) {
    if (in(j)) y[t * D + at(j)] = kNorm ? g[j] * (o[j] * inv) : o[j];
  }
  // No block may leave while another still reads its shared memory.
  ClusterArrive();
  ClusterWait();
}

}  // namespace

void RmsNorm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y, cudaStream_t s) {
  if (rows == 0) return;
  // In place (y == x) or longer rows: the loop kernel.
  if (n <= int64_t{kThreads} * kNormHeld && y != x) {
    LaunchPdl("RmsNorm",
              n <= int64_t{kThreads} * kNormHeldShort ? RmsNormHeldKernel<false, kNormHeldShort>
                                                      : RmsNormHeldKernel<false, kNormHeld>,
              dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, s, x, static_cast<const float*>(nullptr), w, eps,
              n, static_cast<float*>(nullptr), y);
  } else {
    LaunchPdl("RmsNorm", RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, s, x, w, eps, n, y);
  }
  CheckLaunch("RmsNorm");
}

void AddRmsNorm(const float* a, const float* b, const float* w, float eps, int64_t rows, int64_t n, float* h, float* y,
                cudaStream_t s) {
  if (rows == 0) return;
  if (n > int64_t{kThreads} * kNormHeld) {  // longer rows: the two kernels
    Add(a, b, h, rows * n, s);
    RmsNorm(h, w, eps, rows, n, y, s);
    return;
  }
  LaunchPdl("AddRmsNorm",
            n <= int64_t{kThreads} * kNormHeldShort ? RmsNormHeldKernel<true, kNormHeldShort>
                                                    : RmsNormHeldKernel<true, kNormHeld>,
            dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, s, a, b, w, eps, n, h, y);
  CheckLaunch("AddRmsNorm");
}

void GatedRmsNorm(const float* x, const float* g, const float* w, float eps, int64_t rows, int64_t K, float* y,
                  cudaStream_t s) {
  if (rows == 0) return;
  if (K == 128) {
    LaunchPdl("GatedRmsNorm", GatedRmsNorm128Kernel,
              dim3(static_cast<unsigned>((rows + kGatedRowsPerBlock - 1) / kGatedRowsPerBlock)),
              dim3(32 * kGatedRowsPerBlock), 0, s, x, g, w, eps, rows, y);
    CheckLaunch("GatedRmsNorm");
    return;
  }
  const int threads = K >= 256 ? 256 : (K >= 128 ? 128 : 64);
  LaunchPdl("GatedRmsNorm", GatedRmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, s, x, g, w, eps, K, y);
  CheckLaunch("GatedRmsNorm");
}

namespace {
void CheckCandidates(const AttnResCandidates& cands) {
  if (cands.n < 1 || cands.n > kAttnResMaxCandidates) {
    std::fprintf(stderr, "kimirt: AttnResMix of %d candidates (1..%d supported)\n", cands.n, kAttnResMaxCandidates);
    std::abort();
  }
}
}  // namespace

void AttnResMixLoop(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps, int64_t T,
                    int64_t D, float* y, cudaStream_t s) {
  if (T == 0) return;
  CheckCandidates(cands);
  LaunchPdl("AttnResMix", AttnResMixKernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, s, cands, proj, norm_w,
            eps, D, y);
  CheckLaunch("AttnResMix");
}

bool AttnResMixNormSupported(int64_t D) { return D > 0 && D <= int64_t{kThreads} * kAttnResHeld; }

bool AttnResMixClusterSupported(int64_t D) { return D > 0 && D <= int64_t{kMixCluster} * kThreads * kMixClusterHeld; }

void AttnResMixCluster(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps,
                       const float* out_w, float out_eps, int64_t T, int64_t D, float* y, cudaStream_t s) {
  if (T == 0) return;
  if (!AttnResMixClusterSupported(D) || T > 65535) {
    std::fprintf(stderr, "kimirt: AttnResMixCluster of %lld rows %lld wide (up to 65,535 rows of %d)\n",
                 static_cast<long long>(T), static_cast<long long>(D), kMixCluster * kThreads * kMixClusterHeld);
    std::abort();
  }
  CheckCandidates(cands);
  const auto kernel = out_w != nullptr ? AttnResMixClusterKernel<true> : AttnResMixClusterKernel<false>;
  LaunchEx("AttnResMixCluster", kernel, dim3(kMixCluster, static_cast<unsigned>(T)), dim3(kThreads), 0, s, kMixCluster,
           /*pdl=*/true, cands, proj, norm_w, eps, D, y, out_w, out_eps);
}

void AttnResMixNorm(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps,
                    const float* out_w, float out_eps, int64_t T, int64_t D, float* y, cudaStream_t s) {
  if (T == 0) return;
  if (!AttnResMixNormSupported(D)) {
    std::fprintf(stderr, "kimirt: AttnResMixNorm of rows %lld wide (up to %d)\n", static_cast<long long>(D),
                 kThreads * kAttnResHeld);
    std::abort();
  }
  CheckCandidates(cands);
  LaunchPdl("AttnResMixNorm", AttnResMixHeldKernel<kAttnResHeld, true>, dim3(static_cast<unsigned>(T)), dim3(kThreads),
            0, s, cands, proj, norm_w, eps, D, y, out_w, out_eps);
  CheckLaunch("AttnResMixNorm");
}

void AttnResMix(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps, int64_t T,
                int64_t D, float* y, cudaStream_t s) {
  if (D > int64_t{kThreads} * kAttnResHeld) return AttnResMixLoop(cands, proj, norm_w, eps, T, D, y, s);
  if (T == 0) return;
  CheckCandidates(cands);
  LaunchPdl("AttnResMix", AttnResMixHeldKernel<kAttnResHeld>, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, s,
            cands, proj, norm_w, eps, D, y, static_cast<const float*>(nullptr), 0.0f);
  CheckLaunch("AttnResMix");
}

}  // namespace kimirt::cuda
