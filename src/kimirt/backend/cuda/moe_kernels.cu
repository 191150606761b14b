// MoE on CUDA (kernels.h; spec §7.2): the router, the grouping of a step's (token, slot) choices
// by expert on the device, the routed experts (each chosen expert's weights read once per call,
// for all its tokens; F32, BF16 or MXFP4 held), and the combine.
// The router follows the CPU reference exactly: sigmoid scores, the correction bias for the
// choice only, top-k by (biased score desc, expert id asc), combine weights from the unbiased
// (or, for Kimi-Linear-48B, biased: spec §15.6) scores, renormalized in top-k order.
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/decode_tiled.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/mma_bf16.cuh"
#include "kimirt/backend/cuda/mxfp4_tiled.cuh"
#include "kimirt/backend/cuda/pdl.cuh"
#include "kimirt/backend/cuda/wave_splits.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace kimirt::cuda {
namespace {

constexpr int kMaxTopK = 64;

__device__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// One thread per token: k passes over the experts, each taking the best not yet chosen (the
// reference order; MoeRouteWarpKernel below gives its bits fast, for E ≤ kRouteMaxE).
__global__ void MoeRouteKernel(const float* logits, const float* bias, int64_t T, int64_t E, int k, bool renormalize,
                               float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  const float* row = logits + t * E;
  const int ks = append >= 0 ? k + 1 : k;  // the output row stride (RouteParams::append_expert)
  idx += t * ks;
  weights += t * ks;
  int32_t chosen[kMaxTopK];
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    int32_t best = -1;
    float best_choice = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int m = 0; m < j; ++m) taken |= chosen[m] == e;
      if (taken) continue;
      const float c = Sigmoid(row[e]) + bias[e];
      // Strictly greater: among equal choices the lower id (seen first) stays.
      if (best < 0 || c > best_choice) {
        best = static_cast<int32_t>(e);
        best_choice = c;
      }
    }
    chosen[j] = best;
    const float w = combine_biased ? best_choice : Sigmoid(row[best]);
    idx[j] = best;
    weights[j] = w;
    sum += w;
  }
  for (int j = 0; j < k; ++j) {
    float w = weights[j];
    if (renormalize && k > 1) w /= (sum + 1e-20f);
    weights[j] = w * scaling;
  }
  if (append >= 0) {
    idx[k] = append;
    weights[k] = 1.0f;
  }
}

// One warp per token (E ≤ kRouteMaxE), the one-thread kernel's indices and weights bit for bit
// (for finite logits: a NaN choice value has no order). The top k by (value desc, id asc) are
// found by rank, not by k picks in turn (each pick a 5-step butterfly and a rescan: a dependent
// chain of ~1,700 instructions, 9-11 µs a launch at decode, where latency is all it costs):
//   1. lane l holds the choice values of experts l, l + 32, ... and their maximum M_l;
//   2. τ = the k-th largest of the 32 maxima (k ≤ 32; else −inf): the k lanes with the largest
//      maxima hold k values ≥ τ, so every value of the top k is ≥ τ;
//   3. the values ≥ τ (a few more than k, unless many tie) go to shared memory;
//   4. each candidate's rank is the count of candidates before it in the order — all values
//      below τ come after every candidate — and rank r < k is pick r.
// Independent compares instead of a chain. The weights are the serial kernel's: the picked
// expert's sigmoid recomputed from its logit by the same expression, summed in pick order.
constexpr int kRouteWarps = 4;
constexpr int64_t kRouteMaxE = 32 * 32;

struct RouteCand {
  float c;    // choice value: sigmoid + correction bias
  int32_t e;  // expert id
};

// Candidate `me`'s place among cand[0 .. n) in the (value desc, id asc) order: how many come
// before it (the warp route kernel picks by it).
__device__ __forceinline__ int RankAmong(const RouteCand* cand, int n, const RouteCand& me) {
  int rank = 0;
#pragma unroll 4
  for (int o = 0; o < n; ++o) {
    const RouteCand other = cand[o];
    rank += other.c > me.c || (other.c == me.c && other.e < me.e);
  }
  return rank;
}

// A warp's shared memory for one token's choice.
template <int kPerLane>
struct RouteWarpSmem {
  RouteCand cand[32 * kPerLane];
  float lane_max[32];
  int32_t pick_e[kMaxTopK];
  float pick_w[kMaxTopK];
};

// This lane's experts' correction biases (lane + 32i), for RouteTokenWarp. They are weights, so a
// kernel loads them before PdlWait (pdl.cuh): their DRAM round trip passes under the router GEMV's
// tail. Loaded after the wait, one at a time with the logits, a batch-1 token's routing spent
// ~7,000 of its ~10,000 cycles on these loads (clock64 stamps, 2-layer Kimi-Linear-48B).
template <int kPerLane>
__device__ __forceinline__ void LoadLaneBias(const float* bias, int64_t E, float (&b)[kPerLane]) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) b[i] = lane + 32 * i < E ? bias[lane + 32 * i] : 0.0f;
}

// Token t's choice, by the calling warp (whole), in its `sm`; b: LoadLaneBias's.
template <int kPerLane>
__device__ __forceinline__ void RouteTokenWarp(const float* logits, const float (&b)[kPerLane], int64_t t, int64_t E,
                                               int k, bool renormalize, float scaling, bool combine_biased,
                                               int32_t append, int32_t* idx, float* weights,
                                               RouteWarpSmem<kPerLane>& sm) {
  RouteCand* const cand = sm.cand;
  float* const lane_max = sm.lane_max;
  int32_t* const pick_e = sm.pick_e;
  float* const pick_w = sm.pick_w;
  const int lane = threadIdx.x & 31;
  __syncwarp();  // a warp's previous token (MoeRouteGroupSplitKernel) is done with `sm`
  const float* row = logits + t * E;
  float c[kPerLane];
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) c[i] = lane + 32 * i < E ? row[lane + 32 * i] : 0.0f;  // all loads first
  float m = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    c[i] = lane + 32 * i < E ? Sigmoid(c[i]) + b[i] : -INFINITY;
    m = fmaxf(m, c[i]);
  }
  // Picks a NaN choice value could leave unwritten: a valid expert, NaN weight.
  for (int j = lane; j < k; j += 32) {
    pick_e[j] = 0;
    pick_w[j] = NAN;
  }
  // 2. τ = the smallest maximum with fewer than k maxima above it (that is the k-th largest).
  lane_max[lane] = m;
  __syncwarp();
  int above = 0;
#pragma unroll 8
  for (int l = 0; l < 32; ++l) above += lane_max[l] > m;
  float tau = above < k ? m : INFINITY;
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) tau = fminf(tau, __shfl_xor_sync(0xffffffffu, tau, off));
  if (k > 32) tau = -INFINITY;
  // 3. The candidates, in (i, lane) order.
  int n = 0;
#pragma unroll
  for (int i = 0; i < kPerLane; ++i) {
    const bool in = lane + 32 * i < E && c[i] >= tau;
    const uint32_t mask = __ballot_sync(0xffffffffu, in);
    if (in) cand[n + __popc(mask & ((1u << lane) - 1u))] = RouteCand{c[i], lane + 32 * i};
    n += __popc(mask);
  }
  __syncwarp();
  // 4. Ranks: lane l takes candidates l, l + 32, ...
#pragma unroll 1
  for (int q = lane; q < n; q += 32) {
    const RouteCand me = cand[q];
    const int rank = RankAmong(cand, n, me);
    if (rank < k) {
      pick_e[rank] = me.e;
      pick_w[rank] = combine_biased ? me.c : Sigmoid(row[me.e]);
    }
  }
  __syncwarp();
  float sum = 0.0f;  // in pick order, as the serial kernel adds them
  if (lane == 0) {
#pragma unroll 1
    for (int j = 0; j < k; ++j) sum += pick_w[j];
  }
  sum = __shfl_sync(0xffffffffu, sum, 0);
  const int ks = append >= 0 ? k + 1 : k;  // the output row stride (RouteParams::append_expert)
#pragma unroll 1
  for (int j = lane; j < k; j += 32) {
    float w = pick_w[j];
    if (renormalize && k > 1) w /= (sum + 1e-20f);
    idx[t * ks + j] = pick_e[j];
    weights[t * ks + j] = w * scaling;
  }
  if (append >= 0 && lane == 31) {
    idx[t * ks + k] = append;
    weights[t * ks + k] = 1.0f;
  }
}

template <int kPerLane>
__global__ void __launch_bounds__(kRouteWarps * 32)
    MoeRouteWarpKernel(const float* logits, const float* bias, int64_t T, int64_t E, int k, bool renormalize,
                       float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights) {
  __shared__ RouteWarpSmem<kPerLane> sm[kRouteWarps];
  float b[kPerLane];
  LoadLaneBias<kPerLane>(bias, E, b);
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int warp = threadIdx.x / 32;
  const int64_t t = int64_t{blockIdx.x} * kRouteWarps + warp;
  if (t >= T) return;  // whole warps
  RouteTokenWarp<kPerLane>(logits, b, t, E, k, renormalize, scaling, combine_biased, append, idx, weights, sm[warp]);
}

__device__ float GluOf(float a, float u, int kind, float b1, bool has_b2, float b2) {
  if (kind == 0) return a * Sigmoid(a) * u;
  const float s = b1 * tanhf(a / b1) * Sigmoid(a);
  return s * (has_b2 ? b2 * tanhf(u / b2) : u);
}

// --- Grouping by expert: a counting sort of the router's choice, on the device --------------
//
// One block. Counts per expert (shared-memory atomics: the counts do not depend on their order),
// an exclusive scan over the experts (each thread a run of consecutive experts, a Hillis-Steele
// scan of the runs), then warps place the slots 32 at a time in slot order, so a group lists
// its slots ascending (the placement is deterministic; the expert math does not depend on it).
// kChunks warps place: warp w the w-th of kChunks consecutive runs of slots, from cursors that
// count the runs before it (per-run counts kept beside the totals), so the placement is the same
// as one warp's through all slots. A decode step's few hundred slots take one warp (the fused
// route chain's shared memory has no room for more); a prefill chunk's 16K (2,048 tokens, top-8)
// took one warp 139 µs, ~2% of a 32K prefill (Nsight Compute), and takes 8.
constexpr int kSortThreads = 1024;
constexpr int kGroupChunks = 8;

// The grouping by the whole block, in `sh`: GroupSmemInts(E, chunks) ints.
constexpr int64_t GroupSmemInts(int64_t E, int chunks = 1) {
  return 2 * E + 2 * kSortThreads + (chunks > 1 ? chunks * E : 0);
}

template <int kChunks = 1>
__device__ __forceinline__ void GroupByExpertBlock(const int32_t* idx, int64_t n, int64_t E, int32_t* order,
                                                   int32_t* pos, int32_t* active, int32_t* begin,
                                                   int32_t* num_active, int32_t* sh) {
  int32_t* count = sh;              // [E]
  int32_t* cursor = sh + E;         // [E]
  int32_t* scan_c = sh + 2 * E;     // [blockDim]
  int32_t* scan_a = scan_c + blockDim.x;
  int32_t* run = scan_a + blockDim.x;  // [kChunks, E] (kChunks > 1): per-run counts, then cursors
  const int tid = threadIdx.x;
  const int64_t run_len = (n + kChunks - 1) / kChunks;
  for (int64_t e = tid; e < E; e += blockDim.x) count[e] = 0;
  if constexpr (kChunks > 1) {
    for (int64_t i = tid; i < kChunks * E; i += blockDim.x) run[i] = 0;
  }
  __syncthreads();
  for (int64_t s = tid; s < n; s += blockDim.x) {
    const int32_t e = idx[s];
    if (e < 0 || e >= E) __trap();  // the router only chooses real experts
    atomicAdd(&count[e], 1);
    if constexpr (kChunks > 1) atomicAdd(&run[s / run_len * E + e], 1);
  }
  __syncthreads();
  const int64_t per = (E + blockDim.x - 1) / blockDim.x;
  const int64_t lo = min(E, tid * per), hi = min(E, lo + per);
  int32_t c = 0, a = 0;
  for (int64_t e = lo; e < hi; ++e) {
    c += count[e];
    a += count[e] > 0;
  }
  scan_c[tid] = c;
  scan_a[tid] = a;
  __syncthreads();
  for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {
    const int32_t vc = tid >= off ? scan_c[tid - off] : 0, va = tid >= off ? scan_a[tid - off] : 0;
    __syncthreads();
    scan_c[tid] += vc;
    scan_a[tid] += va;
    __syncthreads();
  }
  int32_t at = scan_c[tid] - c, act = scan_a[tid] - a;  // exclusive
  for (int64_t e = lo; e < hi; ++e) {
    cursor[e] = at;
    if (count[e] > 0) {
      active[act] = static_cast<int32_t>(e);
      begin[act] = at;
      ++act;
    }
    at += count[e];
  }
  if (tid == static_cast<int>(blockDim.x) - 1) {
    begin[act] = static_cast<int32_t>(n);
    *num_active = act;
  }
  __syncthreads();
  if constexpr (kChunks > 1) {
    // Run w's cursor of expert e: the expert's start plus its slots in runs 0 .. w - 1.
    for (int64_t e = tid; e < E; e += blockDim.x) {
      int32_t at = cursor[e];
      for (int w = 0; w < kChunks; ++w) {
        const int32_t c = run[w * E + e];
        run[w * E + e] = at;
        at += c;
      }
    }
    __syncthreads();
  }
  const int warp = tid / 32, lane = tid % 32;
  if (warp >= kChunks) return;
  int32_t* cur = kChunks > 1 ? run + warp * E : cursor;
  const unsigned below = (1u << lane) - 1u;
  const int64_t first = warp * run_len, last = min(n, first + run_len);
  for (int64_t base = first; base < last; base += 32) {
    const int64_t s = base + lane;
    const int32_t e = s < last ? idx[s] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    int32_t g = 0;
    if (s < last) g = cur[e] + __popc(peers & below);
    __syncwarp();
    if (s < last) {
      order[g] = static_cast<int32_t>(s);
      pos[s] = g;
      if (lane == 31 - __clz(peers)) cur[e] += __popc(peers);  // the group's highest lane
    }
    __syncwarp();
  }
}

// The same grouping by one warp for n ≤ 32 slots (a decode step of up to 3 tokens at top-8 + the
// shared expert): lane s holds slot s, and its place is the count of slots before it in (expert,
// slot) order — shuffles instead of the block's counts, scan and ~20 barriers, which took ~6,000
// cycles of the batch-1 route chain (clock64 stamps, fourteenth session). The outputs are
// GroupByExpertBlock's, value for value.
constexpr int64_t kGroupWarpMaxSlots = 32;
__device__ __forceinline__ void GroupByExpertWarp(const int32_t* idx, int64_t n, int64_t E, int32_t* order,
                                                  int32_t* pos, int32_t* active, int32_t* begin,
                                                  int32_t* num_active) {
  const int lane = threadIdx.x % 32;
  const bool valid = lane < n;
  const int32_t e = valid ? idx[lane] : -1;
  if (valid && (e < 0 || e >= E)) __trap();  // the router only chooses real experts
  const unsigned peers = __match_any_sync(0xffffffffu, e);
  const bool leader = valid && lane == __ffs(peers) - 1;  // its expert's first slot
  const unsigned leaders = __ballot_sync(0xffffffffu, leader);
  int32_t place = __popc(peers & ((1u << lane) - 1u)), act = 0;
#pragma unroll 8
  for (int j = 0; j < 32; ++j) {
    const int32_t ej = __shfl_sync(0xffffffffu, e, j);
    const bool before = j < n && ej < e;  // slot j's expert comes first
    place += before;
    act += before && (leaders >> j & 1u);
  }
  if (valid) {
    order[place] = lane;
    pos[lane] = place;
    if (leader) {
      active[act] = e;
      begin[act] = place;
    }
  }
  if (lane == 0) {
    const int32_t num = __popc(leaders);
    begin[num] = static_cast<int32_t>(n);
    *num_active = num;
  }
}

__global__ void __launch_bounds__(32)
    GroupByExpertWarpKernel(const int32_t* idx, int64_t n, int64_t E, int32_t* order, int32_t* pos, int32_t* active,
                            int32_t* begin, int32_t* num_active) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  GroupByExpertWarp(idx, n, E, order, pos, active, begin, num_active);
}

template <int kChunks>
__global__ void __launch_bounds__(kSortThreads)
    GroupByExpertKernel(const int32_t* idx, int64_t n, int64_t E, int32_t* order, int32_t* pos, int32_t* active,
                        int32_t* begin, int32_t* num_active) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  extern __shared__ int32_t sh[];
  GroupByExpertBlock<kChunks>(idx, n, E, order, pos, active, begin, num_active, sh);
}

// --- Expert weights, 32 elements at a time --------------------------------------------------
//
// A lane takes elements [base, base + 32) of a weight row, base = 32·lane + 1024·m, and sums
// them in order into each of its tokens' accumulators; the warp's lanes are then summed by a
// fixed butterfly. That order depends on nothing but the row length, so a token's result does
// not depend on the other tokens of its expert, and it is the same for every way the weight is
// held: MXFP4 decodes to exactly the values BF16 holds (E2M1 × 2^(s−127), at most 2 significant
// bits, spec §2.9), so packed and BF16-held experts give the same bits.
enum WeightFormat : int { kF32 = 0, kBf16 = 1, kMxfp4 = 2 };

// E2M1 code (low 4 bits) × E8M0 scale, exactly as DequantizeMxfp4Row: the E2M1 value is built
// from its bits (sign, 2 exponent bits, 1 mantissa bit; exponent 0 is 0 or 0.5) and multiplied
// by 2^(s−127) as a float (s = 0 is the subnormal 2^−127, s = 255 NaN); the product is exact or
// overflows to ±inf.
__device__ __forceinline__ float E8M0Value(unsigned s) {
  if (s == 255u) return __int_as_float(0x7fc00000);
  return s == 0u ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(s << 23));
}
__device__ __forceinline__ float E2M1Value(unsigned code) {
  const unsigned e = (code >> 1) & 3u, m = code & 1u;
  unsigned bits = e != 0u ? ((e + 126u) << 23) | (m << 22) : (m != 0u ? 0x3f000000u : 0u);
  bits |= (code & 8u) << 28;
  return __uint_as_float(bits);
}

__global__ void DequantizeMxfp4Kernel(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const unsigned byte = codes[i / 2];
  out[i] = E2M1Value(i % 2 == 0 ? byte & 0xfu : byte >> 4) * E8M0Value(scales[i / 32]);
}

// 32 consecutive weights of a row as loaded (not yet decoded): MXFP4 16 code bytes + the
// group's scale, BF16 64 bytes, F32 128 bytes. Held raw, so a lane can have the next chunk in
// flight while it computes with this one at few registers; Elem decodes one element.
template <int kFmt>
struct Chunk;
template <>
struct Chunk<kMxfp4> {
  uint4 q;
  float scale;
};
template <>
struct Chunk<kBf16> {
  uint4 q[4];
};
template <>
struct Chunk<kF32> {
  float4 q[8];
};

__device__ __forceinline__ unsigned Word(const uint4& q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }
__device__ __forceinline__ float Comp(const float4& q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }

// Element j (a compile-time constant where unrolled) of a chunk, as F32.
__device__ __forceinline__ float Elem(const Chunk<kMxfp4>& c, int j) {
  return E2M1Value(Word(c.q, j / 8) >> (4 * (j % 8))) * c.scale;
}
__device__ __forceinline__ float Elem(const Chunk<kBf16>& c, int j) {
  return __uint_as_float((Word(c.q[j / 8], (j % 8) / 2) >> (16 * (j % 2))) << 16);
}
__device__ __forceinline__ float Elem(const Chunk<kF32>& c, int j) { return Comp(c.q[j / 4], j % 4); }

// Row `r` of a [rows, cols] weight, elements [base, base + 32) (0 past the row).
template <int kFmt>
__device__ __forceinline__ void LoadChunk(const void* wp, const uint8_t* sp, int64_t r, int64_t cols, int64_t base,
                                          Chunk<kFmt>& c) {
  const int64_t at = r * cols + base;
  if constexpr (kFmt == kMxfp4) {
    // cols is a multiple of 32 (a scale group): always whole, 16-byte aligned.
    c.q = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wp) + at / 2);
    c.scale = E8M0Value(sp[at / 32]);
  } else if constexpr (kFmt == kBf16) {
    if (base + 32 <= cols && cols % 8 == 0) {
      const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(wp) + at);
#pragma unroll
      for (int v = 0; v < 4; ++v) c.q[v] = p[v];
      return;
    }
    const uint16_t* p = static_cast<const uint16_t*>(wp) + at;
    unsigned w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const unsigned lo = base + 2 * i < cols ? p[2 * i] : 0u, hi = base + 2 * i + 1 < cols ? p[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) c.q[v] = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
  } else {
    if (base + 32 <= cols && cols % 8 == 0) {
      const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(wp) + at);
#pragma unroll
      for (int v = 0; v < 8; ++v) c.q[v] = p[v];
      return;
    }
    const float* p = static_cast<const float*>(wp) + at;
    float w[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = base + j < cols ? p[j] : 0.0f;
#pragma unroll
    for (int v = 0; v < 8; ++v) c.q[v] = make_float4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
  }
}

constexpr int kExpertWarps = 8;   // rows of one expert per block, a warp each
constexpr int kExpertTile = 8;    // tokens per pass over a row: each weight chunk is loaded once per tile

struct GroupArgs {
  const int32_t* order;       // group row -> slot (token = slot / k)
  const int32_t* active;      // [A] chosen experts, ascending
  const int32_t* begin;       // [A + 1] their first group rows
  const int32_t* num_active;  // A
  int64_t k;
};

// For each of up to kExpertTile tokens t < n (inputs x[t], length cols) and each of kMats weight
// rows m: acc[m][t] += Σ_j w_m[r, j] · x[t][j] over this lane's elements j = 32·lane + 1024·i + c,
// c = 0..31, in that order (the order every format shares). The next chunk is loaded before the
// current one is used, so two are in flight per matrix.
template <int kFmt, int kMats>
__device__ __forceinline__ void RowDots(const void* const (&w)[kMats], const uint8_t* const (&s)[kMats], int64_t r,
                                        int64_t cols, const float* const (&x)[kExpertTile], int n,
                                        float (&acc)[kMats][kExpertTile]) {
  const int lane = threadIdx.x & 31;
  int64_t base = 32 * lane;
  if (base >= cols) return;
  Chunk<kFmt> cur[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) LoadChunk<kFmt>(w[m], s[m], r, cols, base, cur[m]);
  for (; base < cols; base += 1024) {
    Chunk<kFmt> next[kMats];
    const bool more = base + 1024 < cols;
    if (more) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) LoadChunk<kFmt>(w[m], s[m], r, cols, base + 1024, next[m]);
    }
    const bool whole = base + 32 <= cols;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      if (whole || base + j < cols) {
        float wv[kMats];
#pragma unroll
        for (int m = 0; m < kMats; ++m) wv[m] = Elem(cur[m], j);
#pragma unroll
        for (int t = 0; t < kExpertTile; ++t) {
          if (t < n) {
            const float xv = x[t][base + j];
#pragma unroll
            for (int m = 0; m < kMats; ++m) acc[m][t] = fmaf(wv[m], xv, acc[m][t]);
          }
        }
      }
    }
    if (more) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) cur[m] = next[m];
    }
  }
}

// h[g, i] = GLU(W1_e[i] · z[t], W3_e[i] · z[t]) for every group row g of expert e (token t).
// Grid: (rows / kExpertWarps, max A).
template <int kFmt>
__global__ void __launch_bounds__(kExpertWarps * 32) ExpertGateUpKernel(
    const float* z, GroupArgs ga, int64_t De, int64_t I, const void* const* w1, const void* const* w3,
    const uint8_t* const* s1, const uint8_t* const* s3, int kind, float b1, bool has_b2, float b2, float* h) {
  const int a = blockIdx.y;
  if (a >= *ga.num_active) return;
  const int64_t i = blockIdx.x * int64_t{kExpertWarps} + threadIdx.x / 32;
  if (i >= I) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int32_t e = ga.active[a];
  const void* const w[2] = {w1[e], w3[e]};
  const uint8_t* const sc[2] = {kFmt == kMxfp4 ? s1[e] : nullptr, kFmt == kMxfp4 ? s3[e] : nullptr};
  const int32_t g1 = ga.begin[a + 1];
  for (int32_t g0 = ga.begin[a]; g0 < g1; g0 += kExpertTile) {
    const int n = min(kExpertTile, g1 - g0);
    const float* x[kExpertTile];
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) x[t] = z + (t < n ? ga.order[g0 + t] / ga.k : 0) * De;
    float acc[2][kExpertTile] = {};
    RowDots<kFmt, 2>(w, sc, i, De, x, n, acc);
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) {
      if (t < n) {  // n is the same for the whole warp: the butterfly stays full
        const float sg = WarpSum(acc[0][t]), su = WarpSum(acc[1][t]);
        if (lane == 0) h[(g0 + t) * I + i] = GluOf(sg, su, kind, b1, has_b2, b2);
      }
    }
  }
}

// grouped[g, d] = W2_e[d] · h[g] for every group row g of expert e. Grid: (De / kExpertWarps, max A).
template <int kFmt>
__global__ void __launch_bounds__(kExpertWarps * 32) ExpertDownKernel(const float* h, GroupArgs ga, int64_t De,
                                                                      int64_t I, const void* const* w2,
                                                                      const uint8_t* const* s2, float* grouped) {
  const int a = blockIdx.y;
  if (a >= *ga.num_active) return;
  const int64_t d = blockIdx.x * int64_t{kExpertWarps} + threadIdx.x / 32;
  if (d >= De) return;
  const int lane = threadIdx.x & 31;
  const int32_t e = ga.active[a];
  const void* const w[1] = {w2[e]};
  const uint8_t* const sc[1] = {kFmt == kMxfp4 ? s2[e] : nullptr};
  const int32_t g1 = ga.begin[a + 1];
  for (int32_t g0 = ga.begin[a]; g0 < g1; g0 += kExpertTile) {
    const int n = min(kExpertTile, g1 - g0);
    const float* x[kExpertTile];
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) x[t] = h + (t < n ? g0 + t : g0) * I;
    float acc[1][kExpertTile] = {};
    RowDots<kFmt, 1>(w, sc, d, I, x, n, acc);
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) {
      if (t < n) {
        const float v = WarpSum(acc[0][t]);
        if (lane == 0) grouped[(g0 + t) * De + d] = v;
      }
    }
  }
}

template <int kFmt>
void LaunchExperts(const float* z, const GroupArgs& ga, int64_t max_active, int64_t De, int64_t I,
                   const ExpertPointerTable& w, int kind, float beta, bool has_linear_beta, float linear_beta,
                   float* h, float* grouped, cudaStream_t s) {
  const dim3 block(kExpertWarps * 32);
  const dim3 gate_grid(static_cast<unsigned>((I + kExpertWarps - 1) / kExpertWarps), static_cast<unsigned>(max_active));
  ExpertGateUpKernel<kFmt><<<gate_grid, block, 0, s>>>(z, ga, De, I, w.gate, w.up, w.gate_scales, w.up_scales, kind,
                                                       beta, has_linear_beta, linear_beta, h);
  CheckLaunch("ExpertGateUp");
  const dim3 down_grid(static_cast<unsigned>((De + kExpertWarps - 1) / kExpertWarps),
                       static_cast<unsigned>(max_active));
  ExpertDownKernel<kFmt><<<down_grid, block, 0, s>>>(h, ga, De, I, w.down, w.down_scales, grouped);
  CheckLaunch("ExpertDown");
}

// --- Decode experts on tensor cores (≤ kGemvMaxRows tokens; docs/cuda.md "MoE decode") ------
//
// The same design as DecodeGemm (decode_gemm.cu, mma_bf16.cuh), per chosen expert: the weight is
// the MMA's A operand (16 output rows × 16 k), the expert's tokens its B operand (16 k × 8
// tokens), x split into three BF16 parts (hi + mid + lo = x) so every product is exact and the
// sums are F32's. A warp holds two 16-row tiles (gate/up: the same 16 rows of W1 and W3, so the
// GLU pairs sit in one lane; down: 32 rows of W2) for all the expert's tokens, 8 per MMA column
// tile (2 with part columns, below), and walks its k slice in rounds of 128 (4 steps of 32). The
// weight is read once per call for all the expert's tokens, spread over every multiprocessor: an
// expert's rows over blocks (grid x), its k over `splits` slices (grid y), the chosen experts over
// grid z.
//
// Batch invariance: a token's sums are the same MMAs in the same order (k ascending within a
// slice, per 32-k step the six MMAs of mma::Step then one F32 add — or with part columns, per
// part its step's two MMAs then one F32 add, the parts added last; slices summed in slice order
// by the next kernel), whatever other tokens the expert has and whichever MMA column the token
// lands in; the split of k depends on the widths and top-k only, never on the tokens.
//
// Bit equality of MXFP4 and BF16-held experts: both feed the MMAs the same BF16 words. Lane
// (g, t) takes k = kb + 32u + 8t .. +7 at step u of a round (DecodeGemm's map: a quad reads 64
// contiguous bytes of a BF16 row); within those 8, A word j holds elements j and j + 4 (the pair
// the MXFP4 decode below makes from one 32-bit word in four instructions), and the split x is
// stored in that order (PackedPos), so both operands agree. MXFP4 lanes load a whole scale group
// (16 code bytes, k = kb + 32t ..) and exchange words through shared memory so each lane gets
// the 8 codes of its BF16 positions.
constexpr int kMmaWarps = 4;
constexpr int64_t kRoundK = 128;       // k per round: 4 steps of 32
constexpr int64_t kMinSliceK = 256;    // never split k finer than 2 rounds
constexpr int64_t kTargetBlocks = 528; // ~4 blocks per multiprocessor of an H200 (132): see DecodeGemm
// No L2 hints ahead of the loads. Each row's whole slice asked into L2 at the slice's start
// (cp.async.bulk.prefetch.L2, up to 4 rounds a request) cost HBM bandwidth instead of hiding
// latency: without it the Kimi-Linear experts read HBM at 0.48 / 0.75 / 0.64 / 0.64 of its peak at
// batch 1 / 8 / 32 / 64 against 0.44 / 0.66 / 0.52 / 0.51 with it (moe_bench, one run, 2026-12-03),
// and the whole 48B's step went from 3.57-3.63 ms at batch 1 in that day's runs with it to 3.34
// (21.7-22.2 to 19.2 at batch 32). DecodeGemm's hint of one round (256 bytes a row) two rounds
// ahead, tried here, was slower still than none (3.54 ms);
// bench/hbm_read_bench.cu shows the same on plain reads (bulk hints 0.62 of peak, none 0.76).
constexpr int kTransposeStride = 20;   // words per 8-row group of the MXFP4 exchange: conflict-free stores

template <bool kGateUp>
constexpr int64_t kRowsPerWarp = kGateUp ? 16 : 32;  // gate/up: 16 rows each of W1 and W3
template <bool kGateUp>
constexpr int64_t kRowsPerBlock = kMmaWarps * kRowsPerWarp<kGateUp>;

struct KSplit {
  int64_t splits = 1, slice = 0;
};

// k slices for an [N, K] weight per expert when top_k experts run at once: enough blocks for the
// GPU at batch 1 (kTargetBlocks), slices of whole rounds, then as few waves as that count allows
// (wave_splits.h). From the widths and top_k only.
KSplit SplitK(int64_t rows_per_block, int64_t N, int64_t K, int64_t top_k) {
  const int64_t blocks = (N + rows_per_block - 1) / rows_per_block * top_k;
  const int64_t max_splits = std::max<int64_t>(1, K / kMinSliceK);
  const int64_t want = std::clamp<int64_t>((kTargetBlocks + blocks - 1) / blocks, 1, max_splits);
  KSplit s;
  s.slice = ((K + want - 1) / want + kRoundK - 1) / kRoundK * kRoundK;
  s.splits = (K + s.slice - 1) / s.slice;
  if (WaveSplitsOn()) {
    s.slice = WaveSliceRounds(blocks, (K + kRoundK - 1) / kRoundK, s.splits, kTargetBlocks) * kRoundK;
    s.splits = (K + s.slice - 1) / s.slice;
  }
  return s;
}

// Position of element i of a row in its split-x copy: within each aligned 8, element j (< 4) at
// 2j and element j + 4 at 2j + 1, so a 16-byte load gives the words (x_j, x_{j+4}) of the A map.
__device__ __forceinline__ int64_t PackedPos(int64_t i) {
  const int64_t j = i & 7;
  return (i & ~int64_t{7}) | (j < 4 ? 2 * j : 2 * (j - 4) + 1);
}

// parts [3, rows, K] BF16 (hi, mid, lo) of x [rows, K] F32, in PackedPos order.
__device__ __forceinline__ void StoreSplit(float v, int64_t row, int64_t i, int64_t rows, int64_t K,
                                           uint16_t* parts) {
  uint32_t hi, mid, lo;
  mma::SplitOne(v, hi, mid, lo);
  const int64_t at = row * K + PackedPos(i);
  parts[at] = static_cast<uint16_t>(hi);
  parts[rows * K + at] = static_cast<uint16_t>(mid);
  parts[2 * rows * K + at] = static_cast<uint16_t>(lo);
}

// Elements first, first + stride, ... of x [rows, K], split into parts.
__device__ __forceinline__ void SplitRows(const float* x, int64_t rows, int64_t K, uint16_t* parts, int64_t first,
                                          int64_t stride) {
  for (int64_t i = first; i < rows * K; i += stride) StoreSplit(x[i], i / K, i % K, rows, K, parts);
}

__global__ void SplitRowsKernel(const float* x, int64_t rows, int64_t K, uint16_t* parts) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  SplitRows(x, rows, K, parts, blockIdx.x * int64_t{blockDim.x} + threadIdx.x, int64_t{gridDim.x} * blockDim.x);
}

// The decode step's route chain in one launch (MoeRouteGroupSplit): block 0 chooses every
// token's experts (warp w the tokens w, w + 16, ...: RouteTokenWarp, MoeRouteWarpKernel's code)
// and then groups the choices (GroupByExpertBlock, GroupByExpertKernel's code: the block's own
// writes of idx, read after a barrier); blocks 1.. split z (SplitRowsKernel's loop), which needs
// no choice. Two launches fewer a MoE layer; measured, a small gain (the whole 48B at batch 1:
// 3.57-3.59 ms a step against 3.60 unfused, 2026-12-03): in a graph with PDL those launches cost
// about a microsecond each, far less than Nsight Compute's serialized times of them (8, 5, 2 µs).
// 16 routing warps keep the shared memory under the 48 KB a launch has without opting in.
constexpr int kRouteGroupWarps = 16;
constexpr int64_t kRouteGroupMaxE = 32 * 8;  // RouteTokenWarp<8>: E ≤ 256 routed experts
struct RouteGroupSmem {
  union {
    RouteWarpSmem<8> route[kRouteGroupWarps];
    int32_t group[GroupSmemInts(kRouteGroupMaxE + 1)];
  };
};

static_assert(sizeof(RouteGroupSmem) <= 48 * 1024, "MoeRouteGroupSplitKernel: no dynamic shared memory opt-in");

__global__ void __launch_bounds__(kSortThreads)
    MoeRouteGroupSplitKernel(const float* logits, const float* bias, int64_t T, int64_t E, int k, bool renormalize,
                             float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights,
                             int64_t E_group, ExpertGroups g, const float* z, int64_t De, uint16_t* z_parts) {
  float b[8];  // read by the routing warps only: the others of block 0 load nothing
  if (blockIdx.x == 0 && threadIdx.x < 32 * kRouteGroupWarps) LoadLaneBias<8>(bias, E, b);
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  if (blockIdx.x > 0) {
    SplitRows(z, T, De, z_parts, (blockIdx.x - 1) * int64_t{blockDim.x} + threadIdx.x,
              int64_t{gridDim.x - 1} * blockDim.x);
    return;
  }
  extern __shared__ __align__(16) uint8_t route_group_smem[];
  RouteGroupSmem& sm = *reinterpret_cast<RouteGroupSmem*>(route_group_smem);
  const int warp = threadIdx.x / 32;
  for (int64_t t = warp; warp < kRouteGroupWarps && t < T; t += kRouteGroupWarps) {
    RouteTokenWarp<8>(logits, b, t, E, k, renormalize, scaling, combine_biased, append, idx, weights,
                      sm.route[warp]);
  }
  __syncthreads();  // every token's idx written (and the route's shared memory free for the grouping)
  const int64_t ks = append >= 0 ? k + 1 : k;
  if (T * ks <= kGroupWarpMaxSlots) {
    if (warp == 0) GroupByExpertWarp(idx, T * ks, E_group, g.order, g.pos, g.active, g.begin, g.num_active);
    return;
  }
  GroupByExpertBlock(idx, T * ks, E_group, g.order, g.pos, g.active, g.begin, g.num_active, sm.group);
}

// h[g] = GLU(Σ_s gate part, Σ_s up part) (slices in order), split for the down MMAs.
__global__ void GluSplitKernel(const float* part, int64_t splits, int64_t n, int64_t I, int kind, float b1,
                               bool has_b2, float b2, uint16_t* h_parts) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t total = n * I;
  for (int64_t idx = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; idx < total;
       idx += int64_t{gridDim.x} * blockDim.x) {
    const int64_t g = idx / I, i = idx % I;
    const float* p = part + g * 2 * I + i;
    float gate = p[0], up = p[I];
    for (int64_t s = 1; s < splits; ++s) {
      gate += p[s * n * 2 * I];
      up += p[s * n * 2 * I + I];
    }
    StoreSplit(GluOf(gate, up, kind, b1, has_b2, b2), g, i, n, I, h_parts);
  }
}

// out[t] = Σ_j weights[t,j] · (Σ_s part[s, pos[t·k + j]]), j ascending, slices in order, each
// product rounded before it is added (no FMA contraction, as the CPU reference): then a slot whose
// expert another EP rank holds adds exactly +0 here, and at top-2 the ranks' sum is the one-rank
// result bit for bit (ExpertStandInTest; a fused w·v + acc rounds once and breaks that). A thread
// per (token, column) (grid: tokens × column blocks), so a token's k · splits loads go out
// together (a thread looping over the columns of a token waited one L2 round trip per column:
// tens of µs at batch 1). The slots go kCombineBatch at a time: their positions and weights
// loaded together, then all their slices, then the adds in j order (a slot at a time, each
// waiting on its position's load, cost ~6 µs at top-8 measured; the arithmetic is unchanged).
constexpr int kCombineThreads = 128;
constexpr int kCombineBatch = 8;
__global__ void __launch_bounds__(kCombineThreads)
    MoeCombineSplitsKernel(const float* __restrict__ part, int64_t splits, int64_t n, const int32_t* __restrict__ pos,
                           const float* __restrict__ weights, int64_t k, int64_t D, float* __restrict__ out) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t t = blockIdx.x, d = int64_t{blockIdx.y} * kCombineThreads + threadIdx.x;
  if (d >= D) return;
  float acc = 0.0f;
  for (int64_t j0 = 0; j0 < k; j0 += kCombineBatch) {
    const float* p[kCombineBatch];
    float wt[kCombineBatch], v[kCombineBatch];
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) {
      const int64_t j = j0 + u < k ? j0 + u : k - 1;  // past k: a copy of the last slot, never added
      p[u] = part + static_cast<int64_t>(pos[t * k + j]) * D + d;
      wt[u] = weights[t * k + j];
    }
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) v[u] = p[u][0];
    for (int64_t s = 1; s < splits; ++s) {
#pragma unroll
      for (int u = 0; u < kCombineBatch; ++u) v[u] += p[u][s * n * D];
    }
#pragma unroll
    for (int u = 0; u < kCombineBatch; ++u) {
      if (j0 + u < k) acc = __fadd_rn(acc, __fmul_rn(wt[u], v[u]));
    }
  }
  out[t * D + d] = acc;
}

__device__ __forceinline__ uint32_t MulBf16x2(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
  return d;
}

// 8 MXFP4 codes (one 32-bit word, element e in bits 4e..4e+3) under E8M0 scale s → the A word
// map: word j = BF16 (element j, element j + 4), each exactly E2M1 × 2^(s−127) as
// DequantizeMxfp4Row and then F32ToBf16 give it. The code's bits are put in place (sign to bit
// 15, exponent and mantissa bits to 8..6), which reads as E2M1 × 2^−126 for every code (0.5
// becomes the BF16 subnormal 2^−127, 0 stays ±0); one BF16 multiply by 2^(s−1) then gives the
// value, exact (at most 2 significant bits, the smallest result 2^−128 is a BF16 subnormal;
// BF16 ops keep subnormals). For s > 128, 2^(s−1) is past BF16's range: ×2^126 (the E2M1 value,
// exact) then ×2^(s−127), which overflows to ±inf exactly where F32 does; s = 255 is NaN.
//
// Mxfp4Multiplier(s) is 2^(s−1) in both halves for s ≤ 128: ((s + 126) << 7) twice, one IMAD.
__device__ __forceinline__ uint32_t Mxfp4Multiplier(uint32_t s) { return s * 0x00800080u + 0x3f003f00u; }

// The codes placed (A word j: codes j and j + 4, each half E2M1 × 2^−126): row-major words, or
// kTiledCodes words in mxfp4_tiled.cuh's bit order (9 instructions for the four, not ~15).
template <bool kTiledCodes>
__device__ __forceinline__ uint4 PlaceX8(uint32_t w) {
  if constexpr (kTiledCodes) {
    const Mxfp4Placed p = Mxfp4PlaceTiled(w);
    return make_uint4(p.a[0], p.a[1], p.a[2], p.a[3]);
  } else {
    uint32_t r[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint32_t v = w << (12 - 4 * j);  // codes j and j + 4 to bits 12..15 and 28..31
      r[j] = (v & 0x80008000u) | ((v & 0x70007000u) >> 6);
    }
    return make_uint4(r[0], r[1], r[2], r[3]);
  }
}

// The codes placed and multiplied by m (both halves the same BF16).
template <bool kTiledCodes = false>
__device__ __forceinline__ uint4 PlaceAndScaleX8(uint32_t w, uint32_t m) {
  const uint4 p = PlaceX8<kTiledCodes>(w);
  return make_uint4(MulBf16x2(p.x, m), MulBf16x2(p.y, m), MulBf16x2(p.z, m), MulBf16x2(p.w, m));
}

// Any scale s (the general path: a round whose four scales of a row include one ≥ 128).
template <bool kTiledCodes = false>
__device__ __forceinline__ uint4 DecodeMxfp4x8(uint32_t w, uint32_t s) {
  if (s <= 128u) return PlaceAndScaleX8<kTiledCodes>(w, Mxfp4Multiplier(s));
  uint4 r = PlaceAndScaleX8<kTiledCodes>(w, (253u << 7) * 0x00010001u);  // ×2^126: the E2M1 values
  uint32_t m2 = s == 255u ? 0x7fc0u : s << 7;              // 2^(s−127), or NaN
  m2 |= m2 << 16;
  r.x = MulBf16x2(r.x, m2);
  r.y = MulBf16x2(r.y, m2);
  r.z = MulBf16x2(r.z, m2);
  r.w = MulBf16x2(r.w, m2);
  return r;
}

// 8 BF16 weights as loaded (word i = elements 2i, 2i+1) → the A word map (elements j, j + 4).
__device__ __forceinline__ uint4 PairBf16x8(const uint4& q) {
  return make_uint4(__byte_perm(q.x, q.z, 0x5410), __byte_perm(q.x, q.z, 0x7632), __byte_perm(q.y, q.w, 0x5410),
                    __byte_perm(q.y, q.w, 0x7632));
}

// f(u, c, h) for every step u, tile c and row half h of a round (unrolled: constant indices).
template <typename F>
__device__ __forceinline__ void ForEachRoundWord(F&& f) {
#pragma unroll
  for (int u = 0; u < 4; ++u) {
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int h = 0; h < 2; ++h) f(u, c, h);
    }
  }
}

// The split x of one token at p (k = kk + 8t .. +7 of its row); the three parts lie `plane`
// elements apart.
__device__ __forceinline__ mma::XParts LoadXParts(const uint16_t* p, int64_t plane) {
  mma::XParts xp;
  xp.hi = __ldg(reinterpret_cast<const uint4*>(p));
  xp.mid = __ldg(reinterpret_cast<const uint4*>(p + plane));
  xp.lo = __ldg(reinterpret_cast<const uint4*>(p + 2 * plane));
  return xp;
}

// Part columns (kPartCols: a light routed load, MoeDecodeExperts' part_columns): an
// MMA tile's 8 columns hold 2 tokens, token i's three x parts in columns 3i (hi), 3i + 1 (mid),
// 3i + 2 (lo), 6 and 7 padding, instead of 8 tokens whose parts are three chained MMAs
// (mma::Step). Most of K3's active experts hold one or two tokens (16 of 896), so 7 of 8 columns
// were padding: now a 32-k step is 2 MMAs and one 16-byte x load a tile where it was 6 and 3.
// Each part is summed on its own (a step's two MMAs from zero, added in F32), the three added at
// the end (lo + mid, then hi): another fixed order, the same for every token whatever the batch.
// A launch with a shared expert riding as expert E (every token) keeps 8 tokens a tile, which
// its one large group needs (docs/cuda.md "Part columns").
template <bool kPartCols>
constexpr int kTileTokens = kPartCols ? 2 : 8;
template <bool kPartCols>
using XTile = std::conditional_t<kPartCols, uint4, mma::XParts>;

template <bool kPartCols>
__device__ __forceinline__ XTile<kPartCols> LoadXTile(const uint16_t* p, int64_t plane) {
  if constexpr (kPartCols) {
    return __ldg(reinterpret_cast<const uint4*>(p));  // this lane's column's part: one load
  } else {
    return LoadXParts(p, plane);
  }
}

// A step of 32 k on a tile: mma::Step's six MMAs, or for part columns its two of one part (words
// .x/.y, then .z/.w, from zero), their sum added to acc in F32.
__device__ __forceinline__ void StepTile(float (&acc)[4], const uint4& row_g, const uint4& row_g8,
                                         const mma::XParts& xp) {
  mma::Step(acc, row_g, row_g8, xp);
}
__device__ __forceinline__ void StepTile(float (&acc)[4], const uint4& row_g, const uint4& row_g8, const uint4& x) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  mma::Mma(d, row_g.x, row_g8.x, row_g.y, row_g8.y, x.x, x.y);
  mma::Mma(d, row_g.z, row_g8.z, row_g.w, row_g8.w, x.z, x.w);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += d[i];
}

// Grid (row blocks, k splits, max active experts); kTT token tiles of kTileTokens per pass over
// the k slice (more tokens: more passes, each a re-read of the slice; the host sizes kTT so a
// decode step rarely needs two). part: [splits, n, 2N] (gate at [.., i], up at [.., N + i]) or [splits, n, N].
// Needs N and K multiples of 32 and 16-byte aligned weights (MoeDecodeSupported); scales_vec:
// K a multiple of 128 and 4-byte aligned scale rows, so a round's 4 scales are one load.
// Blocks per multiprocessor the registers must allow: 3 (≤ 168 registers), 4 (≤ 128) for one
// tile, the decode's case: ncu found the MXFP4 kernel latency-bound at 3 warps a scheduler.
// ptxas -v, sm_90a: 1 tile 128 registers, 2 and 4 tiles 148-168; BF16 up to 20 bytes spilled,
// MXFP4 up to 112 (its tiled and row-major round loops side by side), none inside a round loop
// (the SASS).
constexpr int kMmaMinBlocks = 3;

struct MmaArgs {
  const uint16_t* x_parts = nullptr;  // [3, x_rows, K] split x, PackedPos order
  int64_t x_rows = 0;
  GroupArgs ga;
  int64_t N = 0, K = 0;                          // each weight [N, K]
  const void* const* wa = nullptr;               // per expert: W1 (gate/up) or W2 (down)
  const void* const* wb = nullptr;               // W3 (gate/up)
  const uint8_t* const* sa = nullptr;            // their MXFP4 scales
  const uint8_t* const* sb = nullptr;
  bool scales_vec = false;
  int64_t slice = 0, n = 0;                      // k per slice; slots of the step
  float* part = nullptr;
  bool tiled = false;  // BF16 weights decode-tiled (decode_tiled.cuh) or MXFP4 codes tiled (mxfp4_tiled.cuh)
};

template <int kFmt, bool kGateUp, int kTT, bool kPartCols = false>
__global__ void __launch_bounds__(kMmaWarps * 32, kTT == 1 ? kMmaMinBlocks + 1 : kMmaMinBlocks)
    ExpertMmaKernel(MmaArgs args) {
  constexpr int kTok = kTileTokens<kPartCols>;
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const uint16_t* __restrict__ x_parts = args.x_parts;
  const int64_t x_rows = args.x_rows, N = args.N, K = args.K, slice = args.slice, n = args.n;
  const GroupArgs& ga = args.ga;
  const void* const* wa = args.wa;
  const void* const* wb = args.wb;
  const uint8_t* const* sa = args.sa;
  const uint8_t* const* sb = args.sb;
  const bool scales_vec = args.scales_vec;
  float* __restrict__ part = args.part;
  __shared__ __align__(16) uint32_t xchg[kMmaWarps][4][8 * kTransposeStride];  // MXFP4 only
  const int num_active = *ga.num_active;
  if (static_cast<int>(blockIdx.z) >= num_active) return;
  // The last active expert's blocks first: with the shared expert as expert E (MoeSharedAsExpert)
  // that is the one every token chose, whose blocks run longest (up to 8 token tiles against
  // 1-2); started last, after every routed expert's, they were the launch's tail (the whole 48B
  // at batch 64: +1.8 ms a step). Which block does which expert changes no sum.
  const int a = blockIdx.z == 0 ? num_active - 1 : static_cast<int>(blockIdx.z) - 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t r0 = (int64_t{blockIdx.x} * kMmaWarps + warp) * kRowsPerWarp<kGateUp>;
  if (r0 >= N) return;  // the whole warp; nothing below syncs the block
  const int32_t e = ga.active[a];
  const void* const w_tile[2] = {wa[e], kGateUp ? wb[e] : wa[e]};
  const uint8_t* const s_tile[2] = {kFmt == kMxfp4 ? sa[e] : nullptr,
                                    kFmt == kMxfp4 ? (kGateUp ? sb[e] : sa[e]) : nullptr};
  const int64_t row_tile[2] = {r0, kGateUp ? r0 : r0 + 16};
  const int64_t k_begin = int64_t{blockIdx.y} * slice;
  const int64_t k_end = k_begin + slice < K ? k_begin + slice : K;
  const int64_t out_w = kGateUp ? 2 * N : N;
  part += int64_t{blockIdx.y} * n * out_w;
  const int32_t g0 = ga.begin[a], g1 = ga.begin[a + 1];
  const int64_t plane = x_rows * K;
  for (int32_t p0 = g0; p0 < g1; p0 += kTok * kTT) {
    const int tiles = min(kTT, (g1 - p0 + kTok - 1) / kTok);  // the same for the whole warp
    // This lane's x row of each token tile at the slice's start, k = k_begin + 8t, advanced a
    // round at a time: column g's token (part columns: token g / 3's part g % 3). A padding column
    // (no token) reads the group's first token: an MMA output column depends on its own B column
    // alone, and a padding column's outputs are never stored.
    const uint16_t* x_lane[kTT];
#pragma unroll
    for (int r = 0; r < kTT; ++r) {
      const int col_token = kPartCols ? g / 3 : g;
      const bool real = (!kPartCols || g < 6) && p0 + kTok * r + col_token < g1;
      const int32_t gr = real ? p0 + kTok * r + col_token : p0;
      const int64_t xrow = kGateUp ? ga.order[gr] / ga.k : gr;
      x_lane[r] = x_parts + (kPartCols && real ? g % 3 * plane : 0) + xrow * K + k_begin + 8 * t;
    }
    // BF16: this lane's weight row g of each tile at k = k_begin + 8t (row g + 8: + 8K), advanced
    // a round at a time. MXFP4: its code and scale pointers of each (tile, half), the same way
    // (tiled codes: the lane's 16-byte chunk of the round's tile, mxfp4_tiled.cuh).
    [[maybe_unused]] const uint16_t* w_lane[2];
    [[maybe_unused]] const uint8_t* qp[2][2];
    [[maybe_unused]] const uint8_t* sp[2][2];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
      if constexpr (kFmt == kMxfp4) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int64_t row = row_tile[c] + g + 8 * h;
          qp[c][h] = static_cast<const uint8_t*>(w_tile[c]) + (args.tiled ? Mxfp4TiledRow(row, K) + Mxfp4TiledK(k_begin + 8 * t)
                                                                          : (row * K + k_begin) / 2 + 16 * t);
          sp[c][h] = s_tile[c] + row * (K / 32) + k_begin / 32;
        }
      } else {
        // Tiled: row_tile[c] is a multiple of 16 and k_begin of 128, so the row and k parts of
        // DecodeTiledRow + DecodeTiledK add to the chunk's place (row g + 8: + 256).
        w_lane[c] = static_cast<const uint16_t*>(w_tile[c]) +
                    (args.tiled ? DecodeTiledRow(row_tile[c] + g, K) + DecodeTiledK(k_begin) + 8 * t
                                : (row_tile[c] + g) * K + k_begin + 8 * t);
      }
    }
    float acc[2][kTT][4];
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int r = 0; r < kTT; ++r) {
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[c][r][i] = 0.0f;
      }
    }
    // A round of 128 k at kb. kFull: all of it inside the slice (every round but a last slice's
    // partial one when K is not a multiple of 128), so none of the step and scale-group checks:
    // the same loads of the same values, so the same bits (DecodeGemm's full rounds, decode_gemm.cu:
    // there ~58% of the loop's SASS was such checks and 64-bit addresses). The pointers move on
    // after every round, full or not.
    // kTiled: the weights decode-tiled (BF16) or the codes tiled (MXFP4). Each layout's rounds
    // are a loop of their own (below), so the tiled loads' offsets are constants: with the
    // strides chosen at run time the 1-tile kernels spilled inside the loop (ptxas -v, 68 bytes).
    auto round = [&](int64_t kb, auto full, auto tiled) {
      constexpr bool kFull = decltype(full)::value;
      constexpr bool kTiled = decltype(tiled)::value;
      const auto in_slice = [&](int u) { return kFull || kb + 32 * u < k_end; };  // step u of the round
      if constexpr (kFmt == kMxfp4) {
        uint4 q[2][2];
        uint32_t sc[2][2];
        // This lane's scale group is in the slice (row-major); a tiled chunk spans the round's
        // four groups, all inside the weight (k % 128 == 0), so it is loaded whole.
        const bool mine = kFull || kTiled || kb + 32 * t < k_end;
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
          for (int h = 0; h < 2; ++h) q[c][h] = mine ? mma::LoadStreaming(qp[c][h]) : make_uint4(0, 0, 0, 0);
        }
        if (scales_vec) {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int h = 0; h < 2; ++h) sc[c][h] = __ldg(reinterpret_cast<const uint32_t*>(sp[c][h]));
          }
        } else {
#pragma unroll
          for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              uint32_t v = 0;
#pragma unroll
              for (int u = 0; u < 4; ++u) {
                if (in_slice(u)) v |= static_cast<uint32_t>(__ldg(sp[c][h] + u)) << (8 * u);
              }
              sc[c][h] = v;
            }
          }
        }
        // Step 0's x (tile 0) now, so its latency passes under the exchange and the decode.
        XTile<kPartCols> x0 = LoadXTile<kPartCols>(x_lane[0], plane);
        // Row-major: exchange within each quad, lane t getting word t of the groups of lanes
        // 0..3, so its word u holds k = kb + 32u + 8t .. +7 (step u's codes at BF16's positions).
        // Tiled codes come in that order.
        if constexpr (!kTiled) {
          uint32_t* ex = xchg[warp][0];
#pragma unroll
          for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              uint32_t* b = ex + (2 * c + h) * 8 * kTransposeStride + g * kTransposeStride;
              b[0 * 4 + t] = q[c][h].x;
              b[1 * 4 + t] = q[c][h].y;
              b[2 * 4 + t] = q[c][h].z;
              b[3 * 4 + t] = q[c][h].w;
            }
          }
          __syncwarp();
#pragma unroll
          for (int c = 0; c < 2; ++c) {
#pragma unroll
            for (int h = 0; h < 2; ++h) {
              q[c][h] = *reinterpret_cast<const uint4*>(ex + (2 * c + h) * 8 * kTransposeStride +
                                                        g * kTransposeStride + 4 * t);
            }
          }
          __syncwarp();  // the next round's stores wait for these loads
        }
        // Scales under 128 (all real checkpoints' so far) take one IMAD per word for the multiplier;
        // a round where one of the lane's scales is ≥ 128 takes the general decode (the same values).
        // One branch a step, not one a word: the per-word branch cost nearly as much as the decode.
        // Each step is decoded just before its MMAs (16 live words, not 64), and tile 0's x of
        // the next step is loaded before this step's decode, so the loads wait under the work.
        const bool small_scales = ((sc[0][0] | sc[0][1] | sc[1][0] | sc[1][1]) & 0x80808080u) == 0;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (!in_slice(u)) break;  // past the slice: the same for every token
          XTile<kPartCols> x0_next;
          if (u < 3 && in_slice(u + 1)) x0_next = LoadXTile<kPartCols>(x_lane[0] + 32 * (u + 1), plane);
          uint4 w[2][2];
          const auto word = [&](int c, int h) {
            return u == 0 ? q[c][h].x : u == 1 ? q[c][h].y : u == 2 ? q[c][h].z : q[c][h].w;
          };
          if (small_scales) {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                w[c][h] = PlaceAndScaleX8<kTiled>(word(c, h), Mxfp4Multiplier(__byte_perm(sc[c][h], 0, 0x4440u | u)));
              }
            }
          } else {
#pragma unroll
            for (int c = 0; c < 2; ++c) {
#pragma unroll
              for (int h = 0; h < 2; ++h) {
                w[c][h] = DecodeMxfp4x8<kTiled>(word(c, h), __byte_perm(sc[c][h], 0, 0x4440u | u));
              }
            }
          }
#pragma unroll
          for (int r = 0; r < kTT; ++r) {
            if (r < tiles) {
              const XTile<kPartCols> xp = r == 0 ? x0 : LoadXTile<kPartCols>(x_lane[r] + 32 * u, plane);
#pragma unroll
              for (int c = 0; c < 2; ++c) StepTile(acc[c][r], w[c][0], w[c][1], xp);
            }
          }
          if (u < 3) x0 = x0_next;
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) {
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            qp[c][h] += kTiled ? 1024 : kRoundK / 2;
            sp[c][h] += kRoundK / 32;
          }
        }
      } else {
        // The round's weights: [step][tile][half] as A words (rows g and g + 8 of each tile);
        // elements from row g to row g + 8, from step u to u + 1, from a round to the next.
        [[maybe_unused]] const int64_t half_rows = kTiled ? 256 : 8 * K;
        constexpr int64_t step_k = kTiled ? 1024 : 32, round_k = kTiled ? 4096 : kRoundK;
        uint4 wr[4][2][2];
        ForEachRoundWord([&](int u, int c, int h) {  // all the round's loads first, then the pairing
          wr[u][c][h] = in_slice(u) ? mma::LoadStreaming(w_lane[c] + h * half_rows + step_k * u) : make_uint4(0, 0, 0, 0);
        });
        ForEachRoundWord([&](int u, int c, int h) { wr[u][c][h] = PairBf16x8(wr[u][c][h]); });
#pragma unroll
        for (int u = 0; u < 4; ++u) {
          if (!in_slice(u)) break;  // past the slice: the same for every token
#pragma unroll
          for (int r = 0; r < kTT; ++r) {
            if (r < tiles) {
              const XTile<kPartCols> xp = LoadXTile<kPartCols>(x_lane[r] + 32 * u, plane);
#pragma unroll
              for (int c = 0; c < 2; ++c) StepTile(acc[c][r], wr[u][c][0], wr[u][c][1], xp);
            }
          }
        }
#pragma unroll
        for (int c = 0; c < 2; ++c) w_lane[c] += round_k;
      }
#pragma unroll
      for (int r = 0; r < kTT; ++r) x_lane[r] += kRoundK;
    };
    const int64_t full_end = k_begin + (k_end - k_begin) / kRoundK * kRoundK;
    int64_t kb = k_begin;
    const auto rounds = [&](auto tiled) {
      for (; kb < full_end; kb += kRoundK) round(kb, std::true_type{}, tiled);
      if (kb < k_end) round(kb, std::false_type{}, tiled);
    };
    if (args.tiled) {
      rounds(std::true_type{});
    } else {
      rounds(std::false_type{});
    }
    // D fragment: regs 0, 1 are output row g, columns 2t and 2t+1 of the tile; regs 2, 3 row g + 8.
#pragma unroll
    for (int c = 0; c < 2; ++c) {
#pragma unroll
      for (int r = 0; r < kTT; ++r) {
        if constexpr (kPartCols) {
          // Token 0's parts are columns 0, 1 (lane t = 0) and 2 (t = 1's reg 0 / 2); token 1's
          // column 3 (t = 1's reg 1 / 3), 4 and 5 (t = 2's). Lane t takes lane t + 1's sums and
          // t = 0, 1 store token t.
          float nb[4];
#pragma unroll
          for (int i = 0; i < 4; ++i) nb[i] = __shfl_sync(0xffffffffu, acc[c][r][i], lane + 1);
          const int32_t gr = p0 + kTok * r + t;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float hi = t == 0 ? acc[c][r][2 * h] : acc[c][r][2 * h + 1];
            const float mid = t == 0 ? acc[c][r][2 * h + 1] : nb[2 * h];
            const float lo = t == 0 ? nb[2 * h] : nb[2 * h + 1];
            const int64_t row = row_tile[c] + g + 8 * h;
            if (t < 2 && r < tiles && gr < g1) part[gr * out_w + (kGateUp && c == 1 ? N : 0) + row] = (lo + mid) + hi;
          }
        } else {
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int32_t gr = p0 + 8 * r + 2 * t + (i & 1);
            const int64_t row = row_tile[c] + g + (i >> 1) * 8;
            if (r < tiles && gr < g1) part[gr * out_w + (kGateUp && c == 1 ? N : 0) + row] = acc[c][r][i];
          }
        }
      }
    }
  }
}

struct DecodePlan {
  KSplit gate_up, down;
  int64_t n = 0;
  size_t z_bytes = 0, gu_bytes = 0, h_bytes = 0, dn_bytes = 0;
};

size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

DecodePlan MakeDecodePlan(int64_t T, int64_t k, int64_t De, int64_t I) {
  DecodePlan p;
  p.gate_up = SplitK(kRowsPerBlock<true>, I, De, k);
  p.down = SplitK(kRowsPerBlock<false>, De, I, k);
  p.n = T * k;
  p.z_bytes = Align256(static_cast<size_t>(3 * T * De) * sizeof(uint16_t));
  p.gu_bytes = Align256(static_cast<size_t>(p.gate_up.splits * p.n * 2 * I) * sizeof(float));
  p.h_bytes = Align256(static_cast<size_t>(3 * p.n * I) * sizeof(uint16_t));
  p.dn_bytes = Align256(static_cast<size_t>(p.down.splits * p.n * De) * sizeof(float));
  return p;
}

unsigned GridFor(int64_t total) { return static_cast<unsigned>(std::clamp<int64_t>((total + 255) / 256, 1, 65536)); }

template <int kFmt, bool kGateUp>
void LaunchMmaTiles(int tt, bool part_columns, dim3 grid, const MmaArgs& a, cudaStream_t s) {
  const auto launch = [&](auto part_cols) {
    constexpr bool kCols = decltype(part_cols)::value;
    switch (tt) {
      case 1: LaunchPdl("ExpertMma", ExpertMmaKernel<kFmt, kGateUp, 1, kCols>, grid, dim3(kMmaWarps * 32), 0, s, a); break;
      case 2: LaunchPdl("ExpertMma", ExpertMmaKernel<kFmt, kGateUp, 2, kCols>, grid, dim3(kMmaWarps * 32), 0, s, a); break;
      default: LaunchPdl("ExpertMma", ExpertMmaKernel<kFmt, kGateUp, 4, kCols>, grid, dim3(kMmaWarps * 32), 0, s, a); break;
    }
  };
  part_columns ? launch(std::true_type{}) : launch(std::false_type{});
}

template <int kFmt>
void LaunchDecode(const DecodePlan& p, int tt, bool part_columns, const uint16_t* z_parts, int64_t T,
                  const GroupArgs& ga, int64_t max_active, int64_t De, int64_t I, const ExpertPointerTable& w,
                  bool scales_vec, float* gu_part, uint16_t* h_parts, float* dn_part, int kind, float beta,
                  bool has_linear_beta, float linear_beta, cudaStream_t s) {
  const dim3 gu_grid(static_cast<unsigned>((I + kRowsPerBlock<true> - 1) / kRowsPerBlock<true>),
                     static_cast<unsigned>(p.gate_up.splits), static_cast<unsigned>(max_active));
  LaunchMmaTiles<kFmt, true>(tt, part_columns, gu_grid,
                             MmaArgs{z_parts, T, ga, I, De, w.gate, w.up, w.gate_scales, w.up_scales, scales_vec,
                                     p.gate_up.slice, p.n, gu_part, w.tiled},
                             s);
  CheckLaunch("ExpertMma gate/up");
  LaunchPdl("GluSplit", GluSplitKernel, dim3(GridFor(p.n * I)), dim3(256), 0, s, static_cast<const float*>(gu_part),
            p.gate_up.splits, p.n, I, kind, beta, has_linear_beta, linear_beta, h_parts);
  CheckLaunch("GluSplit");
  const dim3 dn_grid(static_cast<unsigned>((De + kRowsPerBlock<false> - 1) / kRowsPerBlock<false>),
                     static_cast<unsigned>(p.down.splits), static_cast<unsigned>(max_active));
  LaunchMmaTiles<kFmt, false>(tt, part_columns, dn_grid,
                              MmaArgs{h_parts, p.n, ga, De, I, w.down, w.down, w.down_scales, w.down_scales,
                                      scales_vec, p.down.slice, p.n, dn_part, w.tiled},
                              s);
  CheckLaunch("ExpertMma down");
}

}  // namespace

void MoeGroupByExpert(const int32_t* idx, int64_t n, int64_t E, const ExpertGroups& g, cudaStream_t s) {
  if (n == 0) return;
  if (n <= kGroupWarpMaxSlots) {
    LaunchPdl("GroupByExpert", GroupByExpertWarpKernel, dim3(1), dim3(32), 0, s, idx, n, E, g.order, g.pos, g.active,
              g.begin, g.num_active);
    CheckLaunch("GroupByExpert");
    return;
  }
  // kGroupChunks placing warps where their cursors fit the 48 KB (E ≤ 1,024), else one.
  const bool chunked = GroupSmemInts(E, kGroupChunks) * sizeof(int32_t) <= 48 * 1024;
  const size_t shared = static_cast<size_t>(GroupSmemInts(E, chunked ? kGroupChunks : 1)) * sizeof(int32_t);
  if (shared > 48 * 1024) {
    std::fprintf(stderr, "kimirt: MoE of %lld experts (the CUDA grouping takes up to %d)\n",
                 static_cast<long long>(E), 48 * 1024 / 8 - kSortThreads);
    std::abort();
  }
  LaunchPdl("GroupByExpert", chunked ? GroupByExpertKernel<kGroupChunks> : GroupByExpertKernel<1>, dim3(1),
            dim3(kSortThreads), shared, s, idx, n, E, g.order, g.pos, g.active, g.begin, g.num_active);
  CheckLaunch("GroupByExpert");
}

void MoeGroupedExperts(const float* z, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De, int64_t I,
                       const ExpertPointerTable& w, int format, int kind, float beta, bool has_linear_beta,
                       float linear_beta, float* h, float* grouped, cudaStream_t s) {
  if (max_active == 0) return;
  if (w.tiled) {
    std::fprintf(stderr, "kimirt: MoeGroupedExperts reads row-major weights, got decode-tiled experts\n");
    std::abort();
  }
  const GroupArgs ga{g.order, g.active, g.begin, g.num_active, k};
  switch (format) {
    case kF32: LaunchExperts<kF32>(z, ga, max_active, De, I, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s); break;
    case kBf16: LaunchExperts<kBf16>(z, ga, max_active, De, I, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s); break;
    case kMxfp4:
      if (De % 32 != 0 || I % 32 != 0) {
        std::fprintf(stderr, "kimirt: MXFP4 experts of widths %lld x %lld (multiples of 32 needed)\n",
                     static_cast<long long>(De), static_cast<long long>(I));
        std::abort();
      }
      LaunchExperts<kMxfp4>(z, ga, max_active, De, I, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s);
      break;
    default: std::abort();
  }
}

bool MoeDecodeSupported(int64_t De, int64_t I, int format, bool weights_aligned) {
  return (format == kBf16 || format == kMxfp4) && De > 0 && I > 0 && De % 32 == 0 && I % 32 == 0 && weights_aligned;
}

size_t MoeDecodeScratchBytes(int64_t T, int64_t k, int64_t De, int64_t I) {
  const DecodePlan p = MakeDecodePlan(T, k, De, I);
  return p.z_bytes + p.gu_bytes + p.h_bytes + p.dn_bytes;
}

int MoeDecodeTokenTiles(int64_t T, int64_t k, int64_t E, bool part_columns) {
  // By T: an expert has at most T tokens (a token chooses distinct experts), so up to 32 tokens
  // one pass covers any expert of the step; at 33..64 an expert chosen by more than 32 tokens
  // (rare: k/E of them on average) takes a second pass, while 8 tiles' registers would cost every
  // block occupancy. Part columns (2 tokens a tile): up to 8 tokens, then more passes.
  const int64_t tok = part_columns ? kTileTokens<true> : kTileTokens<false>;
  const int by_t = T <= tok ? 1 : T <= 2 * tok ? 2 : 4;
  if (E <= 0) return by_t;
  // Tiles for 4x the mean group T·k/E; part columns: for the mean group, so K3's 16 of 896 keeps
  // one tile (two tokens) up to batch 64 — the two-tile kernel's registers (3 blocks a
  // multiprocessor) cost 0.77x at batch 64 on an H100, more than the second passes of the groups
  // of three or more tokens (their re-read: ~16% more bytes at batch 64 by a Poisson estimate).
  const int64_t want = part_columns ? 1 : 4;
  const int64_t tiles = (want * T * k + tok * E - 1) / (tok * E);
  return tiles <= 1 ? 1 : std::min(tiles <= 2 ? 2 : 4, by_t);
}

int64_t MoeDecodeSplits(int64_t De, int64_t I, int64_t k, bool gate_up) {
  return gate_up ? SplitK(kRowsPerBlock<true>, I, De, k).splits : SplitK(kRowsPerBlock<false>, De, I, k).splits;
}

void MoeDecodeExperts(const float* z, int64_t T, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De,
                      int64_t I, const ExpertPointerTable& w, int format, bool scales_vec, int kind, float beta,
                      bool has_linear_beta, float linear_beta, const float* weights, void* scratch, float* out,
                      cudaStream_t s, bool z_split_done, int token_tiles, bool part_columns) {
  if (T == 0) return;
  if (!MoeDecodeSupported(De, I, format, true) || T > kGemvMaxRows || k < 1) {
    std::fprintf(stderr, "kimirt: decode MoE of %lld tokens, widths %lld x %lld, format %d (needs <= %lld tokens, "
                 "BF16 or MXFP4, widths multiples of 32)\n", static_cast<long long>(T), static_cast<long long>(De),
                 static_cast<long long>(I), format, static_cast<long long>(kGemvMaxRows));
    std::abort();
  }
  const DecodePlan p = MakeDecodePlan(T, k, De, I);
  char* base = static_cast<char*>(scratch);
  auto* z_parts = reinterpret_cast<uint16_t*>(base);
  auto* gu_part = reinterpret_cast<float*>(base + p.z_bytes);
  auto* h_parts = reinterpret_cast<uint16_t*>(base + p.z_bytes + p.gu_bytes);
  auto* dn_part = reinterpret_cast<float*>(base + p.z_bytes + p.gu_bytes + p.h_bytes);
  if (!z_split_done) {
    LaunchPdl("MoE split z", SplitRowsKernel, dim3(GridFor(T * De)), dim3(256), 0, s, z, T, De, z_parts);
    CheckLaunch("MoE split z");
  }
  const int tt = token_tiles > 0 ? token_tiles : MoeDecodeTokenTiles(T, k, 0, part_columns);
  const GroupArgs ga{g.order, g.active, g.begin, g.num_active, k};
  if (format == kMxfp4) {
    LaunchDecode<kMxfp4>(p, tt, part_columns, z_parts, T, ga, max_active, De, I, w, scales_vec, gu_part, h_parts,
                         dn_part, kind, beta, has_linear_beta, linear_beta, s);
  } else {
    LaunchDecode<kBf16>(p, tt, part_columns, z_parts, T, ga, max_active, De, I, w, false, gu_part, h_parts, dn_part,
                        kind, beta, has_linear_beta, linear_beta, s);
  }
  const dim3 combine_grid(static_cast<unsigned>(T),
                          static_cast<unsigned>((De + kCombineThreads - 1) / kCombineThreads));
  LaunchPdl("MoeCombine", MoeCombineSplitsKernel, combine_grid, dim3(kCombineThreads), 0, s,
            static_cast<const float*>(dn_part), p.down.splits, p.n, g.pos, weights, k, De, out);
  CheckLaunch("MoeCombine");
}

// Row-major word i (codes row, kk .. kk+7) → its place and bit order in mxfp4_tiled.cuh's layout.
__global__ void TileMxfp4CodesKernel(const uint32_t* __restrict__ src, uint8_t* __restrict__ dst, int64_t n,
                                     int64_t k) {
  const int64_t words = n * k / 8;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < words; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t row = i / (k / 8), kk = i % (k / 8) * 8;
    *reinterpret_cast<uint32_t*>(dst + Mxfp4TiledRow(row, k) + Mxfp4TiledK(kk)) = Mxfp4TileWord(src[i]);
  }
}

void TileMxfp4Codes(const void* codes, void* tiled, int64_t n, int64_t k, cudaStream_t s) {
  if (!Mxfp4Tileable(n, k) || reinterpret_cast<uintptr_t>(codes) % 16 != 0 || reinterpret_cast<uintptr_t>(tiled) % 16 != 0) {
    std::fprintf(stderr, "kimirt: TileMxfp4Codes needs n %% 16 == 0, k %% 128 == 0 and 16-byte aligned buffers, "
                         "got n=%lld k=%lld\n", static_cast<long long>(n), static_cast<long long>(k));
    std::abort();
  }
  const int64_t words = n * k / 8;
  TileMxfp4CodesKernel<<<static_cast<unsigned>(std::min<int64_t>((words + 255) / 256, 65536)), 256, 0, s>>>(
      static_cast<const uint32_t*>(codes), static_cast<uint8_t*>(tiled), n, k);
  CheckLaunch("TileMxfp4Codes");
}

void DequantizeMxfp4(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out, cudaStream_t s) {
  if (n == 0) return;
  DequantizeMxfp4Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(codes, scales, n, out);
  CheckLaunch("DequantizeMxfp4");
}

void MoeRoute(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
              float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights, cudaStream_t s) {
  if (k < 1 || k > kMaxTopK || k > E) {
    std::fprintf(stderr, "kimirt: MoE top-%lld of %lld experts (the CUDA router takes k in 1..%d)\n",
                 static_cast<long long>(k), static_cast<long long>(E), kMaxTopK);
    std::abort();
  }
  if (T == 0) return;
  if (E <= kRouteMaxE) {
    LaunchPdl("MoeRoute", E <= 32 * 8 ? MoeRouteWarpKernel<8> : MoeRouteWarpKernel<32>,
              dim3(static_cast<unsigned>((T + kRouteWarps - 1) / kRouteWarps)), dim3(kRouteWarps * 32), 0, s, logits,
              bias, T, E, static_cast<int>(k), renormalize, scaling, combine_biased, append, idx, weights);
    CheckLaunch("MoeRoute");
    return;
  }
  MoeRouteSerial(logits, bias, T, E, k, renormalize, scaling, combine_biased, append, idx, weights, s);
}

bool MoeRouteGroupSplitSupported(int64_t T, int64_t E, int64_t k, int64_t E_group) {
  return T >= 1 && T <= kGemvMaxRows && E >= 1 && E <= kRouteGroupMaxE && k >= 1 && k <= kMaxTopK && k <= E &&
         E_group >= 1 && E_group <= kRouteGroupMaxE + 1;
}

namespace {
std::atomic<uint64_t> route_group_split_calls{0};  // MoeRouteGroupSplitLaunches
}  // namespace

void MoeRouteGroupSplit(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
                        float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights,
                        int64_t E_group, const ExpertGroups& g, const float* z, int64_t De, void* decode_scratch,
                        cudaStream_t s) {
  if (!MoeRouteGroupSplitSupported(T, E, k, E_group)) {
    std::fprintf(stderr, "kimirt: fused MoE route of %lld tokens, top-%lld of %lld experts, %lld groups (needs <= %lld "
                 "tokens, <= %lld experts)\n", static_cast<long long>(T), static_cast<long long>(k),
                 static_cast<long long>(E), static_cast<long long>(E_group), static_cast<long long>(kGemvMaxRows),
                 static_cast<long long>(kRouteGroupMaxE));
    std::abort();
  }
  const auto split_blocks = static_cast<unsigned>(std::clamp<int64_t>((T * De + kSortThreads - 1) / kSortThreads, 1, 1024));
  LaunchPdl("MoeRouteGroupSplit", MoeRouteGroupSplitKernel, dim3(1 + split_blocks), dim3(kSortThreads),
            sizeof(RouteGroupSmem), s, logits, bias, T, E, static_cast<int>(k), renormalize, scaling, combine_biased,
            append, idx, weights, E_group, g, z, De, static_cast<uint16_t*>(decode_scratch));
  CheckLaunch("MoeRouteGroupSplit");
  route_group_split_calls.fetch_add(1, std::memory_order_relaxed);
}

uint64_t MoeRouteGroupSplitLaunches() { return route_group_split_calls.load(std::memory_order_relaxed); }

void MoeRouteSerial(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
                    float scaling, bool combine_biased, int32_t append, int32_t* idx, float* weights,
                    cudaStream_t s) {
  if (k < 1 || k > kMaxTopK || k > E) std::abort();
  if (T == 0) return;
  const int threads = 64;
  LaunchPdl("MoeRouteSerial", MoeRouteKernel, dim3(static_cast<unsigned>((T + threads - 1) / threads)), dim3(threads),
            0, s, logits, bias, T, E, static_cast<int>(k), renormalize, scaling, combine_biased, append, idx, weights);
  CheckLaunch("MoeRouteSerial");
}

void MoeCombine(const float* grouped, const int32_t* pos, const float* weights, int64_t T, int64_t k, int64_t D,
                float* out, cudaStream_t s) {
  if (T == 0 || D == 0) return;
  const dim3 grid(static_cast<unsigned>(T), static_cast<unsigned>((D + kCombineThreads - 1) / kCombineThreads));
  LaunchPdl("MoeCombine", MoeCombineSplitsKernel, grid, dim3(kCombineThreads), 0, s, grouped, int64_t{1}, int64_t{0},
            pos, weights, k, D, out);
  CheckLaunch("MoeCombine");
}

}  // namespace kimirt::cuda
