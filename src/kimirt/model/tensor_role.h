// TensorRole: what a checkpoint tensor is to the model, independent of how the checkpoint spells
// it. The tensor table (tensor_table.cpp) gives every tensor one role; the loader binds each role
// to one field of ModelWeights (weight_binding.cpp); the planner, the bench and the checkpoint
// writer ask a tensor's role instead of matching its name.
//
// Spec: k3-model-spec.md §2.2-§2.7 (what each tensor is), §2.9 (MXFP4: a matrix stored as packed
// codes plus scales, two tensors with two roles).
#pragma once

#include <cstdint>

namespace kimirt {

enum class TensorRole : uint8_t {
  // Model level (spec §2.2).
  kEmbed,
  kLmHead,
  kFinalNorm,
  kOutputResNorm,  // AttnRes over the last block (§8)
  kOutputResProj,
  // Every decoder layer (§2.3).
  kInputNorm,
  kPostAttnNorm,
  kAttnResNorm,  // AttnRes before attention and before the FFN (§8)
  kAttnResProj,
  kMlpResNorm,
  kMlpResProj,
  // KDA (§2.4).
  kKdaQ,
  kKdaK,
  kKdaV,
  kKdaGate,   // full-rank output gate (K3)
  kKdaGateA,  // low-rank output gate, down (Kimi-Linear)
  kKdaGateB,  // ... up
  kKdaBeta,
  kKdaDecayA,  // decay gate, low-rank down
  kKdaDecayB,  // ... up
  kKdaConvQ,
  kKdaConvK,
  kKdaConvV,
  kKdaALog,
  kKdaDtBias,
  kKdaOutNorm,
  kKdaOut,
  // MLA (§2.5).
  kMlaQA,  // q-LoRA down (K3)
  kMlaQANorm,
  kMlaQB,
  kMlaQ,  // full-rank query (Kimi-Linear: no q-LoRA)
  kMlaKvA,
  kMlaKvANorm,
  kMlaKvB,
  kMlaGate,
  kMlaOut,
  // Dense FFN (§2.6).
  kMlpGate,
  kMlpUp,
  kMlpDown,
  // MoE block (§2.7): router, LatentMoE projections, shared expert.
  kRouter,
  kRouterBias,  // e_score_correction_bias
  kLatentDown,
  kLatentUp,
  kLatentNorm,
  kSharedGate,
  kSharedUp,
  kSharedDown,
  // Routed experts stored BF16: one tensor per matrix (w1 gate, w3 up, w2 down).
  kExpertGate,
  kExpertUp,
  kExpertDown,
  // Routed experts stored MXFP4 (§2.9): two tensors per matrix. The codes are U8 bytes of two E2M1
  // values [out, in/2] (low nibble first); the scales are one E8M0 byte per 32 values [out, in/32].
  // The table lists a matrix's codes immediately before its scales.
  kExpertGateCodes,
  kExpertGateScales,
  kExpertUpCodes,
  kExpertUpScales,
  kExpertDownCodes,
  kExpertDownScales,
  // The vision tower and projector (k3-checkpoint-memory.md inventory); the text model holds none.
  kVisionPatchProj,
  kVisionPosEmb,
  kVisionNorm0,
  kVisionNorm1,
  kVisionFc0,
  kVisionFc1,
  kVisionQkv,
  kVisionOut,
  kVisionFinalNorm,
  kProjectorFc0,
  kProjectorFc2,
  kProjectorNorm,
  kSentinel,  // the number of roles; not a role
};
inline constexpr int kNumTensorRoles = static_cast<int>(TensorRole::kSentinel);

inline bool IsMxfp4Codes(TensorRole r) {
  return r == TensorRole::kExpertGateCodes || r == TensorRole::kExpertUpCodes ||
         r == TensorRole::kExpertDownCodes;
}
inline bool IsMxfp4Scales(TensorRole r) {
  return r == TensorRole::kExpertGateScales || r == TensorRole::kExpertUpScales ||
         r == TensorRole::kExpertDownScales;
}
// The codes role of the same matrix as scales role `r` (each scales role follows its codes role).
inline TensorRole Mxfp4CodesOf(TensorRole scales) {
  return static_cast<TensorRole>(static_cast<int>(scales) - 1);
}

}  // namespace kimirt
