// Role -> field, for every text role. A role the switch does not know fails the build (-Wswitch);
// weight_binding_test.cpp checks every table entry of every config binds to its own field.
#include "kimirt/model/weight_binding.h"

#include "kimirt/core/check.h"

namespace kimirt {

ModelWeights EmptyModelWeights(const ModelConfig& c) {
  ModelWeights w;
  w.layers.resize(static_cast<size_t>(c.num_hidden_layers));
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    l.is_kda = c.IsKdaLayer(i);
    l.is_moe = c.IsMoeLayer(i);
    if (!l.is_moe) continue;
    const size_t E = static_cast<size_t>(c.num_experts);
    l.moe.experts.gate.resize(E);
    l.moe.experts.up.resize(E);
    l.moe.experts.down.resize(E);
    l.moe.experts.gate_scales.resize(E);
    l.moe.experts.up_scales.resize(E);
    l.moe.experts.down_scales.resize(E);
  }
  return w;
}

WeightBinding BindWeight(ModelWeights& w, const TensorSpec& t) {
  using R = TensorRole;
  const HeldAs matrix = HeldAs::kMatrix, f32 = HeldAs::kF32, vec = HeldAs::kF32Vector;
  // A layer's tensor names its layer (and an expert's its expert): the table sets both.
  auto layer = [&]() -> LayerWeights& {
    KIMIRT_CHECK(t.layer >= 0 && static_cast<size_t>(t.layer) < w.layers.size());
    return w.layers[static_cast<size_t>(t.layer)];
  };
  auto expert = [&](std::vector<Tensor>& v, HeldAs held = HeldAs::kMatrix) {
    KIMIRT_CHECK(t.expert >= 0 && static_cast<size_t>(t.expert) < v.size());
    return WeightBinding{&v[static_cast<size_t>(t.expert)], held};
  };
  const HeldAs mx = HeldAs::kMxfp4;
  switch (t.role) {
    case R::kEmbed: return {&w.embed, matrix};  // BF16-held on CUDA: rows widened exactly at lookup
    case R::kLmHead: return {&w.lm_head, matrix};
    case R::kFinalNorm: return {&w.norm, f32};
    case R::kOutputResNorm: return {&w.out_res_norm, f32};
    case R::kOutputResProj: return {&w.out_res_proj, vec};
    case R::kInputNorm: return {&layer().input_norm, f32};
    case R::kPostAttnNorm: return {&layer().post_norm, f32};
    case R::kAttnResNorm: return {&layer().attn_res_norm, f32};
    case R::kAttnResProj: return {&layer().attn_res_proj, vec};
    case R::kMlpResNorm: return {&layer().mlp_res_norm, f32};
    case R::kMlpResProj: return {&layer().mlp_res_proj, vec};
    case R::kKdaQ: return {&layer().kda.q, matrix};
    case R::kKdaK: return {&layer().kda.k, matrix};
    case R::kKdaV: return {&layer().kda.v, matrix};
    case R::kKdaGate: return {&layer().kda.g, matrix};
    case R::kKdaGateA: return {&layer().kda.g_a, matrix};
    case R::kKdaGateB: return {&layer().kda.g_b, matrix};
    case R::kKdaBeta: return {&layer().kda.b, matrix};
    case R::kKdaDecayA: return {&layer().kda.f_a, matrix};
    case R::kKdaDecayB: return {&layer().kda.f_b, matrix};
    case R::kKdaConvQ: return {&layer().kda.conv_q, HeldAs::kF32Taps};
    case R::kKdaConvK: return {&layer().kda.conv_k, HeldAs::kF32Taps};
    case R::kKdaConvV: return {&layer().kda.conv_v, HeldAs::kF32Taps};
    case R::kKdaALog: return {&layer().kda.a_log, vec};
    case R::kKdaDtBias: return {&layer().kda.dt_bias, f32};
    case R::kKdaOutNorm: return {&layer().kda.o_norm, f32};
    case R::kKdaOut: return {&layer().kda.o, matrix};
    case R::kMlaQA: return {&layer().mla.q_a, matrix};
    case R::kMlaQANorm: return {&layer().mla.q_a_norm, f32};
    case R::kMlaQB: return {&layer().mla.q_b, matrix};
    case R::kMlaQ: return {&layer().mla.q, matrix};
    case R::kMlaKvA: return {&layer().mla.kv_a, matrix};
    case R::kMlaKvANorm: return {&layer().mla.kv_a_norm, f32};
    case R::kMlaKvB: return {&layer().mla.kv_b, matrix};
    case R::kMlaGate: return {&layer().mla.g, matrix};
    case R::kMlaOut: return {&layer().mla.o, matrix};
    case R::kMlpGate: return {&layer().dense.gate, matrix};
    case R::kMlpUp: return {&layer().dense.up, matrix};
    case R::kMlpDown: return {&layer().dense.down, matrix};
    case R::kRouter: return {&layer().moe.router, HeldAs::kRouter};
    case R::kRouterBias: return {&layer().moe.bias, f32};
    case R::kLatentDown: return {&layer().moe.latent_down, matrix};
    case R::kLatentUp: return {&layer().moe.latent_up, matrix};
    case R::kLatentNorm: return {&layer().moe.latent_norm, f32};
    case R::kSharedGate: return {&layer().moe.shared.gate, matrix};
    case R::kSharedUp: return {&layer().moe.shared.up, matrix};
    case R::kSharedDown: return {&layer().moe.shared.down, matrix};
    case R::kExpertGate: return expert(layer().moe.experts.gate);
    case R::kExpertGateCodes: return expert(layer().moe.experts.gate, mx);
    case R::kExpertGateScales: return expert(layer().moe.experts.gate_scales, mx);
    case R::kExpertUp: return expert(layer().moe.experts.up);
    case R::kExpertUpCodes: return expert(layer().moe.experts.up, mx);
    case R::kExpertUpScales: return expert(layer().moe.experts.up_scales, mx);
    case R::kExpertDown: return expert(layer().moe.experts.down);
    case R::kExpertDownCodes: return expert(layer().moe.experts.down, mx);
    case R::kExpertDownScales: return expert(layer().moe.experts.down_scales, mx);
    case R::kVisionPatchProj:
    case R::kVisionPosEmb:
    case R::kVisionNorm0:
    case R::kVisionNorm1:
    case R::kVisionFc0:
    case R::kVisionFc1:
    case R::kVisionQkv:
    case R::kVisionOut:
    case R::kVisionFinalNorm:
    case R::kProjectorFc0:
    case R::kProjectorFc2:
    case R::kProjectorNorm:
    case R::kSentinel: return {};
  }
  return {};
}

}  // namespace kimirt
