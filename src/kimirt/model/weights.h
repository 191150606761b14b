// ModelWeights: one rank's slices of every text tensor, on the backend's device, in the shapes
// the modules use (spec §2, placement spec §11). Loading checks the weight source against the
// Layout first, so a checkpoint that does not match its config fails with the tensor named.
#pragma once

#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/model/layout.h"
#include "kimirt/model/weight_source.h"

namespace kimirt {

struct KdaWeights {
  Tensor q, k, v;          // [P_l, D]
  Tensor g;                // [P_l, D] full-rank output gate (K3)
  Tensor g_a, g_b;         // [K, D], [P_l, K] low-rank output gate (Kimi-Linear)
  Tensor b;                // [H_l, D]
  Tensor f_a, f_b;         // [K, D], [P_l, K]
  Tensor conv_q, conv_k, conv_v;  // [P_l, W]
  Tensor a_log;            // [H_l] (padding stripped)
  Tensor dt_bias;          // [P_l]
  Tensor o_norm;           // [K]
  Tensor o;                // [D, P_l]
};

struct MlaWeights {
  Tensor q_a, q_a_norm, q_b;  // [rq, D], [rq], [H_l*(dn+dr), rq] (K3: q-LoRA)
  Tensor q;                   // [H_l*(dn+dr), D] (Kimi-Linear: no q-LoRA)
  Tensor kv_a;                // [r + dr, D]
  Tensor kv_a_norm;           // [r]
  Tensor kv_b;                // [H_l*(dn+dv), r]
  Tensor g;                   // [H_l*dv, D] output gate (K3)
  Tensor o;                   // [D, H_l*dv]
};

struct MlpWeights {
  Tensor gate, up;  // [I_l, D]
  Tensor down;      // [D, I_l]
  bool defined() const { return gate.defined() && gate.numel() > 0; }
};

struct MoeWeights {
  Tensor router;        // [E, D]
  Tensor bias;          // [E] e_score_correction_bias
  Tensor latent_down;   // [Dl, D] (LatentMoE)
  Tensor latent_up;     // [D, Dl]
  Tensor latent_norm;   // [Dl]
  MlpWeights shared;    // sharded like a dense MLP
  // One entry per routed expert. Tensor parallelism: every expert, intermediate sliced. Expert
  // parallelism: this rank's experts whole; the others' entries are zero stand-ins
  // (ModelWeights::expert_stand_ins), so they add exactly nothing to the routed output.
  ExpertWeights experts;
};

struct LayerWeights {
  bool is_kda = false;
  bool is_moe = false;
  Tensor input_norm, post_norm;            // [D]
  Tensor attn_res_norm, attn_res_proj;     // [D] (AttnRes)
  Tensor mlp_res_norm, mlp_res_proj;       // [D]
  KdaWeights kda;
  MlaWeights mla;
  MlpWeights dense;
  MoeWeights moe;
};

struct ModelWeights {
  Tensor embed;               // [V_alloc, D] rows [embed_row_begin, ...) of the vocabulary
  int64_t embed_row_begin = 0;
  Tensor lm_head;             // [V_alloc, D], zero rows past the vocabulary
  Tensor norm;                // [D]
  Tensor out_res_norm, out_res_proj;  // [D]
  std::vector<LayerWeights> layers;
  // Expert parallelism: the zero buffers the stand-ins of other ranks' experts are views of
  // (weights.cpp AddExpertStandIns), one expert's worth whatever the layer count.
  std::vector<Tensor> expert_stand_ins;
};

// How weights are held on the device. The math is F32 either way; `matrix_dtype` BF16 keeps the
// GEMM weights (projections, experts, kv_b, lm_head) that the checkpoint stores as BF16 or MXFP4
// in BF16 — exactly the checkpoint's values at half the bytes of F32 (every MXFP4 value,
// E2M1 × 2^k, is a BF16 value); so is a BF16-stored embedding table (rows widened at lookup).
// F32-stored tensors, norms, gates and the router stay F32. The CUDA backend takes BF16 matrices;
// the CPU backend only F32.
struct LoadOptions {
  DType matrix_dtype = DType::kF32;
  // Expert parallelism (vLLM's --enable-expert-parallel; docs/distributed.md "Expert
  // parallelism"): 1, or the TP degree — each rank then holds E / tp routed experts whole
  // (Layout::ExpertsOf) instead of every expert's slice of the intermediate width.
  int ep = 1;
  // Parallelism::shard_latent_moe: LatentMoE's latent projections split over the TP ranks.
  bool shard_latent_moe = false;
  // Pipeline parallelism (model/pipeline_stages.h): the rank loads only the tensors of stage
  // `stage` of `pp` — its layers, and the embedding on the first, the final norm, output
  // AttnRes and head on the last. The other layers' entries stay empty.
  int pp = 1;
  int stage = 0;
};

// Loads rank `rank` of `tp` from `source` (a checkpoint, or random weights: weight_source.h) onto
// `backend`, reading only the rank's slice of each tensor. MXFP4 routed experts are held as
// stored (codes + scales, ExpertWeights) on CUDA and widened to F32 on the CPU (the reference).
// With options.ep > 1 (== tp) the other ranks' routed experts are not read at all; with
// options.pp > 1 the other stages' tensors are not read at all.
Result<ModelWeights> LoadModelWeights(const Layout& layout, const WeightSource& source, int tp, int rank,
                                      Backend& backend, const LoadOptions& options = {});

// Bytes of the tensors `w` holds, each counted once (a tied embedding is one tensor; the expert
// stand-ins once, as the buffers they view): what the backend allocated for the weights, to set
// against the planner's figure.
uint64_t HeldBytes(const ModelWeights& w);

}  // namespace kimirt
