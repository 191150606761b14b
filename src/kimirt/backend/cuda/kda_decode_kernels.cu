// The fused KDA decode step (kernels.h KdaDecode; kda_decode_args.h): one launch for B sequences
// × H heads, one token each, from the step's projections to the gated-RMSNorm output.
//
// Shape of the work: decode is memory bound on the FP32 state, K·K·4 = 64 KB per head at K = 128,
// read once and written once; everything else per row is a few KB. One block per (head, row),
// one thread per value column j: thread j holds S[:, j] (K floats) in registers, so the state is
// read once and written once, and the decay, p = k̂ᵀS, rank-1 update and o = q̂ᵀS run on registers
// with no synchronization; the sums over d run in ascending d as the CPU reference does. Thread j
// also owns channel c = h·K + j of the prologue (conv + SiLU of q, k, v and their windows, the
// decay gate) and of the gated RMSNorm, so the whole head stays in one block and the RMSNorm
// needs no second pass.
//
// The state loads are issued first, before the prologue, so their latency (the bulk of a block's
// time) overlaps the prologue's loads and reductions. Register budget (ptxas, sm_90): 199
// registers and no spill uncapped, which leaves 2 blocks (8 warps, 128 KB of state loads in
// flight) per SM, several times what an SM's share of HBM bandwidth needs; the 3-block variant
// (cap 168, ~140 bytes spilled) is there for the bench to compare.
//
// Rows are independent by construction: block (h, b) reads row b's inputs and slot slots[b]'s
// state and writes nothing another block reads, so a row's bits never depend on the batch.
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/kda_activations.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cstdio>
#include <cstdlib>

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

// The short causal conv + SiLU (spec §3.5) of one channel for one token, and its window update
// (spec §5.7): taps j = 0..W-1 oldest first, summed from 0 in that order as the CPU reference.
// win points at the channel's column of the slot's [W-1, P] window.
__device__ float ConvStep(const ConvChannel& c, int W, float* win, int64_t P) {
  const int hist = W - 1;
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < kDecodeMaxConvTaps; ++i) {
    if (i < hist) acc += c.tap[i] * c.win[i];
    if (i == hist) acc += c.tap[i] * c.x;
  }
  // New window: the last W-1 inputs of (window ++ x).
#pragma unroll
  for (int i = 0; i + 1 < kDecodeMaxConvTaps; ++i) {
    if (i < hist) win[i * P] = i + 1 < hist ? c.win[i + 1] : c.x;
  }
  return KdaSilu(acc);
}

template <int K, int kMinBlocksPerSm>
__global__ void __launch_bounds__(K, kMinBlocksPerSm) KdaDecodeKernel(KdaDecodeArgs a) {
  PdlTrigger();  // the next kernel may launch and prefetch its weights (pdl.cuh)
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

}  // namespace

void KdaDecode(const KdaDecodeArgs& a, cudaStream_t s, int blocks_per_sm) {
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
  if (blocks_per_sm != 2 && blocks_per_sm != 3) {
    std::fprintf(stderr, "kimirt: fused KDA decode for %d blocks per SM (2 or 3)\n", blocks_per_sm);
    std::abort();
  }
  if (a.heads < 1 || a.rows > 65535) {
    std::fprintf(stderr, "kimirt: fused KDA decode of %lld heads, %lld rows (heads >= 1, rows <= 65535)\n",
                 static_cast<long long>(a.heads), static_cast<long long>(a.rows));
    std::abort();
  }
  if (a.rows == 0) return;
  const dim3 grid(static_cast<unsigned>(a.heads), static_cast<unsigned>(a.rows));
  if (blocks_per_sm == 3) {
    KdaDecodeKernel<kKdaDecodeHeadDim, 3><<<grid, kKdaDecodeHeadDim, 0, s>>>(a);
  } else {
    KdaDecodeKernel<kKdaDecodeHeadDim, 2><<<grid, kKdaDecodeHeadDim, 0, s>>>(a);
  }
  CheckLaunch("KdaDecode");
}

}  // namespace kimirt::cuda
