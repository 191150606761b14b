// The FFN sub-layers (spec §7): the dense MLP (spec §7.1; also the MoE's shared expert) and the
// LatentMoE block (spec §7.2), with the activation both use.
#pragma once

#include "kimirt/model/module_context.h"
#include "kimirt/model/weights.h"

namespace kimirt {

// The GLU of the config's hidden_act: SiLU (Kimi-Linear) or SiTU with its betas (K3; spec §1.3,
// §3.3).
GluParams FfnActivation(const ModelConfig& c);

// Dense MLP (spec §7.1): down(GLU(gate·y, up·y)), all-reduced over the ranks' intermediate
// slices. y [T, D] normed; returns [T, D].
Tensor RunMlp(const ModuleContext& m, const MlpWeights& w, const Tensor& y);

// LatentMoE block (spec §7.2) on the normed y [T, D]: router, latent down-projection, routed
// experts, latent norm and up-projection, plus the shared expert. Returns [T, D]; the chosen
// experts [T, k] go to *route_idx if given.
Tensor RunMoe(const ModuleContext& m, const MoeWeights& w, const Tensor& y, Tensor* route_idx);

}  // namespace kimirt
