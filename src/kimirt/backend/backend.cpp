// Backend (backend.h): the base versions of the grouped Linear, the residual add + norm and the
// batched KDA decode op, written once over the per-op kernels so every backend has them and a
// fused kernel has a reference to match.
#include "kimirt/backend/backend.h"

#include "kimirt/core/check.h"

namespace kimirt {

void Backend::CheckDecodeSlots(std::span<const int32_t> slots, int64_t slot_count) {
  for (size_t i = 0; i < slots.size(); ++i) {
    KIMIRT_CHECK_MSG(slots[i] >= 0 && slots[i] < slot_count, "KDA decode: slot outside the pool");
    for (size_t j = 0; j < i; ++j) KIMIRT_CHECK_MSG(slots[i] != slots[j], "KDA decode: one slot twice");
  }
}

void Backend::LinearGroup(std::span<const LinearProblem> problems) {
  for (const LinearProblem& p : problems) Linear(*p.x, *p.w, p.y);
}

void Backend::AddRmsNorm(const Tensor& a, const Tensor& b, const Tensor& w, float eps, Tensor* h, Tensor* y) {
  Add(a, b, h);
  RmsNorm(*h, w, eps, y);
}

void Backend::AttnResMixNorm(std::span<const Tensor* const> candidates, const Tensor& proj, const Tensor& norm_w,
                             float eps, const Tensor& out_w, float out_eps, Tensor* y) {
  Tensor mix = Empty(y->shape());
  AttnResMix(candidates, proj, norm_w, eps, &mix);
  RmsNorm(mix, out_w, out_eps, y);
}

void Backend::KdaDecode(std::span<const int32_t> slots, const Tensor& q_raw, const Tensor& k_raw, const Tensor& v_raw,
                        const Tensor& f, const Tensor& beta_logits, const Tensor& gate, const KdaDecodeWeights& w,
                        KdaStatePool* pool, Tensor* o) {
  const int64_t B = Rows(q_raw), Pl = Cols(q_raw), H = w.a_log->numel(), K = Pl / H;
  const int64_t slot_count = pool->recurrent.dim(0), W1 = pool->conv_q.dim(1);
  KIMIRT_CHECK(static_cast<int64_t>(slots.size()) == B && H * K == Pl && Rows(beta_logits) == B);
  CheckDecodeSlots(slots, slot_count);
  // Spec §5.2: short conv + SiLU with each slot's carried window.
  auto conv = [&](const Tensor& raw, const Tensor& taps, const Tensor& windows) {
    Tensor y = Empty({B, Pl});
    for (int64_t b = 0; b < B; ++b) {
      Tensor window = windows.Rows(slots[static_cast<size_t>(b)], 1).Reshape({W1, Pl});
      Tensor out = y.Rows(b, 1);
      CausalConvSilu(raw.Rows(b, 1), taps, &window, &out);
    }
    return y;
  };
  Tensor q = conv(q_raw, *w.conv_q, pool->conv_q);
  Tensor k = conv(k_raw, *w.conv_k, pool->conv_k);
  Tensor v = conv(v_raw, *w.conv_v, pool->conv_v);
  // Spec §5.3: the log-decay, elementwise, so all rows at once.
  Tensor alpha = Empty({B, Pl});
  KdaLogDecay(f, *w.a_log, *w.dt_bias, w.lower_bound, &alpha);
  // Spec §5.4: the delta rule on each slot's state.
  Tensor core = Empty({B, Pl});
  for (int64_t b = 0; b < B; ++b) {
    Tensor state = pool->recurrent.Rows(slots[static_cast<size_t>(b)], 1).Reshape({H, K, K});
    Tensor out = core.Rows(b, 1);
    KdaCore(q.Rows(b, 1), k.Rows(b, 1), v.Rows(b, 1), beta_logits.Rows(b, 1), alpha.Rows(b, 1), H,
            KdaForm::kRecurrent, &state, &out);
  }
  // Spec §5.6: the gated RMSNorm (per row already).
  GatedRmsNorm(core, gate, *w.o_norm, w.norm_eps, o);
}

}  // namespace kimirt
