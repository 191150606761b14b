// The arguments of the fused KDA decode step (spec §5, §3.2, §3.4, §3.5, §5.7): one new token for
// each of B sequences, all H heads, from the step's projections to the gated-RMSNorm output that
// o_proj takes. Two implementations take the same struct: cpu::KdaDecode (the reference, a loop
// over the unfused CPU kernels) and cuda::KdaDecode (one launch); pointers are host or device
// memory accordingly.
//
// States live in per-layer pools addressed by slot (the paged-state interface's layout): row b
// reads and updates recurrent[slots[b]] and the windows at slots[b] in place, never gathered.
//
// Shapes: B = rows, H = heads (this rank's), K = V = head_dim, P = H·K, W = conv_taps;
// channel c = h·K + d (spec §2.4). All FP32, row-major.
#pragma once

#include <cstdint>

namespace kimirt {

struct KdaDecodeArgs {
  int64_t rows = 0;       // B: one token per row
  int64_t heads = 0;      // H
  int64_t head_dim = 0;   // K = V
  int64_t conv_taps = 0;  // W (window of W-1 past inputs per channel)

  // The step's projections (spec §5.1-5.3), [B, P] unless said.
  const float* q = nullptr;            // q/k/v before the short conv
  const float* k = nullptr;
  const float* v = nullptr;
  const float* beta_logits = nullptr;  // [B, H]; beta = sigmoid(logit)
  const float* f = nullptr;            // decay pre-activation (f_b(f_a(x)))
  const float* gate = nullptr;         // output-gate logits (spec §5.6)

  // The layer's weights.
  const float* conv_q = nullptr;  // [P, W] taps, tap W-1 on the current token
  const float* conv_k = nullptr;
  const float* conv_v = nullptr;
  const float* a_log = nullptr;    // [H]
  const float* dt_bias = nullptr;  // [P]
  const float* o_norm = nullptr;   // [K], shared by the heads
  float norm_eps = 1e-5f;
  // K3: alpha = lb·sigmoid(exp(A_log)·(f + dt_bias)); Kimi-Linear (no bound):
  // alpha = -exp(A_log)·softplus(f + dt_bias)  (spec §5.3).
  bool has_lower_bound = false;
  float lower_bound = 0.0f;

  // State pools by slot. Slots of one call must be distinct (each row updates its own state in
  // place; two rows on one slot would race) and lie in [0, slot_count).
  const int32_t* slots = nullptr;  // [B]
  int64_t slot_count = 0;
  float* recurrent = nullptr;  // [slot_count, H, K, K]: row d = key channel, column = value channel
  float* window_q = nullptr;   // [slot_count, W-1, P]: the last W-1 inputs, oldest first
  float* window_k = nullptr;
  float* window_v = nullptr;

  float* out = nullptr;  // [B, P]: gated RMSNorm of the core output, fully written
};

}  // namespace kimirt
