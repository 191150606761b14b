// The dense MLP and the LatentMoE block (moe.h; spec §7).
#include "kimirt/model/moe.h"

#include <vector>

namespace kimirt {

GluParams FfnActivation(const ModelConfig& c) {
  GluParams glu;
  if (c.hidden_act == "situ") {
    glu.kind = GluKind::kSitu;
    // Spec §1.3: `beta or 1.0`; an absent linear beta leaves the up branch untransformed.
    glu.beta = static_cast<float>(c.activation_situ_beta.value_or(1.0));
    if (c.activation_situ_linear_beta) glu.linear_beta = static_cast<float>(*c.activation_situ_linear_beta);
  }
  return glu;
}

namespace {

// This rank's partial sum of the MLP's output (its slice of the intermediate width under TP).
Tensor MlpPartial(const ModuleContext& m, const MlpWeights& w, const Tensor& y) {
  std::vector<Tensor> gu = m.LinearGroup({{y, w.gate}, {y, w.up}});
  Tensor h = m.be.Empty(gu[0].shape());
  m.be.Glu(gu[0], gu[1], m.glu, &h);
  return m.Linear(h, w.down);
}

}  // namespace

Tensor RunMlp(const ModuleContext& m, const MlpWeights& w, const Tensor& y) {
  Tensor out = MlpPartial(m, w, y);
  m.AllReduce(&out);
  return out;
}

Tensor RunMoe(const ModuleContext& m, const MoeWeights& w, const Tensor& y, Tensor* route_idx) {
  const ModelConfig& c = m.config;
  Backend& be = m.be;
  const int64_t T = y.dim(0), k = c.num_experts_per_token;
  // Spec §7.2 step 1: FP32 router on the original hidden state (replicated on every rank).
  RouteParams rp;
  rp.top_k = k;
  rp.renormalize = c.moe_renormalize;
  rp.scaling = static_cast<float>(c.routed_scaling_factor);
  rp.combine_biased = c.RouterCombineUsesBiasedScores();
  // Steps 7-8 folded into steps 3-4 where the backend offers it (Backend::MoeSharedAsExpert): the
  // shared expert reads the experts' input (no latent projection), so it can be expert E, chosen
  // by every token with weight 1 after its k. Under TP the shared expert is sliced along its
  // intermediate width as the routed ones are (spec §11), so each rank's output is its partial
  // sum of both and one all-reduce, in rank order, finishes them together (one collective a
  // layer fewer than routed and shared apart: a different F32 rounding of the same sum, a
  // function of the widths and the rank count alone). Under EP too, where the backend takes it
  // (the shapes match): a routed expert whole on one rank and zero stand-ins elsewhere, the
  // shared one sliced — the partials still sum to the whole. Not when the caller records the
  // choices: they are the k routed ones.
  const MlpTensors shared{w.shared.gate, w.shared.up, w.shared.down};
  const bool shared_as_expert = w.shared.defined() && !c.UsesLatentMoe() && route_idx == nullptr &&
                                be.MoeSharedAsExpert(w.experts, shared, T);
  if (shared_as_expert) {
    rp.append_expert = static_cast<int32_t>(w.experts.gate.size());
    Tensor out = be.Empty({T, y.dim(1)});
    be.MoeRouteExpertsWithShared(y, w.router, w.bias, rp, w.experts, shared, m.glu, &out);
    m.AllReduce(&out);
    return out;
  }
  Tensor idx = be.Empty({T, k}, DType::kI32);
  Tensor weights = be.Empty({T, k});
  be.MoeRoute(y, w.router, w.bias, rp, &idx, &weights);
  if (route_idx != nullptr) *route_idx = idx;
  // The latent projections as the loader placed them (Parallelism::shard_latent_moe): whole on
  // every rank, or split over the TP ranks — down column-parallel, up row-parallel.
  const int64_t Dl = c.ExpertHiddenSize();
  const bool latent_split = c.UsesLatentMoe() && w.latent_down.dim(0) != Dl;
  // Steps 2-4: latent down-projection, experts in latent space, FP32 combine. Split, each rank
  // computes its Dl / tp latent columns and the latent is gathered whole: the same dot products
  // (a GPU GEMV may cut their k differently for the narrower weight: a fixed, batch-independent
  // rounding).
  Tensor z = !c.UsesLatentMoe() ? y : latent_split ? m.AllGatherColumns(m.Linear(y, w.latent_down))
                                                   : m.Linear(y, w.latent_down);
  Tensor routed = be.Empty({T, z.dim(1)});
  be.MoeExperts(z, idx, weights, w.experts, m.glu, &routed);
  // Each rank holds a slice of every expert's intermediate width (TP), or its E/N experts whole
  // with zero stand-ins for the rest (EP: weights.cpp AddExpertStandIns): sum the partial
  // outputs, in rank order, BEFORE the latent norm, which is not linear (spec §7.2 TP caveat).
  m.AllReduce(&routed);
  // Steps 5-6: latent norm and up-projection.
  if (c.UsesLatentMoe()) {
    if (c.latent_moe_use_norm) routed = m.Norm(routed, w.latent_norm, static_cast<float>(c.rms_norm_eps));
    if (latent_split) {
      // Row-parallel: this rank's Dl / tp latent columns against its slice of the projection's
      // input width give a partial sum of the output, which the shared expert's partial joins
      // in ONE all-reduce (rank order) instead of two collectives.
      const int64_t per = w.latent_up.dim(1);
      Tensor mine = be.Empty({T, per});
      be.CopyColumns(routed, m.comm.rank() * per, per, &mine);
      Tensor out = m.Linear(mine, w.latent_up);
      if (w.shared.defined()) be.Add(out, MlpPartial(m, w.shared, y), &out);
      m.AllReduce(&out);
      return out;
    }
    routed = m.Linear(routed, w.latent_up);
  }
  // Steps 7-8: the shared expert on the original y, added.
  if (w.shared.defined()) {
    Tensor shared = RunMlp(m, w.shared, y);
    be.Add(routed, shared, &routed);
  }
  return routed;
}

}  // namespace kimirt
