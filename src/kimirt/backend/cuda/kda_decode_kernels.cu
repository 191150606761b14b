// The fused KDA decode step (kernels.h KdaDecode; kda_decode_args.h): one launch for B sequences
// × H heads, one token each, from the step's projections to the gated-RMSNorm output.
//
// Shape of the work: decode is memory bound on the FP32 state, K·K·4 = 64 KB per head at K = 128,
// read once and written once; everything else per row is a few KB. Two kernels, in variants
// (kernels.h KdaDecodeVariant) that the bench times side by side:
//
// The column kernel (column2, column3): one block per (head, row), one thread per value column
// j: thread j holds S[:, j] (K floats) in registers, so the state is read once and written once,
// and the decay, p = k̂ᵀS, rank-1 update and o = q̂ᵀS run on registers with no synchronization;
// the sums over d run in ascending d as the CPU reference does. Thread j also owns channel
// c = h·K + j of the prologue (conv + SiLU of q, k, v and their windows, the decay gate) and of
// the gated RMSNorm, so the whole head stays in one block and the RMSNorm needs no second pass.
// The state loads are issued first, before the prologue, so their latency (the bulk of a block's
// time) overlaps the prologue's loads and reductions. Register budget (ptxas, sm_90): 199
// registers and no spill uncapped, which leaves 2 blocks (8 warps) per SM; column3 is capped at
// 168 for 3 blocks (~100 bytes spilled).
//
// The split kernel (split*, cluster*; below): a head over 256-512 threads, or over a cluster of
// 2-8 blocks, each thread 4 columns × 4-16 rows as float4, the sums over d short (per thread,
// then a butterfly, then the warps through shared memory), the RMSNorm across a cluster through
// distributed shared memory. More warps and more blocks for the same state (at batch 1, a head
// spread over 2-8 SMs), shorter dependency chains, 16-byte state accesses with streaming hints.
//
// Rows are independent by construction: block (h, b) (or cluster) reads row b's inputs and slot
// slots[b]'s state and writes nothing another row's blocks read, so a row's bits never depend on
// the batch.
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/kda_activations.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/cluster.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace kimirt::cuda {
namespace {

// Both models use 4 taps; the bound lets a channel's taps and window sit in registers.
constexpr int kDecodeMaxConvTaps = 4;

// One channel's conv inputs: the new input, the taps, the window (oldest first). Loaded for q, k
// and v before any window is written, so the three loads go out together instead of one round
// trip each (the compiler cannot move a load above a store that might alias it).
struct ConvChannel {
  float x, tap[kDecodeMaxConvTaps], win[kDecodeMaxConvTaps];
};

__device__ ConvChannel LoadConv(const float* x, const float* taps, int W, const float* win, int64_t P) {
  ConvChannel c;
  c.x = *x;
#pragma unroll
  for (int i = 0; i < kDecodeMaxConvTaps; ++i) {
    c.tap[i] = i < W ? taps[i] : 0.0f;
    c.win[i] = i < W - 1 ? win[i * P] : 0.0f;
  }
  return c;
}

// The short causal conv + SiLU (spec §3.5) of one channel for one token: taps j = 0..W-1 oldest
// first, summed from 0 in that order as the CPU reference.
__device__ float ConvSilu(const ConvChannel& c, int W) {
  const int hist = W - 1;
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kDecodeMaxConvTaps; ++i) {
    if (i < hist) acc += c.tap[i] * c.win[i];
    if (i == hist) acc += c.tap[i] * c.x;
  }
  return KdaSilu(acc);
}

// The channel's window update (spec §5.7): the last W-1 inputs of (window ++ x). win points at
// the channel's column of the slot's [W-1, P] window.
__device__ void WriteWindow(const ConvChannel& c, int W, float* win, int64_t P) {
  const int hist = W - 1;
#pragma unroll
  for (int i = 0; i + 1 < kDecodeMaxConvTaps; ++i) {
    if (i < hist) win[i * P] = i + 1 < hist ? c.win[i + 1] : c.x;
  }
}

__device__ float ConvStep(const ConvChannel& c, int W, float* win, int64_t P) {
  const float y = ConvSilu(c, W);
  WriteWindow(c, W, win, P);
  return y;
}

template <int K, int kMinBlocksPerSm>
__global__ void __launch_bounds__(K, kMinBlocksPerSm) KdaDecodeKernel(KdaDecodeArgs a) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float qn[K], kn[K], decay[K];
  __shared__ float scratch[33];
  const int64_t h = blockIdx.x, b = blockIdx.y;
  const int j = threadIdx.x;
  const int64_t H = a.heads, P = H * K, W = a.conv_taps;
  const int64_t slot = a.slots[b];
  const int64_t c = h * K + j, in = b * P + c;

  // Column j of this head's state: issued first, consumed after the prologue.
  float* Sj = a.recurrent + (slot * H + h) * K * K + j;
  float s[K];
#pragma unroll
  for (int d = 0; d < K; ++d) s[d] = Sj[d * K];

  // Prologue, channel c: conv + SiLU of q, k, v with the slot's windows (spec §5.2).
  const int64_t win = slot * (W - 1) * P + c;
  const int w = static_cast<int>(W);
  const ConvChannel cq = LoadConv(a.q + in, a.conv_q + c * W, w, a.window_q + win, P);
  const ConvChannel ck = LoadConv(a.k + in, a.conv_k + c * W, w, a.window_k + win, P);
  const ConvChannel cv = LoadConv(a.v + in, a.conv_v + c * W, w, a.window_v + win, P);
  // The RMSNorm's per-channel factors, loaded now so no pointer stays live across the core.
  const float wj = a.o_norm[j], sg = KdaSigmoid(a.gate[in]);
  const float eps = a.norm_eps;
  float* out = a.out + in;
  const float beta = KdaSigmoid(a.beta_logits[b * H + h]);
  // Spec §5.3: the per-channel log-decay; the lower bound is reached through the sigmoid.
  const float ea = expf(a.a_log[h]);
  const float xf = a.f[in] + a.dt_bias[c];
  const float alpha = a.has_lower_bound ? a.lower_bound * KdaSigmoid(ea * xf) : -ea * KdaSoftplus(xf);
  const float qc = ConvStep(cq, w, a.window_q + win, P);
  const float kc = ConvStep(ck, w, a.window_k + win, P);
  const float vj = ConvStep(cv, w, a.window_v + win, P);
  // Spec §3.4: L2 norm with eps inside the sqrt of the sum; q scaled by 1/sqrt(K) after.
  const float sq = BlockSum(qc * qc, scratch);
  const float sk = BlockSum(kc * kc, scratch);
  qn[j] = qc * (1.0f / sqrtf(sq + 1e-6f)) * (1.0f / sqrtf(static_cast<float>(K)));
  kn[j] = kc * (1.0f / sqrtf(sk + 1e-6f));
  decay[j] = expf(alpha);
  __syncthreads();

  // Spec §5.4, the CPU reference's order. Steps 1-2: decay, then p_j = Σ_d k̂_d S[d, j].
  float p = 0.0f;
#pragma unroll
  for (int d = 0; d < K; ++d) {
    s[d] *= decay[d];
    p += kn[d] * s[d];
  }
  // Step 3: δ = β (v − p); steps 4-5: rank-1 write, then o = q̂ᵀ S from the updated state.
  const float delta = beta * (vj - p);
  // Reload k̂ from shared memory in the second pass rather than keep the first pass's 128 loads
  // live in registers beside the state (which spills: 256 values > 255 registers).
  asm volatile("" ::: "memory");
  float o = 0.0f;
#pragma unroll
  for (int d = 0; d < K; ++d) {
    s[d] += kn[d] * delta;
    o += qn[d] * s[d];
  }
#pragma unroll
  for (int d = 0; d < K; ++d) Sj[d * K] = s[d];

  // Spec §5.6 / §3.2: gated RMSNorm over the head's K outputs, weight before gate.
  const float ss = BlockSum(o * o, scratch);
  const float rstd = 1.0f / sqrtf(ss / static_cast<float>(K) + eps);
  *out = o * rstd * wj * sg;
}

// --- The split kernels: a head's K×K state over more threads (and, with kCluster > 1, over a
// cluster of blocks), so each thread holds fewer state values and the sums over d are short.
//
// Block `rank` of a head's cluster owns value columns [rank·NC, rank·NC + NC), NC = K / kCluster.
// Thread t holds a 4-column group cg = t % G (G = NC / 4) of the rows of its row slice
// r = t / G: rows [r·RPT, r·RPT + RPT) (R = kThreads / G slices, RPT = K / R rows), as RPT float4
// registers. A warp's load of one register is 512 contiguous bytes of the state in full 128-byte
// lines whatever the split (G·16 bytes × 32 / G rows).
//
// Sums over d (p_j = Σ k̂_d S[d, j], o_j = Σ q̂_d S[d, j]), in a fixed order independent of the
// batch: each thread's rows ascending, then a butterfly over the warp's 32 / G row slices (the
// same bits in every lane: float addition commutes), then the warps ascending through shared
// memory by thread j < NC, which owns column j's δ, output and RMSNorm term. The gated RMSNorm's
// sum of squares: within the block by the NC owners (butterfly, warps ascending), then the
// cluster's blocks by rank through distributed shared memory, the same sum in every block.
//
// Every block computes the conv, l2norm and decay of all K channels of q and k (it needs every
// row d), so the cluster's blocks agree bit for bit on q̂, k̂ and the decay; each writes back
// only its own channels' windows, after the cluster barrier that orders those writes after every
// block's window reads. v, the gate and the output: only the block's NC channels.
//
// kStreamHints: the state is read once and written once per step, and the next read is a whole
// decode step away, so its loads skip L1 (L1::no_allocate) and its stores are marked evict-first
// in L2 (st.global.cs); the bench compares against plain accesses.
template <bool kStreamHints>
__device__ inline float4 LoadState(const float* p) {
  if constexpr (kStreamHints) {
    float4 v;
    asm volatile("ld.global.L1::no_allocate.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "l"(p));
    return v;
  } else {
    return *reinterpret_cast<const float4*>(p);
  }
}

template <bool kStreamHints>
__device__ inline void StoreState(float* p, float4 v) {
  if constexpr (kStreamHints) {
    asm volatile("st.global.cs.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
  } else {
    *reinterpret_cast<float4*>(p) = v;
  }
}

// One channel's conv inputs staged in shared memory.
struct ConvStage {
  float x, tap[kDecodeMaxConvTaps], win[kDecodeMaxConvTaps - 1];
};


// Butterfly sum over the lanes that differ in bits >= `from` (a power of two): every such lane
// gets the same bits.
__device__ inline float LaneSum(float v, int from) {
  for (int off = from; off < 32; off <<= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

template <int K, int kCluster, int kThreads, int kMinBlocksPerSm, bool kStreamHints>
__global__ void __launch_bounds__(kThreads, kMinBlocksPerSm) KdaDecodeSplitKernel(KdaDecodeArgs a) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  constexpr int NC = K / kCluster, G = NC / 4, R = kThreads / G, RPT = K / R, kWarps = kThreads / 32;
  constexpr int kOwnerWarps = (NC + 31) / 32, kGroups = kThreads / K, kHist = kDecodeMaxConvTaps - 1;
  static_assert(K % 32 == 0 && NC % 4 == 0 && G <= 32 && kThreads % K == 0 && kGroups <= 4);
  static_assert(kThreads % G == 0 && K % R == 0 && RPT >= 1, "rows must split evenly over the row slices");
  __shared__ __align__(16) float qn[K], kn[K], decay[K], delta[NC], vs[NC], gate_in[NC], ws[NC], f_in[K], dt_in[K];
  __shared__ float a_log_in[K], beta_in;
  __shared__ ConvStage v_in[NC];
  __shared__ __align__(16) float part[kWarps * NC];  // per-warp partial sums over d, [warp][column]
  __shared__ float new_win[kCluster > 1 ? 2 * kHist * K : 1];  // q, k windows held for the barrier
  __shared__ float2 qk_part[kWarps];
  __shared__ float ss_part[kOwnerWarps];
  __shared__ float ss_block;  // read by the cluster's other blocks
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int rank = kCluster > 1 ? static_cast<int>(blockIdx.x % kCluster) : 0;
  const int64_t h = blockIdx.x / kCluster, b = blockIdx.y;
  const int64_t H = a.heads, P = H * K, W = a.conv_taps;
  const int64_t slot = a.slots[b];
  const int cg = t % G, r = t / G;

  // This thread's rows of its 4 columns: issued first, consumed after the prologue.
  float* S = a.recurrent + ((slot * H + h) * K + r * RPT) * K + rank * NC + cg * 4;
  float4 s[RPT];
#pragma unroll
  for (int i = 0; i < RPT; ++i) s[i] = LoadState<kStreamHints>(S + i * K);

  // Prologue (spec §5.2, §5.3), in roles by groups of K threads (warp-uniform), so no thread
  // holds more than two channels' conv inputs beside its state: channel u = t % K of q, of k and
  // of the decay; v, the gate and the RMSNorm weight of the block's own channel rank·NC + u.
  // 1 group: all four; 2: q + decay, k + v; 4: one each.
  const int g = t / K, u = t % K;
  const bool do_q = kGroups == 1 || g == 0, do_k = kGroups == 1 || g == 1;
  const bool do_decay = kGroups == 1 || (kGroups == 4 ? g == 3 : g == 0);
  const bool do_v = u < NC && (kGroups == 1 ? true : kGroups == 2 ? g == 1 : g == 2);
  const int w = static_cast<int>(W);
  const int64_t win = slot * (W - 1) * P, c = h * K + u, cv = h * K + rank * NC + u;
  // v's conv inputs and the small per-channel inputs (decay, gate, RMSNorm weight) go to shared
  // memory by cp.async before the q, k convs: they then hold no registers while in flight and do
  // not wait behind the q, k window writes (which the compiler cannot move loads above).
  if (do_v) {
    CpAsync4(&v_in[u].x, a.v + b * P + cv, true);
#pragma unroll
    for (int i = 0; i < kDecodeMaxConvTaps; ++i) CpAsync4(&v_in[u].tap[i], a.conv_v + cv * W + i, i < w);
#pragma unroll
    for (int i = 0; i < kHist; ++i) CpAsync4(&v_in[u].win[i], a.window_v + win + i * P + cv, i < w - 1);
    CpAsync4(&gate_in[u], a.gate + b * P + cv, true);
    CpAsync4(&ws[u], a.o_norm + rank * NC + u, true);
  }
  if (do_decay) {
    CpAsync4(&f_in[u], a.f + b * P + c, true);
    CpAsync4(&dt_in[u], a.dt_bias + c, true);
    CpAsync4(&a_log_in[u], a.a_log + h, true);  // a copy per thread: each reads its own
  }
  if (t == 0) CpAsync4(&beta_in, a.beta_logits + b * H + h, true);  // read after a barrier
  float qc = 0.0f, kc = 0.0f;
  // Own channels' windows are written now where no other block reads them (v always; q and k
  // without a cluster); a cluster's blocks all read every q, k window, so those wait in shared
  // memory for the cluster barrier below.
  // held: the shared-memory slot of a q or k channel's new window in a cluster, else the
  // channel's window is written back now (which the compiler cannot move the next loads above).
  auto conv = [&](const float* x, const float* taps, float* window, int64_t ch, auto held) {
    const ConvChannel cc = LoadConv(x + b * P + ch, taps + ch * W, w, window + win + ch, P);
    if constexpr (std::is_same_v<decltype(held), float*>) {
#pragma unroll
      for (int i = 0; i < kHist; ++i) held[i * K] = i + 1 < w - 1 ? cc.win[i + 1] : cc.x;
    } else {
      WriteWindow(cc, w, window + win + ch, P);
    }
    return ConvSilu(cc, w);
  };
  if constexpr (kCluster > 1) {
    if (do_q) qc = conv(a.q, a.conv_q, a.window_q, c, new_win + u);
    if (do_k) kc = conv(a.k, a.conv_k, a.window_k, c, new_win + kHist * K + u);
  } else {
    if (do_q) qc = conv(a.q, a.conv_q, a.window_q, c, nullptr);
    if (do_k) kc = conv(a.k, a.conv_k, a.window_k, c, nullptr);
  }
  CpAsyncWaitAll();  // each thread reads only what it staged itself
  if (do_v) {
    ConvChannel cc;
    cc.x = v_in[u].x;
#pragma unroll
    for (int i = 0; i < kDecodeMaxConvTaps; ++i) {
      cc.tap[i] = v_in[u].tap[i];
      cc.win[i] = i < kHist ? v_in[u].win[i] : 0.0f;
    }
    vs[u] = ConvSilu(cc, w);
    WriteWindow(cc, w, a.window_v + win + cv, P);
  }
  if (do_decay) {
    // Spec §5.3: the per-channel log-decay; the lower bound is reached through the sigmoid.
    const float ea = expf(a_log_in[u]), xf = f_in[u] + dt_in[u];
    decay[u] = expf(a.has_lower_bound ? a.lower_bound * KdaSigmoid(ea * xf) : -ea * KdaSoftplus(xf));
  }
  // Spec §3.4: the l2norms' sums of squares over the K channels, both in one pass (warps
  // without the role add zeros, exactly).
  const float2 sq_w = make_float2(LaneSum(qc * qc, 1), LaneSum(kc * kc, 1));
  if (lane == 0) qk_part[warp] = sq_w;
  __syncthreads();
  float2 sq = qk_part[0];
#pragma unroll
  for (int i = 1; i < kWarps; ++i) sq.x += qk_part[i].x, sq.y += qk_part[i].y;
  if (do_q) qn[u] = qc * (1.0f / sqrtf(sq.x + 1e-6f)) * (1.0f / sqrtf(static_cast<float>(K)));
  if (do_k) kn[u] = kc * (1.0f / sqrtf(sq.y + 1e-6f));
  __syncthreads();

  // Spec §5.4 steps 1-2: decay, then this thread's share of p = k̂ᵀS for its 4 columns.
  float4 p = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const float dd = decay[r * RPT + i], kd = kn[r * RPT + i];
    s[i].x *= dd, s[i].y *= dd, s[i].z *= dd, s[i].w *= dd;
    p.x += kd * s[i].x, p.y += kd * s[i].y, p.z += kd * s[i].z, p.w += kd * s[i].w;
  }
  // Thread j < NC owns column rank·NC + j: its δ, output and RMSNorm term.
  const bool owner = t < NC;
  // The column sums: butterfly over the warp's row slices, then the warps in order.
  auto column_sum = [&](float4 v) {
    v.x = LaneSum(v.x, G), v.y = LaneSum(v.y, G), v.z = LaneSum(v.z, G), v.w = LaneSum(v.w, G);
    if (lane < G) reinterpret_cast<float4*>(part)[warp * G + cg] = v;
    __syncthreads();
    float sum = 0.0f;
    if (owner) {
      sum = part[t];
#pragma unroll
      for (int i = 1; i < kWarps; ++i) sum += part[i * NC + t];
    }
    return sum;
  };
  // Step 3: δ = β (v − p), for every thread holding column j.
  const float pj = column_sum(p);
  if (owner) delta[t] = KdaSigmoid(beta_in) * (vs[t] - pj);
  __syncthreads();
  const float4 dl = reinterpret_cast<const float4*>(delta)[cg];
  // Steps 4-5: rank-1 write, then o = q̂ᵀS from the updated state.
  float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
  for (int i = 0; i < RPT; ++i) {
    const float kd = kn[r * RPT + i], qd = qn[r * RPT + i];
    s[i].x += kd * dl.x, s[i].y += kd * dl.y, s[i].z += kd * dl.z, s[i].w += kd * dl.w;
    o.x += qd * s[i].x, o.y += qd * s[i].y, o.z += qd * s[i].z, o.w += qd * s[i].w;
    StoreState<kStreamHints>(S + i * K, s[i]);
  }
  const float oj = column_sum(o);

  // Spec §5.6 / §3.2: gated RMSNorm over the head's K outputs: the block's NC squares, then the
  // cluster's blocks by rank.
  const float sq_o = LaneSum(oj * oj, 1);
  if (lane == 0 && warp < kOwnerWarps) ss_part[warp] = sq_o;
  __syncthreads();
  float ss = ss_part[0];
#pragma unroll
  for (int i = 1; i < kOwnerWarps; ++i) ss += ss_part[i];
  if constexpr (kCluster > 1) {
    if (t == 0) ss_block = ss;
    // Every block's window reads and ss_block write come before this barrier.
    ClusterArrive();
    ClusterWait();
    ss = LoadClusterShared(&ss_block, 0);
#pragma unroll
    for (int i = 1; i < kCluster; ++i) ss += LoadClusterShared(&ss_block, i);
    // No block may leave while another still reads its ss_block: arrive now, wait at the end.
    ClusterArrive();
    if (owner) {
      const int64_t ch = h * K + rank * NC + t;
#pragma unroll
      for (int i = 0; i < kHist; ++i) {
        if (i < w - 1) {
          a.window_q[win + i * P + ch] = new_win[i * K + rank * NC + t];
          a.window_k[win + i * P + ch] = new_win[(kHist + i) * K + rank * NC + t];
        }
      }
    }
  }
  const float rstd = 1.0f / sqrtf(ss / static_cast<float>(K) + a.norm_eps);
  if (owner) a.out[b * P + cv] = oj * rstd * ws[t] * KdaSigmoid(gate_in[t]);
  if constexpr (kCluster > 1) ClusterWait();
}

}  // namespace

namespace {

// A split variant's launch: grid (H · kCluster, B), the cluster along x.
template <int kCluster, int kThreads, int kMinBlocksPerSm, bool kStreamHints>
void LaunchSplit(const KdaDecodeArgs& a, cudaStream_t s) {
  auto* kernel = KdaDecodeSplitKernel<kKdaDecodeHeadDim, kCluster, kThreads, kMinBlocksPerSm, kStreamHints>;
  const dim3 grid(static_cast<unsigned>(a.heads * kCluster), static_cast<unsigned>(a.rows));
  if constexpr (kCluster == 1) {
    LaunchPdl("KdaDecode", kernel, grid, dim3(kThreads), 0, s, a);
  } else {
    // Without PDL, as before LaunchEx: this launch never overlapped the kernel before it.
    LaunchEx("KdaDecode", kernel, grid, dim3(kThreads), 0, s, kCluster, /*pdl=*/false, a);
  }
}

}  // namespace

const char* KdaDecodeVariantName(KdaDecodeVariant v) {
  switch (v) {
    case KdaDecodeVariant::kColumn2: return "column2";
    case KdaDecodeVariant::kColumn3: return "column3";
    case KdaDecodeVariant::kSplit256: return "split256";
    case KdaDecodeVariant::kSplit512: return "split512";
    case KdaDecodeVariant::kSplit512Plain: return "split512plain";
    case KdaDecodeVariant::kCluster2x128: return "cluster2x128";
    case KdaDecodeVariant::kCluster2x256: return "cluster2x256";
    case KdaDecodeVariant::kCluster4x128: return "cluster4x128";
    case KdaDecodeVariant::kCluster8x128: return "cluster8x128";
  }
  return "unknown";
}

void KdaDecode(const KdaDecodeArgs& a, cudaStream_t s, KdaDecodeVariant variant) {
  if (a.head_dim != kKdaDecodeHeadDim) {
    std::fprintf(stderr, "kimirt: fused KDA decode of head dim %lld (the kernel is built for %d)\n",
                 static_cast<long long>(a.head_dim), kKdaDecodeHeadDim);
    std::abort();
  }
  if (a.conv_taps < 1 || a.conv_taps > kDecodeMaxConvTaps) {
    std::fprintf(stderr, "kimirt: fused KDA decode with %lld conv taps (1..%d supported)\n",
                 static_cast<long long>(a.conv_taps), kDecodeMaxConvTaps);
    std::abort();
  }
  if (a.heads < 1 || a.heads > 65535 || a.rows > 65535) {
    std::fprintf(stderr, "kimirt: fused KDA decode of %lld heads, %lld rows (1..65535 heads, rows <= 65535)\n",
                 static_cast<long long>(a.heads), static_cast<long long>(a.rows));
    std::abort();
  }
  // The split variants move the state as float4.
  if (reinterpret_cast<uintptr_t>(a.recurrent) % 16 != 0) {
    std::fprintf(stderr, "kimirt: fused KDA decode needs a 16-byte aligned state pool\n");
    std::abort();
  }
  if (a.rows == 0) return;
  constexpr int K = kKdaDecodeHeadDim;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.rows));
  switch (variant) {
    case KdaDecodeVariant::kColumn2: KdaDecodeKernel<K, 2><<<grid, K, 0, s>>>(a); break;
    case KdaDecodeVariant::kColumn3: KdaDecodeKernel<K, 3><<<grid, K, 0, s>>>(a); break;
    // Register caps: 2 heads' state per SM (128 KB of the 256 KB register file) for all but
    // cluster8x128, which holds 1.5 (its 16 values a thread leave too few registers for 2).
    case KdaDecodeVariant::kSplit256: LaunchSplit<1, 256, 2, true>(a, s); break;
    case KdaDecodeVariant::kSplit512: LaunchSplit<1, 512, 2, true>(a, s); break;
    case KdaDecodeVariant::kSplit512Plain: LaunchSplit<1, 512, 2, false>(a, s); break;
    case KdaDecodeVariant::kCluster2x128: LaunchSplit<2, 128, 4, true>(a, s); break;
    case KdaDecodeVariant::kCluster2x256: LaunchSplit<2, 256, 4, true>(a, s); break;
    case KdaDecodeVariant::kCluster4x128: LaunchSplit<4, 128, 8, true>(a, s); break;
    case KdaDecodeVariant::kCluster8x128: LaunchSplit<8, 128, 10, true>(a, s); break;
    default:
      std::fprintf(stderr, "kimirt: fused KDA decode variant %d unknown\n", static_cast<int>(variant));
      std::abort();
  }
  CheckLaunch("KdaDecode");
}

}  // namespace kimirt::cuda
