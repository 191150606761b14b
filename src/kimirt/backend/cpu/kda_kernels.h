// CPU reference kernels of Kimi Delta Attention (spec §3.2, §3.4, §3.5, §5), in FP32.
// Plain functions over contiguous row-major float arrays: the CPU backend (cpu_backend.cpp)
// calls them, and they are what the CUDA kernels are checked against.
//
// Layouts: T tokens, H heads (this rank's), K = V = head_dim; channel c = h*K + d (spec §2.4).
#pragma once

#include <cstdint>
#include <optional>

#include "kimirt/backend/kda_decode_args.h"

namespace kimirt::cpu {

// Short causal depthwise convolution + SiLU with a carried window (spec §3.5, §5.7).
//   x      [T, C]    pre-conv projection outputs of the new tokens
//   w      [C, W]    taps; tap W-1 multiplies the current token, tap 0 the token W-1 steps back
//   window [W-1, C]  the W-1 inputs before x (oldest first; zeros at sequence start); updated in
//                    place to the last W-1 inputs of (window ++ x)
//   y      [T, C]    silu(sum_j w[c][j] * x_{t-W+1+j}[c])
void CausalConvSilu(const float* x, int64_t T, int64_t C, const float* w, int64_t W, float* window,
                    float* y);

struct KdaGateParams {
  int64_t heads = 0;
  int64_t head_dim = 0;
  const float* a_log = nullptr;    // [H] (this rank's heads; the checkpoint's padding stripped)
  const float* dt_bias = nullptr;  // [H*K]
  // K3: alpha = lb * sigmoid(exp(A_log[h]) * (f + dt_bias)); Kimi-Linear (none):
  // alpha = -exp(A_log[h]) * softplus(f + dt_bias)  (spec §5.3)
  std::optional<float> lower_bound;
};

// Per-channel log-decay alpha [T, H*K] from the raw decay projection f [T, H*K] (spec §5.3).
void KdaLogDecay(const float* f, int64_t T, const KdaGateParams& p, float* alpha);

struct KdaCoreArgs {
  int64_t tokens = 0;
  int64_t heads = 0;
  int64_t head_dim = 0;
  const float* q = nullptr;            // [T, H, K] after conv+SiLU, not yet normalized
  const float* k = nullptr;            // [T, H, K]
  const float* v = nullptr;            // [T, H, K]
  const float* beta_logits = nullptr;  // [T, H]; beta = sigmoid(logit)
  const float* alpha = nullptr;        // [T, H, K] log-decay (KdaLogDecay)
};

// Token-by-token recurrence (spec §5.4) with q̂ = l2norm(q)/sqrt(K), k̂ = l2norm(k) (eps 1e-6
// inside the sqrt of the sum, spec §3.4). state [H, K, K] (row = key channel d, column = value
// channel) is read and updated in place; o [T, H, K].
void KdaRecurrent(const KdaCoreArgs& a, float* state, float* o);

// The chunked-parallel form of the same recurrence (spec §5.5), chunks of `chunk` tokens
// (the last may be shorter). Equal to KdaRecurrent up to FP32 rounding.
void KdaChunked(const KdaCoreArgs& a, float* state, float* o, int64_t chunk = 64);

// Gated RMSNorm per head (spec §3.2): y = x * rsqrt(mean(x^2) + eps) * w * sigmoid(g).
//   x, g, y [T, H, K]; w [K] shared by all heads.
void GatedRmsNorm(const float* x, const float* g, const float* w, int64_t T, int64_t H, int64_t K,
                  float eps, float* y);

// The fused decode step (kda_decode_args.h) as the unfused pieces above, row by row, each row on
// its own slot's state: conv + SiLU of q, k, v; KdaLogDecay; KdaRecurrent (one token);
// GatedRmsNorm. The reference cuda::KdaDecode is checked against.
void KdaDecode(const KdaDecodeArgs& a);

}  // namespace kimirt::cpu
