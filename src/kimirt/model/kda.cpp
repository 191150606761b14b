// The KDA sub-layer (kda.h; spec §5).
#include "kimirt/model/kda.h"

#include <utility>
#include <vector>

namespace kimirt {

KdaStatePool NewKdaStatePool(const ModuleContext& m, int64_t slots) {
  const ModelConfig& c = m.config;
  const int64_t H = c.linear_attn.num_heads / m.comm.size();
  const int64_t K = c.linear_attn.head_dim;
  const int64_t Pl = H * K;
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  KdaStatePool p;
  p.conv_q = m.be.Zeros({slots, W - 1, Pl});
  p.conv_k = m.be.Zeros({slots, W - 1, Pl});
  p.conv_v = m.be.Zeros({slots, W - 1, Pl});
  p.recurrent = m.be.Zeros({slots, H, K, K});
  return p;
}

Tensor RunKda(const ModuleContext& m, const KdaWeights& w, const Tensor& x, int kda_layer,
              const SequenceRows& rows, std::optional<KdaForm> form) {
  const ModelConfig& c = m.config;
  Backend& be = m.be;
  const int64_t T = x.dim(0);
  KdaStatePool& pool = rows.seqs[0]->kda->layer(kda_layer);
  const int64_t Pl = w.q.dim(0);
  const int64_t H = w.a_log.numel(), K = Pl / H;
  const int64_t W1 = pool.conv_q.dim(1);
  auto slot = [&](size_t b) { return rows.seqs[b]->kda_slot; };
  std::optional<float> lb;
  if (c.linear_attn.gate_lower_bound) lb = static_cast<float>(*c.linear_attn.gate_lower_bound);
  // Spec §5.1: projections (all rows), with spec §5.6's output gate (the gated RMSNorm's second
  // input): those of x as one group, then the low-rank second halves of f and the gate as one.
  const bool full_gate = c.linear_attn.use_full_rank_gate;
  std::vector<Tensor> px =
      m.LinearGroup({{x, w.q}, {x, w.k}, {x, w.v}, {x, w.b}, {x, w.f_a}, {x, full_gate ? w.g : w.g_a}});
  // o_proj's weight while the second group, the KDA step and its norm (latency-bound) run.
  const Tensor* const next[] = {&w.o};
  m.PrefetchForDecode(T, next);
  Tensor q_raw = std::move(px[0]), k_raw = std::move(px[1]), v_raw = std::move(px[2]);
  Tensor beta = std::move(px[3]);
  Tensor f, gate;
  if (full_gate) {
    f = m.Linear(px[4], w.f_b);
    gate = std::move(px[5]);
  } else {
    std::vector<Tensor> pb = m.LinearGroup({{px[4], w.f_b}, {px[5], w.g_b}});
    f = std::move(pb[0]);
    gate = std::move(pb[1]);
  }
  const float eps = static_cast<float>(c.rms_norm_eps);
  Tensor normed = be.Empty({T, Pl});
  bool decode = form.value_or(KdaForm::kRecurrent) == KdaForm::kRecurrent;
  for (size_t b = 0; b < rows.seqs.size(); ++b) decode = decode && rows.count(b) == 1;
  if (decode) {
    // Spec §5.2–5.6, one token per sequence: the batched op over the slots.
    std::vector<int32_t> slots;
    for (size_t b = 0; b < rows.seqs.size(); ++b) slots.push_back(slot(b));
    KdaDecodeWeights dw;
    dw.conv_q = &w.conv_q;
    dw.conv_k = &w.conv_k;
    dw.conv_v = &w.conv_v;
    dw.a_log = &w.a_log;
    dw.dt_bias = &w.dt_bias;
    dw.lower_bound = lb;
    dw.o_norm = &w.o_norm;
    dw.norm_eps = eps;
    be.KdaDecode(slots, q_raw, k_raw, v_raw, f, beta, gate, dw, &pool, &normed);
  } else {
    // Spec §5.2: the short conv + SiLU with each sequence's carried window (its own rows).
    auto conv = [&](const Tensor& raw, const Tensor& conv_w, const Tensor& windows) {
      Tensor y = be.Empty({T, Pl});
      for (size_t b = 0; b < rows.seqs.size(); ++b) {
        Tensor window = windows.Rows(slot(b), 1).Reshape({W1, Pl});
        Tensor out = y.Rows(rows.begin(b), rows.count(b));
        be.CausalConvSilu(raw.Rows(rows.begin(b), rows.count(b)), conv_w, &window, &out);
      }
      return y;
    };
    Tensor q = conv(q_raw, w.conv_q, pool.conv_q);
    Tensor k = conv(k_raw, w.conv_k, pool.conv_k);
    Tensor v = conv(v_raw, w.conv_v, pool.conv_v);
    // Spec §5.3: per-channel log-decay (bounded sigmoid for K3, softplus for Kimi-Linear).
    Tensor alpha = be.Empty({T, Pl});
    be.KdaLogDecay(f, w.a_log, w.dt_bias, lb, &alpha);
    // Spec §5.4–5.5: the delta rule over each sequence's recurrent state.
    Tensor core = be.Empty({T, Pl});
    for (size_t b = 0; b < rows.seqs.size(); ++b) {
      const int64_t at = rows.begin(b), n = rows.count(b);
      const KdaForm seq_form = form.value_or(n > 64 ? KdaForm::kChunked : KdaForm::kRecurrent);
      Tensor state = pool.recurrent.Rows(slot(b), 1).Reshape({H, K, K});
      Tensor out = core.Rows(at, n);
      be.KdaCore(q.Rows(at, n), k.Rows(at, n), v.Rows(at, n), beta.Rows(at, n), alpha.Rows(at, n), H, seq_form,
                 &state, &out);
    }
    // Spec §5.6: gated RMSNorm with the output gate.
    be.GatedRmsNorm(core, gate, w.o_norm, eps, &normed);
  }
  // Spec §5.6: o_proj (row parallel: all-reduce).
  Tensor out = m.Linear(normed, w.o);
  m.AllReduce(&out);
  return out;
}

}  // namespace kimirt
