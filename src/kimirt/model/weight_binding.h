// The loader's binding list: for each tensor role (tensor_role.h), the field of ModelWeights it
// fills and how that field is held. LoadModelWeights walks the tensor table and binds every entry
// through it, so a field is named here once and a checkpoint name never.
#pragma once

#include "kimirt/model/layout.h"
#include "kimirt/model/weights.h"

namespace kimirt {

// How the loader holds a tensor on the device (values are F32 unless kMatrix allows BF16).
enum class HeldAs : uint8_t {
  kF32,        // the rank's slice, in its stored shape
  kMatrix,     // a GEMM weight: LoadOptions::matrix_dtype where the stored values fit it exactly
  kF32Vector,  // flattened to 1-D: per-head log-rates ([1, 1, H, 1], or K3's padded [128], §2.4),
               // AttnRes pseudo-queries [1, D]
  kF32Taps,    // conv taps [P, 1, W] held as [P, W]
  kRouter,     // the MoE router: as stored where the backend's router math widens it
               // (Backend::RouterAsStored), else F32
  kMxfp4,      // MXFP4 expert codes or scales: as stored (U8) where the backend takes them (CUDA);
               // on the CPU the loader widens the pair into the codes' field (spec §2.9)
};

struct WeightBinding {
  Tensor* field = nullptr;  // nullptr: the text model holds no such tensor (the vision tower)
  HeldAs held = HeldAs::kF32;
};

// ModelWeights with one LayerWeights per layer (kinds set) and one expert slot per routed expert,
// every tensor still empty: what the loader binds into.
ModelWeights EmptyModelWeights(const ModelConfig& config);

// The field `t` fills in `w` (shaped by EmptyModelWeights for the layout's config). MXFP4 codes
// and scales each have their own field (ExpertWeights); a CPU load widens the pair into the codes'.
WeightBinding BindWeight(ModelWeights& w, const TensorSpec& t);

}  // namespace kimirt
