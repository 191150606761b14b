// The gated NoPE MLA sub-layer (mla.h; spec §6).
#include "kimirt/model/mla.h"

#include <utility>
#include <vector>

namespace kimirt {
namespace {

// MLA latent norms take KimiRMSNorm's default eps, not rms_norm_eps (spec §6.1).
constexpr float kMlaLatentNormEps = 1e-6f;

}  // namespace

bool PagedDecode(const SequenceRows& rows, std::optional<MlaForm> form) {
  if (rows.seqs.empty() || form == MlaForm::kExpanded) return false;
  for (size_t b = 0; b < rows.seqs.size(); ++b) {
    if (rows.count(b) != 1 || rows.seqs[b]->kv != rows.seqs[0]->kv) return false;
  }
  return true;
}

Tensor RunMla(const ModuleContext& m, const MlaWeights& w, const Tensor& x, int mla_layer,
              const SequenceRows& rows, std::optional<MlaForm> form, bool paged_decode) {
  const ModelConfig& c = m.config;
  Backend& be = m.be;
  const int64_t T = x.dim(0);
  // The projections of x as one group: the query's first (spec §6.1), the latent's (§6.2) and,
  // in decode, the output gate's (§6.4; a prefill computes it after attention, so its [T, H·dv]
  // is not held through it).
  const bool gate_first = c.mla_use_output_gate && T <= be.RowInvariantRows();
  std::vector<ModuleContext::LinearIn> of_x = {{x, c.q_lora_rank ? w.q_a : w.q}, {x, w.kv_a}};
  if (gate_first) of_x.push_back({x, w.g});
  std::vector<Tensor> px = m.LinearGroup(of_x);
  // kv_b (the absorbed query and output) and o_proj's weight while the norms, the cache write
  // and the attention run.
  const Tensor* const next[] = {&w.kv_b, &w.o};
  m.PrefetchForDecode(T, next);
  // Spec §6.1: query path (q-LoRA with its 1e-6 norm for K3; one q_proj for Kimi-Linear).
  Tensor q = c.q_lora_rank ? m.Linear(m.Norm(px[0], w.q_a_norm, kMlaLatentNormEps), w.q_b) : std::move(px[0]);
  // Spec §6.2: latent and shared key; only the latent is normalized. Both go to the cache, and
  // attention reads every position back from it (so the cache dtype applies to the new tokens
  // too, as in a paged-attention kernel).
  const int64_t r = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  const Tensor& a = px[1];
  Tensor c_raw = be.Empty({T, r});
  Tensor ks = be.Empty({T, dr});
  be.CopyColumns(a, 0, r, &c_raw);
  be.CopyColumns(a, r, dr, &ks);
  Tensor latent = m.Norm(c_raw, w.kv_a_norm, kMlaLatentNormEps);
  MlaShape shape;
  shape.nope_dim = c.qk_nope_head_dim;
  shape.rope_dim = dr;
  shape.v_dim = c.v_head_dim;
  shape.latent_dim = r;
  shape.heads = w.kv_b.dim(0) / (shape.nope_dim + shape.v_dim);
  Tensor attn = be.Empty({T, shape.heads * shape.v_dim});
  if (paged_decode) {
    // Spec §6.5–6.6: every sequence's new row into its blocks, then the absorbed form read
    // through the block tables (the step's metadata is already with the cache).
    LatentKvCache* kv = rows.seqs[0]->kv;
    kv->WriteDecode(mla_layer, latent, ks);
    kv->AttendDecode(mla_layer, q, w.kv_b, shape, &attn);
  } else {
    // Spec §6.4–6.6 (prefill): each sequence writes its new rows, gathers all of its rows back,
    // attends. In BF16 prefill mode (issue 14) the expanded-form sequences instead attend in one
    // call per cache through their block tables, on tensor cores where the backend has them.
    PagedPrefill paged;
    LatentKvCache* paged_kv = nullptr;
    auto attend_paged = [&] {
      if (paged.size() > 0) paged_kv->AttendPrefill(mla_layer, paged, q, w.kv_b, shape, &attn);
      paged = PagedPrefill();
    };
    for (size_t b = 0; b < rows.seqs.size(); ++b) {
      SequenceState* st = rows.seqs[b];
      const int64_t at = rows.begin(b), n = rows.count(b), start = st->length;
      st->kv->Write(mla_layer, st->blocks, start, latent.Rows(at, n), ks.Rows(at, n));
      const MlaForm seq_form = form.value_or(n == 1 ? MlaForm::kAbsorbed : MlaForm::kExpanded);
      if (be.bf16_prefill() && seq_form == MlaForm::kExpanded) {
        if (paged_kv != st->kv) attend_paged();
        paged_kv = st->kv;
        paged.Add(st->blocks, start, n, at);
        continue;
      }
      Tensor cache_c = be.Empty({start + n, r});
      Tensor cache_ks = be.Empty({start + n, dr});
      st->kv->Gather(mla_layer, st->blocks, start + n, &cache_c, &cache_ks);
      Tensor out = attn.Rows(at, n);
      be.MlaAttention(q.Rows(at, n), cache_c, cache_ks, w.kv_b, shape, start, seq_form, &out);
    }
    attend_paged();
  }
  // Spec §6.4: sigmoid output gate on the same normed input, then o_proj (row parallel).
  if (c.mla_use_output_gate) be.SigmoidMul(attn, gate_first ? px[2] : m.Linear(x, w.g), &attn);
  Tensor out = m.Linear(attn, w.o);
  m.AllReduce(&out);
  return out;
}

}  // namespace kimirt
