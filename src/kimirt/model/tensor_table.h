// The tensor table: every tensor of the released checkpoint that a config implies, with its name,
// shape, dtype, accounting category, TP placement and role. One table per block kind (embeddings
// and head, AttnRes, KDA, MLA, dense MLP, MoE with LatentMoE and experts, vision) in
// tensor_table.cpp, the one file that spells checkpoint tensor names. Layout::Build indexes it;
// the loader binds each entry to a field by its role (weight_binding.h).
//
// Spec: k3-model-spec.md §2 (names, shapes, dtypes), §2.9 (MXFP4), §11 (placement).
#pragma once

#include <vector>

#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"

namespace kimirt {

// In the released checkpoint's order. Sizes are not checked here (Layout::Build does).
std::vector<TensorSpec> BuildTensorTable(const ModelConfig& config);

}  // namespace kimirt
