// The decoder forward pass (spec §4): embedding, 2 sub-layers per layer (KDA or MLA, then dense
// MLP or MoE) mixed by Block AttnRes where the config has it (spec §8), final norm, LM head.
#include "kimirt/model/model.h"

#include <algorithm>

namespace kimirt {
namespace {

// MLA latent norms take KimiRMSNorm's default eps, not rms_norm_eps (spec §6.1).
constexpr float kMlaLatentNormEps = 1e-6f;

Tensor HostCopy(Backend& be, const Tensor& t) {
  Tensor d = be.Download(t);
  Tensor h = Tensor::Host(d.shape(), d.dtype());
  std::copy_n(static_cast<const uint8_t*>(d.raw()), d.nbytes(), static_cast<uint8_t*>(h.raw()));
  return h;
}

// Host copies of one layer's sub-layer inputs and outputs (ForwardTrace).
void RecordLayer(Backend& be, const Tensor& attn_in, const Tensor& attn_out, const Tensor& ffn_in,
                 const Tensor& ffn_out, const Tensor& route, ForwardTrace* trace) {
  trace->attn_in.push_back(HostCopy(be, attn_in));
  trace->attn_out.push_back(HostCopy(be, attn_out));
  trace->ffn_in.push_back(HostCopy(be, ffn_in));
  trace->ffn_out.push_back(HostCopy(be, ffn_out));
  trace->route_idx.push_back(route.defined() && route.numel() > 0 ? HostCopy(be, route) : Tensor());
}

}  // namespace

Model::Model(Layout layout, ModelWeights weights, Backend& backend, Communicator& comm)
    : layout_(std::move(layout)), w_(std::move(weights)), be_(backend), comm_(comm) {
  const ModelConfig& c = config();
  if (c.hidden_act == "situ") {
    glu_.kind = GluKind::kSitu;
    // Spec §1.3: `beta or 1.0`; an absent linear beta leaves the up branch untransformed.
    glu_.beta = static_cast<float>(c.activation_situ_beta.value_or(1.0));
    if (c.activation_situ_linear_beta) glu_.linear_beta = static_cast<float>(*c.activation_situ_linear_beta);
  }
  int kda = 0, mla = 0;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const bool is_kda = c.IsKdaLayer(i);
    kda_slot_.push_back(is_kda ? kda++ : -1);
    mla_slot_.push_back(is_kda ? -1 : mla++);
  }
  private_kv_ = MakeKvCache(0, 16, KvCacheDType::kF32, /*growable=*/true);
}

SequenceState& SequenceState::operator=(SequenceState&& o) noexcept {
  if (this != &o) {
    Release();
    length = o.length;
    kda = std::move(o.kda);
    blocks = std::move(o.blocks);
    kv = o.kv;
    o.blocks.clear();
    o.length = 0;
    o.kv = nullptr;
  }
  return *this;
}

void SequenceState::Release() {
  if (kv != nullptr && !blocks.empty()) kv->FreeBlocks(blocks);
  blocks.clear();
  length = 0;
}

std::unique_ptr<LatentKvCache> Model::MakeKvCache(int64_t num_blocks, int block_size, KvCacheDType dtype,
                                                  bool growable) const {
  const ModelConfig& c = config();
  return std::make_unique<LatentKvCache>(be_, static_cast<int>(c.NumMlaLayers()), num_blocks, block_size,
                                         c.kv_lora_rank, c.qk_rope_head_dim, dtype, growable);
}

Result<std::unique_ptr<Model>> Model::Load(const std::string& dir, Backend& backend, Communicator& comm,
                                           const LoadOptions& options) {
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig config, LoadModelConfig(dir));
  KIMIRT_ASSIGN_OR_RETURN(Layout layout, Layout::Build(config));
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(dir));
  KIMIRT_ASSIGN_OR_RETURN(ModelWeights weights,
                          LoadModelWeights(layout, *ckpt, comm.size(), comm.rank(), backend, options));
  return std::unique_ptr<Model>(new Model(std::move(layout), std::move(weights), backend, comm));
}

SequenceState Model::NewSequence(LatentKvCache* kv) {
  const ModelConfig& c = config();
  const int tp = comm_.size();
  const int64_t H = c.linear_attn.num_heads / tp;
  const int64_t K = c.linear_attn.head_dim;
  const int64_t Pl = H * K;
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  SequenceState st;
  st.kv = kv != nullptr ? kv : private_kv_.get();
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    if (!c.IsKdaLayer(i)) continue;
    KdaLayerState k;
    k.conv_q = be_.Zeros({W - 1, Pl});
    k.conv_k = be_.Zeros({W - 1, Pl});
    k.conv_v = be_.Zeros({W - 1, Pl});
    k.recurrent = be_.Zeros({H, K, K});
    st.kda.push_back(std::move(k));
  }
  return st;
}

void Model::AllReduce(Tensor* t) {
  if (comm_.size() > 1) comm_.AllReduceSum(static_cast<float*>(t->raw()), static_cast<size_t>(t->numel()));
}

Tensor Model::Norm(const Tensor& x, const Tensor& w, float eps) {
  Tensor y = be_.Empty(x.shape());
  be_.RmsNorm(x, w, eps, &y);
  return y;
}

Tensor Model::Mix(std::vector<const Tensor*> cands, const Tensor& proj, const Tensor& norm) {
  Tensor y = be_.Empty(cands.back()->shape());
  be_.AttnResMix(cands, proj, norm, static_cast<float>(config().rms_norm_eps), &y);
  return y;
}

Tensor Model::Kda(const LayerWeights& lw, const Tensor& x, int kda_layer, const Rows& rows, const ForwardOptions& o) {
  const ModelConfig& c = config();
  const KdaWeights& w = lw.kda;
  const int64_t T = x.dim(0);
  auto state = [&](size_t b) { return &rows.seqs[b]->kda[static_cast<size_t>(kda_layer)]; };
  const int64_t Pl = w.q.dim(0);
  const int64_t H = w.a_log.numel();
  auto linear = [&](const Tensor& in, const Tensor& weight) {
    Tensor y = be_.Empty({in.dim(0), weight.dim(0)});
    be_.Linear(in, weight, &y);
    return y;
  };
  // Spec §5.1–5.2: projections (all rows), then the short conv + SiLU with each sequence's
  // carried window (its own rows).
  auto conv = [&](const Tensor& proj_w, const Tensor& conv_w, Tensor KdaLayerState::*window) {
    Tensor raw = linear(x, proj_w);
    Tensor y = be_.Empty({T, Pl});
    for (size_t b = 0; b < rows.seqs.size(); ++b) {
      Tensor out = y.Rows(rows.begin(b), rows.count(b));
      be_.CausalConvSilu(raw.Rows(rows.begin(b), rows.count(b)), conv_w, &(state(b)->*window), &out);
    }
    return y;
  };
  Tensor q = conv(w.q, w.conv_q, &KdaLayerState::conv_q);
  Tensor k = conv(w.k, w.conv_k, &KdaLayerState::conv_k);
  Tensor v = conv(w.v, w.conv_v, &KdaLayerState::conv_v);
  Tensor beta = linear(x, w.b);
  Tensor f = linear(linear(x, w.f_a), w.f_b);
  // Spec §5.3: per-channel log-decay (bounded sigmoid for K3, softplus for Kimi-Linear).
  Tensor alpha = be_.Empty({T, Pl});
  std::optional<float> lb;
  if (c.linear_attn.gate_lower_bound) lb = static_cast<float>(*c.linear_attn.gate_lower_bound);
  be_.KdaLogDecay(f, w.a_log, w.dt_bias, lb, &alpha);
  Tensor core = be_.Empty({T, Pl});
  for (size_t b = 0; b < rows.seqs.size(); ++b) {
    const int64_t at = rows.begin(b), n = rows.count(b);
    const KdaForm form = o.kda_form.value_or(n > 64 ? KdaForm::kChunked : KdaForm::kRecurrent);
    Tensor out = core.Rows(at, n);
    be_.KdaCore(q.Rows(at, n), k.Rows(at, n), v.Rows(at, n), beta.Rows(at, n), alpha.Rows(at, n), H, form,
                &state(b)->recurrent, &out);
  }
  // Spec §5.6: gated RMSNorm with the output gate, then o_proj (row parallel: all-reduce).
  Tensor gate = c.linear_attn.use_full_rank_gate ? linear(x, w.g) : linear(linear(x, w.g_a), w.g_b);
  Tensor normed = be_.Empty({T, Pl});
  be_.GatedRmsNorm(core, gate, w.o_norm, static_cast<float>(c.rms_norm_eps), &normed);
  Tensor out = linear(normed, w.o);
  AllReduce(&out);
  return out;
}

Tensor Model::Mla(const LayerWeights& lw, const Tensor& x, int mla_layer, const Rows& rows, const ForwardOptions& o) {
  const ModelConfig& c = config();
  const MlaWeights& w = lw.mla;
  const int64_t T = x.dim(0);
  auto linear = [&](const Tensor& in, const Tensor& weight) {
    Tensor y = be_.Empty({in.dim(0), weight.dim(0)});
    be_.Linear(in, weight, &y);
    return y;
  };
  // Spec §6.1: query path (q-LoRA with its 1e-6 norm for K3; one q_proj for Kimi-Linear).
  Tensor q = c.q_lora_rank ? linear(Norm(linear(x, w.q_a), w.q_a_norm, kMlaLatentNormEps), w.q_b)
                           : linear(x, w.q);
  // Spec §6.2: latent and shared key; only the latent is normalized. Both go to the cache, and
  // attention reads every position back from it (so the cache dtype applies to the new tokens
  // too, as in a paged-attention kernel).
  const int64_t r = c.kv_lora_rank, dr = c.qk_rope_head_dim;
  Tensor a = linear(x, w.kv_a);
  Tensor c_raw = be_.Empty({T, r});
  Tensor ks = be_.Empty({T, dr});
  be_.CopyColumns(a, 0, r, &c_raw);
  be_.CopyColumns(a, r, dr, &ks);
  Tensor latent = Norm(c_raw, w.kv_a_norm, kMlaLatentNormEps);
  MlaShape shape;
  shape.nope_dim = c.qk_nope_head_dim;
  shape.rope_dim = dr;
  shape.v_dim = c.v_head_dim;
  shape.latent_dim = r;
  shape.heads = w.kv_b.dim(0) / (shape.nope_dim + shape.v_dim);
  Tensor attn = be_.Empty({T, shape.heads * shape.v_dim});
  for (size_t b = 0; b < rows.seqs.size(); ++b) {
    SequenceState* st = rows.seqs[b];
    const int64_t at = rows.begin(b), n = rows.count(b), start = st->length;
    st->kv->Write(mla_layer, st->blocks, start, latent.Rows(at, n), ks.Rows(at, n));
    Tensor cache_c = be_.Empty({start + n, r});
    Tensor cache_ks = be_.Empty({start + n, dr});
    st->kv->Gather(mla_layer, st->blocks, start + n, &cache_c, &cache_ks);
    const MlaForm form = o.mla_form.value_or(n == 1 ? MlaForm::kAbsorbed : MlaForm::kExpanded);
    Tensor out = attn.Rows(at, n);
    be_.MlaAttention(q.Rows(at, n), cache_c, cache_ks, w.kv_b, shape, start, form, &out);
  }
  // Spec §6.4: sigmoid output gate on the same normed input, then o_proj (row parallel).
  if (c.mla_use_output_gate) be_.SigmoidMul(attn, linear(x, w.g), &attn);
  Tensor out = linear(attn, w.o);
  AllReduce(&out);
  return out;
}

Tensor Model::Mlp(const MlpWeights& w, const Tensor& y) {
  const int64_t T = y.dim(0), I = w.gate.dim(0);
  Tensor g = be_.Empty({T, I}), u = be_.Empty({T, I}), h = be_.Empty({T, I});
  be_.Linear(y, w.gate, &g);
  be_.Linear(y, w.up, &u);
  be_.Glu(g, u, glu_, &h);
  Tensor out = be_.Empty({T, w.down.dim(0)});
  be_.Linear(h, w.down, &out);
  AllReduce(&out);
  return out;
}

Tensor Model::Moe(const MoeWeights& w, const Tensor& y, Tensor* route_idx) {
  const ModelConfig& c = config();
  const int64_t T = y.dim(0), k = c.num_experts_per_token;
  // Spec §7.2 step 1: FP32 router on the original hidden state (replicated on every rank).
  RouteParams rp;
  rp.top_k = k;
  rp.renormalize = c.moe_renormalize;
  rp.scaling = static_cast<float>(c.routed_scaling_factor);
  rp.combine_biased = c.RouterCombineUsesBiasedScores();
  Tensor idx = be_.Empty({T, k}, DType::kI32);
  Tensor weights = be_.Empty({T, k});
  be_.MoeRoute(y, w.router, w.bias, rp, &idx, &weights);
  if (route_idx != nullptr) *route_idx = idx;
  // Steps 2-4: latent down-projection, experts in latent space, FP32 combine.
  Tensor z = y;
  if (c.UsesLatentMoe()) {
    z = be_.Empty({T, w.latent_down.dim(0)});
    be_.Linear(y, w.latent_down, &z);
  }
  Tensor routed = be_.Empty({T, z.dim(1)});
  be_.MoeExperts(z, idx, weights, w.experts, glu_, &routed);
  // Each rank holds a slice of every expert's intermediate width: sum the partial outputs
  // BEFORE the latent norm, which is not linear (spec §7.2 TP caveat).
  AllReduce(&routed);
  if (c.UsesLatentMoe()) {
    if (c.latent_moe_use_norm) routed = Norm(routed, w.latent_norm, static_cast<float>(c.rms_norm_eps));
    Tensor up = be_.Empty({T, c.hidden_size});
    be_.Linear(routed, w.latent_up, &up);
    routed = up;
  }
  if (w.shared.defined()) {
    Tensor shared = Mlp(w.shared, y);
    be_.Add(routed, shared, &routed);
  }
  return routed;
}

Tensor Model::Attention(size_t layer, const Tensor& x, const Rows& rows, const ForwardOptions& o) {
  const LayerWeights& lw = w_.layers[layer];
  if (lw.is_kda) return Kda(lw, x, kda_slot_[layer], rows, o);
  return Mla(lw, x, mla_slot_[layer], rows, o);
}

Result<Tensor> Model::Forward(SequenceState* st, std::span<const int32_t> ids, const ForwardOptions& o) {
  SequenceState* const one[] = {st};
  Rows rows;
  rows.seqs = one;
  rows.T = static_cast<int64_t>(ids.size());
  return Run(rows, ids, o);
}

Result<Tensor> Model::ForwardDecode(std::span<SequenceState* const> states, std::span<const int32_t> ids,
                                    const ForwardOptions& o) {
  if (states.size() != ids.size()) {
    return InvalidArgument("decode batch of " + std::to_string(states.size()) + " sequences and " +
                           std::to_string(ids.size()) + " tokens");
  }
  if (states.size() == 1) return Forward(states[0], ids, o);
  for (size_t i = 0; i < states.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (states[i] == states[j]) return InvalidArgument("decode batch names one sequence twice");
    }
  }
  Rows rows;
  rows.seqs = states;
  rows.T = static_cast<int64_t>(ids.size());
  ForwardOptions every_row = o;
  every_row.all_logits = true;  // each row is some sequence's last position
  return Run(rows, ids, every_row);
}

Result<Tensor> Model::Run(const Rows& rows, std::span<const int32_t> ids, const ForwardOptions& o) {
  const ModelConfig& c = config();
  const int64_t T = rows.T;
  if (T == 0) return InvalidArgument("forward of zero tokens");
  for (int32_t id : ids) {
    if (id < 0 || id >= c.vocab_size) {
      return InvalidArgument("token id " + std::to_string(id) + " is outside the vocabulary [0, " +
                             std::to_string(c.vocab_size) + ")");
    }
  }
  for (SequenceState* st : rows.seqs) {
    if (st->kda.size() != static_cast<size_t>(c.NumKdaLayers()) || st->kv == nullptr ||
        st->kv->num_layers() != c.NumMlaLayers()) {
      return InvalidArgument("sequence state was not made by this model");
    }
  }
  // Every latent block this call writes must exist before any layer runs, so a full pool fails
  // the call cleanly instead of half-way through the layers.
  for (size_t b = 0; b < rows.seqs.size(); ++b) {
    SequenceState* st = rows.seqs[b];
    KIMIRT_RETURN_IF_ERROR(st->kv->Reserve(&st->blocks, st->length + rows.count(b)));
  }
  ForwardTrace* trace = o.trace;
  if (trace != nullptr) *trace = ForwardTrace{};
  const float eps = static_cast<float>(c.rms_norm_eps);

  // Spec §4 step 1: embedding (vocab-parallel: each rank fills its rows, the sum is the row).
  Tensor h = be_.Empty({T, c.hidden_size});
  be_.Embedding(ids, w_.embed, w_.embed_row_begin, &h);
  AllReduce(&h);

  Tensor mixed;  // the input of the final norm
  if (c.UsesAttnRes()) {
    // Spec §4.1 / §8: `prefix` accumulates sub-layer outputs since the last block boundary;
    // `bank` holds the closed blocks (entry 0: the embedding). Mixes only feed the norms.
    const int64_t block = *c.attn_res_block_size;
    std::vector<Tensor> bank;
    Tensor prefix = h;
    bool has_prefix = true;
    auto candidates = [&]() {
      std::vector<const Tensor*> v;
      for (const Tensor& b : bank) v.push_back(&b);
      v.push_back(&prefix);
      return v;
    };
    for (size_t i = 0; i < w_.layers.size(); ++i) {
      const LayerWeights& lw = w_.layers[i];
      Tensor a = bank.empty() ? prefix : Mix(candidates(), lw.attn_res_proj, lw.attn_res_norm);
      if (static_cast<int64_t>(i) % block == 0) {
        bank.push_back(prefix);  // the PRE-mix prefix (spec §4.1 step 2)
        has_prefix = false;
      }
      Tensor x = Norm(a, lw.input_norm, eps);
      Tensor attn = Attention(i, x, rows, o);
      if (has_prefix) {
        Tensor sum = be_.Empty(prefix.shape());
        be_.Add(prefix, attn, &sum);
        prefix = sum;
      } else {
        prefix = attn;
        has_prefix = true;
      }
      Tensor b = Mix(candidates(), lw.mlp_res_proj, lw.mlp_res_norm);
      Tensor y = Norm(b, lw.post_norm, eps);
      Tensor route;
      Tensor ffn = lw.is_moe ? Moe(lw.moe, y, &route) : Mlp(lw.dense, y);
      Tensor sum = be_.Empty(prefix.shape());
      be_.Add(prefix, ffn, &sum);
      prefix = sum;
      if (trace != nullptr) RecordLayer(be_, x, attn, y, ffn, route, trace);
    }
    mixed = bank.empty() ? prefix : Mix(candidates(), w_.out_res_proj, w_.out_res_norm);
  } else {
    // Plain pre-norm residual stream (Kimi-Linear, spec §1.3).
    for (size_t i = 0; i < w_.layers.size(); ++i) {
      const LayerWeights& lw = w_.layers[i];
      Tensor x = Norm(h, lw.input_norm, eps);
      Tensor attn = Attention(i, x, rows, o);
      Tensor h2 = be_.Empty(h.shape());
      be_.Add(h, attn, &h2);
      Tensor y = Norm(h2, lw.post_norm, eps);
      Tensor route;
      Tensor ffn = lw.is_moe ? Moe(lw.moe, y, &route) : Mlp(lw.dense, y);
      h = be_.Empty(h.shape());
      be_.Add(h2, ffn, &h);
      if (trace != nullptr) RecordLayer(be_, x, attn, y, ffn, route, trace);
    }
    mixed = h;
  }
  for (size_t b = 0; b < rows.seqs.size(); ++b) rows.seqs[b]->length += rows.count(b);

  // Spec §4 steps 5-6: final norm and the vocab-parallel head.
  Tensor hn = Norm(mixed, w_.norm, eps);
  if (trace != nullptr) trace->final_norm = HostCopy(be_, hn);
  Tensor head_in = o.all_logits ? hn : hn.Rows(T - 1, 1);
  const int64_t R = head_in.dim(0), Vl = w_.lm_head.dim(0), V = c.vocab_size;
  Tensor local = be_.Empty({R, Vl});
  // The last row goes through the head on its own even when every row is wanted: a GEMM's
  // summation order may depend on its row count, and the row a sampler reads must not change
  // when a caller also asks for the others (engine.h, prompt logprobs).
  if (R > 1) {
    Tensor head = local.Rows(0, R - 1);
    be_.Linear(head_in.Rows(0, R - 1), w_.lm_head, &head);
  }
  Tensor last = local.Rows(R - 1, 1);
  be_.Linear(head_in.Rows(R - 1, 1), w_.lm_head, &last);
  Tensor host_local = HostCopy(be_, local);
  Tensor logits = Tensor::Host({R, V});
  const int tp = comm_.size();
  std::vector<float> gathered;
  const float* all = host_local.f32();
  if (tp > 1) {
    gathered.resize(static_cast<size_t>(tp * R * Vl));
    comm_.AllGather(host_local.f32(), static_cast<size_t>(R * Vl), gathered.data());
    all = gathered.data();
  }
  // Rank r's block [R, Vl] holds vocabulary rows [r*Vl, (r+1)*Vl); rows past V are padding.
  for (int r = 0; r < tp; ++r) {
    for (int64_t t = 0; t < R; ++t) {
      for (int64_t j = 0; j < Vl; ++j) {
        const int64_t v = r * Vl + j;
        if (v < V) logits.f32()[t * V + v] = all[(static_cast<int64_t>(r) * R + t) * Vl + j];
      }
    }
  }
  return logits;
}

}  // namespace kimirt
