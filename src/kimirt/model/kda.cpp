// The KDA sub-layer (kda.h; spec §5).
#include "kimirt/model/kda.h"

namespace kimirt {

KdaLayerState NewKdaLayerState(const ModuleContext& m) {
  const ModelConfig& c = m.config;
  const int64_t H = c.linear_attn.num_heads / m.comm.size();
  const int64_t K = c.linear_attn.head_dim;
  const int64_t Pl = H * K;
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  KdaLayerState k;
  k.conv_q = m.be.Zeros({W - 1, Pl});
  k.conv_k = m.be.Zeros({W - 1, Pl});
  k.conv_v = m.be.Zeros({W - 1, Pl});
  k.recurrent = m.be.Zeros({H, K, K});
  return k;
}

Tensor RunKda(const ModuleContext& m, const KdaWeights& w, const Tensor& x, int kda_layer,
              const SequenceRows& rows, std::optional<KdaForm> form) {
  const ModelConfig& c = m.config;
  Backend& be = m.be;
  const int64_t T = x.dim(0);
  auto state = [&](size_t b) { return &rows.seqs[b]->kda[static_cast<size_t>(kda_layer)]; };
  const int64_t Pl = w.q.dim(0);
  const int64_t H = w.a_log.numel();
  // Spec §5.1–5.2: projections (all rows), then the short conv + SiLU with each sequence's
  // carried window (its own rows).
  auto conv = [&](const Tensor& proj_w, const Tensor& conv_w, Tensor KdaLayerState::*window) {
    Tensor raw = m.Linear(x, proj_w);
    Tensor y = be.Empty({T, Pl});
    for (size_t b = 0; b < rows.seqs.size(); ++b) {
      Tensor out = y.Rows(rows.begin(b), rows.count(b));
      be.CausalConvSilu(raw.Rows(rows.begin(b), rows.count(b)), conv_w, &(state(b)->*window), &out);
    }
    return y;
  };
  Tensor q = conv(w.q, w.conv_q, &KdaLayerState::conv_q);
  Tensor k = conv(w.k, w.conv_k, &KdaLayerState::conv_k);
  Tensor v = conv(w.v, w.conv_v, &KdaLayerState::conv_v);
  Tensor beta = m.Linear(x, w.b);
  Tensor f = m.Linear(m.Linear(x, w.f_a), w.f_b);
  // Spec §5.3: per-channel log-decay (bounded sigmoid for K3, softplus for Kimi-Linear).
  Tensor alpha = be.Empty({T, Pl});
  std::optional<float> lb;
  if (c.linear_attn.gate_lower_bound) lb = static_cast<float>(*c.linear_attn.gate_lower_bound);
  be.KdaLogDecay(f, w.a_log, w.dt_bias, lb, &alpha);
  // Spec §5.4–5.5: the delta rule over each sequence's recurrent state.
  Tensor core = be.Empty({T, Pl});
  for (size_t b = 0; b < rows.seqs.size(); ++b) {
    const int64_t at = rows.begin(b), n = rows.count(b);
    const KdaForm seq_form = form.value_or(n > 64 ? KdaForm::kChunked : KdaForm::kRecurrent);
    Tensor out = core.Rows(at, n);
    be.KdaCore(q.Rows(at, n), k.Rows(at, n), v.Rows(at, n), beta.Rows(at, n), alpha.Rows(at, n), H, seq_form,
               &state(b)->recurrent, &out);
  }
  // Spec §5.6: gated RMSNorm with the output gate, then o_proj (row parallel: all-reduce).
  Tensor gate = c.linear_attn.use_full_rank_gate ? m.Linear(x, w.g) : m.Linear(m.Linear(x, w.g_a), w.g_b);
  Tensor normed = be.Empty({T, Pl});
  be.GatedRmsNorm(core, gate, w.o_norm, static_cast<float>(c.rms_norm_eps), &normed);
  Tensor out = m.Linear(normed, w.o);
  m.AllReduce(&out);
  return out;
}

}  // namespace kimirt
