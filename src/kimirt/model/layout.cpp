// Builds the tensor inventory of spec §2 from a ModelConfig and computes TP slices with the
// placement rules of spec §11. Names and shapes are checked against the released-format
// fixtures (layout_test.cpp) and the byte totals against the seed (tools/plan_test.cpp).
#include "kimirt/model/layout.h"

#include <algorithm>
#include <optional>

#include "kimirt/core/check.h"

namespace kimirt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

Placement Replicated() { return {}; }
Placement Column(int64_t units, int8_t dim = 0) { return {PlacementKind::kColumn, dim, units, 1}; }
Placement Row(int64_t units) { return {PlacementKind::kRow, 1, units, 1}; }

}  // namespace

std::string_view CategoryName(Category c) {
  switch (c) {
    case Category::kDenseMlp: return "Dense MLP";
    case Category::kRoutedExpert: return "Routed Expert";
    case Category::kSharedExpert: return "Shared Expert";
    case Category::kKdaGemm: return "KDA Attention GEMM";
    case Category::kMlaGemm: return "MLA Attention GEMM";
    case Category::kNorm: return "Norm";
    case Category::kOther: return "Other";
  }
  return "?";
}

std::string_view PlacementKindName(PlacementKind k) {
  switch (k) {
    case PlacementKind::kReplicated: return "replicated";
    case PlacementKind::kColumn: return "column";
    case PlacementKind::kRow: return "row";
    case PlacementKind::kVocab: return "vocab-parallel";
    case PlacementKind::kHeadVector: return "head-sharded vector";
    case PlacementKind::kExpertShard: return "expert-intermediate";
    case PlacementKind::kSkipped: return "skipped";
  }
  return "?";
}

uint64_t TensorSpec::nbytes() const {
  return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype);
}

std::string Layout::LayerPrefix(int64_t layer) const {
  return model_prefix_ + "layers." + std::to_string(layer) + ".";
}

Result<Layout> Layout::Build(const ModelConfig& c) {
  Layout L;
  L.config_ = c;
  const bool k3 = c.family == ModelFamily::kKimiK3;
  const std::string root = c.multimodal_wrapper ? "language_model." : "";
  L.model_prefix_ = root + "model.";
  const std::string& P = L.model_prefix_;
  const int64_t D = c.hidden_size;
  const int64_t V = c.vocab_size;
  L.tensors_.reserve(static_cast<size_t>(
      16 + c.num_hidden_layers * 24 + c.NumMoeLayers() * c.num_experts * 6 + 200));

  auto add = [&L](std::string name, Shape shape, DType dtype, Category cat, Placement pl,
                  int64_t layer = -1, std::optional<DType> alt = std::nullopt) {
    TensorSpec t;
    t.name = std::move(name);
    t.shape = std::move(shape);
    t.dtype = dtype;
    t.category = cat;
    t.placement = pl;
    t.layer = static_cast<int32_t>(layer);
    t.alt_dtype = alt.value_or(dtype);
    L.tensors_.push_back(std::move(t));
  };
  const DType bf16 = DType::kBF16;
  const DType f32 = DType::kF32;

  // Spec §2.2: model-level tensors. Embedding and head are vocab-parallel (§11).
  const Placement vocab{PlacementKind::kVocab, 0, 0, 1};
  add(P + "embed_tokens.weight", {V, D}, bf16, Category::kOther, vocab);
  if (!c.tie_word_embeddings) add(root + "lm_head.weight", {V, D}, bf16, Category::kOther, vocab);
  add(P + "norm.weight", {D}, bf16, Category::kNorm, Replicated());
  if (c.UsesAttnRes()) {
    add(P + "output_attn_res_norm.weight", {D}, bf16, Category::kNorm, Replicated());
    add(P + "output_attn_res_proj.weight", {1, D}, bf16, Category::kOther, Replicated());
  }

  const int64_t H = c.linear_attn.num_heads;
  const int64_t K = c.linear_attn.head_dim;
  const int64_t Pk = c.KdaProjDim();
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  const int64_t Hm = c.num_attention_heads;
  // Spec §2.8 vs the 48B fixture: K3 stores conv taps and o_norm F32; Kimi-Linear BF16.
  const DType conv_dtype = k3 ? f32 : bf16;
  const DType conv_alt = k3 ? bf16 : f32;

  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const std::string Lp = L.LayerPrefix(i);
    // Spec §2.3: per-layer norms and AttnRes pseudo-queries.
    add(Lp + "input_layernorm.weight", {D}, bf16, Category::kNorm, Replicated(), i);
    add(Lp + "post_attention_layernorm.weight", {D}, bf16, Category::kNorm, Replicated(), i);
    if (c.UsesAttnRes()) {
      add(Lp + "self_attention_res_norm.weight", {D}, bf16, Category::kNorm, Replicated(), i);
      add(Lp + "self_attention_res_proj.weight", {1, D}, bf16, Category::kOther, Replicated(), i);
      add(Lp + "mlp_res_norm.weight", {D}, bf16, Category::kNorm, Replicated(), i);
      add(Lp + "mlp_res_proj.weight", {1, D}, bf16, Category::kOther, Replicated(), i);
    }
    const std::string A = Lp + "self_attn.";
    if (c.IsKdaLayer(i)) {
      // Spec §2.4; placement §11 (heads split; f_a replicated).
      for (const char* p : {"q_proj", "k_proj", "v_proj"}) {
        add(A + p + ".weight", {Pk, D}, bf16, Category::kKdaGemm, Column(H), i);
      }
      if (c.linear_attn.use_full_rank_gate) {
        add(A + "g_proj.weight", {Pk, D}, bf16, Category::kKdaGemm, Column(H), i);
      } else {
        add(A + "g_a_proj.weight", {K, D}, bf16, Category::kKdaGemm, Replicated(), i);
        add(A + "g_b_proj.weight", {Pk, K}, bf16, Category::kKdaGemm, Column(H), i);
      }
      add(A + "b_proj.weight", {H, D}, bf16, Category::kKdaGemm, Column(H), i);
      add(A + "f_a_proj.weight", {K, D}, bf16, Category::kKdaGemm, Replicated(), i);
      add(A + "f_b_proj.weight", {Pk, K}, bf16, Category::kKdaGemm, Column(H), i);
      for (const char* p : {"q_conv1d", "k_conv1d", "v_conv1d"}) {
        add(A + p + ".weight", {Pk, 1, W}, conv_dtype, Category::kOther, Column(H), i, conv_alt);
      }
      if (k3) {
        // Spec §2.4: A_log stored F32 padded to a multiple of 128; only the first H are real.
        add(A + "A_log", {RoundUp(H, 128)}, f32, Category::kOther,
            {PlacementKind::kHeadVector, 0, H, 1}, i, bf16);
      } else {
        add(A + "A_log", {1, 1, H, 1}, f32, Category::kOther, {PlacementKind::kHeadVector, 2, H, 1},
            i, bf16);
      }
      add(A + "dt_bias", {Pk}, f32, Category::kOther, Column(H), i, bf16);
      add(A + "o_norm.weight", {K}, conv_dtype, Category::kNorm, Replicated(), i, conv_alt);
      add(A + "o_proj.weight", {D, Pk}, bf16, Category::kKdaGemm, Row(H), i);
    } else {
      // Spec §2.5; placement §11 (q_a/kv_a replicated, head projections split).
      const int64_t qk = c.MlaQkHeadDim();
      if (c.q_lora_rank) {
        const int64_t rq = *c.q_lora_rank;
        add(A + "q_a_proj.weight", {rq, D}, bf16, Category::kMlaGemm, Replicated(), i);
        add(A + "q_a_layernorm.weight", {rq}, bf16, Category::kNorm, Replicated(), i);
        add(A + "q_b_proj.weight", {Hm * qk, rq}, bf16, Category::kMlaGemm, Column(Hm), i);
      } else {
        add(A + "q_proj.weight", {Hm * qk, D}, bf16, Category::kMlaGemm, Column(Hm), i);
      }
      add(A + "kv_a_proj_with_mqa.weight", {c.kv_lora_rank + c.qk_rope_head_dim, D}, bf16,
          Category::kMlaGemm, Replicated(), i);
      add(A + "kv_a_layernorm.weight", {c.kv_lora_rank}, bf16, Category::kNorm, Replicated(), i);
      add(A + "kv_b_proj.weight", {Hm * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank}, bf16,
          Category::kMlaGemm, Column(Hm), i);
      if (c.mla_use_output_gate) {
        add(A + "g_proj.weight", {Hm * c.v_head_dim, D}, bf16, Category::kMlaGemm, Column(Hm), i);
      }
      add(A + "o_proj.weight", {D, Hm * c.v_head_dim}, bf16, Category::kMlaGemm, Row(Hm), i);
    }

    if (!c.IsMoeLayer(i)) {
      // Spec §2.6: dense FFN; gate/up column, down row.
      const int64_t I = c.intermediate_size;
      const std::string M = Lp + "mlp.";
      add(M + "gate_proj.weight", {I, D}, bf16, Category::kDenseMlp, Column(I), i);
      add(M + "up_proj.weight", {I, D}, bf16, Category::kDenseMlp, Column(I), i);
      add(M + "down_proj.weight", {D, I}, bf16, Category::kDenseMlp, Row(I), i);
      continue;
    }
    // Spec §2.7: MoE block. Router and LatentMoE projections replicated (§11).
    const std::string M = Lp + "block_sparse_moe.";
    const int64_t E = c.num_experts;
    add(M + "gate.weight", {E, D}, bf16, Category::kOther, Replicated(), i);
    add(M + "gate.e_score_correction_bias", {E}, f32, Category::kOther, Replicated(), i, bf16);
    const int64_t Dl = c.ExpertHiddenSize();
    if (c.UsesLatentMoe()) {
      add(M + "routed_expert_down_proj.weight", {Dl, D}, bf16, Category::kOther, Replicated(), i);
      add(M + "routed_expert_up_proj.weight", {D, Dl}, bf16, Category::kOther, Replicated(), i);
      if (c.latent_moe_use_norm) {
        add(M + "routed_expert_norm.weight", {Dl}, bf16, Category::kNorm, Replicated(), i);
      }
    }
    if (c.num_shared_experts > 0) {
      const int64_t Is = c.SharedExpertIntermediate();
      add(M + "shared_experts.gate_proj.weight", {Is, D}, bf16, Category::kSharedExpert, Column(Is), i);
      add(M + "shared_experts.up_proj.weight", {Is, D}, bf16, Category::kSharedExpert, Column(Is), i);
      add(M + "shared_experts.down_proj.weight", {D, Is}, bf16, Category::kSharedExpert, Row(Is), i);
    }
    const int64_t I = c.moe_intermediate_size;
    auto expert = [&](int64_t e, const char* w, Shape shape, DType dt, int8_t dim, int32_t epi,
                      const char* suffix) {
      TensorSpec t;
      t.name = M + "experts." + std::to_string(e) + "." + w + suffix;
      t.shape = std::move(shape);
      t.dtype = dt;
      t.alt_dtype = dt;
      t.category = Category::kRoutedExpert;
      t.placement = {PlacementKind::kExpertShard, dim, I, epi};
      t.layer = static_cast<int32_t>(i);
      t.expert = static_cast<int32_t>(e);
      L.tensors_.push_back(std::move(t));
    };
    for (int64_t e = 0; e < E; ++e) {
      if (c.quantization.routed_experts_mxfp4) {
        // Spec §2.9: packed nibbles [out, in/2] + E8M0 scales [out, in/32]; w1 gate, w3 up, w2 down.
        expert(e, "w1", {I, Dl / 2}, DType::kU8, 0, 1, ".weight_packed");
        expert(e, "w1", {I, Dl / 32}, DType::kU8, 0, 1, ".weight_scale");
        expert(e, "w2", {Dl, I / 2}, DType::kU8, 1, 2, ".weight_packed");
        expert(e, "w2", {Dl, I / 32}, DType::kU8, 1, 32, ".weight_scale");
        expert(e, "w3", {I, Dl / 2}, DType::kU8, 0, 1, ".weight_packed");
        expert(e, "w3", {I, Dl / 32}, DType::kU8, 0, 1, ".weight_scale");
      } else {
        expert(e, "w1", {I, Dl}, bf16, 0, 1, ".weight");
        expert(e, "w2", {Dl, I}, bf16, 1, 1, ".weight");
        expert(e, "w3", {I, Dl}, bf16, 0, 1, ".weight");
      }
    }
  }

  if (c.multimodal_wrapper && c.vision.present) {
    // The MoonViT3d tower and projector (k3-checkpoint-memory.md inventory): 168 tensors, no
    // biases. The text server skips them (spec §2.1); --with-vision loads them replicated.
    const VisionConfig& v = c.vision;
    const int64_t Hv = v.hidden_size;
    const int64_t Hmm = Hv * v.merge_kernel_area;
    const Placement skip{PlacementKind::kSkipped, 0, 0, 1};
    auto vis = [&](std::string name, Shape shape, Category cat) {
      TensorSpec t;
      t.name = std::move(name);
      t.shape = std::move(shape);
      t.dtype = t.alt_dtype = bf16;
      t.category = cat;
      t.component = Component::kVision;
      t.placement = skip;
      L.tensors_.push_back(std::move(t));
    };
    const std::string T = "vision_tower.";
    vis(T + "patch_embed.proj.weight", {Hv, 3, v.patch_size, v.patch_size}, Category::kOther);
    vis(T + "patch_embed.pos_emb.weight", {v.pos_emb_height, v.pos_emb_width, Hv}, Category::kOther);
    for (int64_t b = 0; b < v.num_layers; ++b) {
      const std::string B = T + "encoder.blocks." + std::to_string(b) + ".";
      vis(B + "norm0.weight", {Hv}, Category::kNorm);
      vis(B + "norm1.weight", {Hv}, Category::kNorm);
      vis(B + "mlp.fc0.weight", {v.intermediate_size, Hv}, Category::kOther);
      vis(B + "mlp.fc1.weight", {Hv, v.intermediate_size}, Category::kOther);
      vis(B + "wqkv.weight", {3 * v.qkv_hidden_size, Hv}, Category::kOther);
      vis(B + "wo.weight", {Hv, v.qkv_hidden_size}, Category::kOther);
    }
    vis(T + "encoder.final_layernorm.weight", {Hv}, Category::kNorm);
    vis("mm_projector.proj.0.weight", {Hmm, Hmm}, Category::kOther);
    vis("mm_projector.proj.2.weight", {D, Hmm}, Category::kOther);
    vis("mm_projector.post_norm.weight", {D}, Category::kNorm);
  }

  // A config's sizes are each capped (config.cpp), but their products are not: refuse tensors
  // past 2^44 elements (16 T; K3's largest has 1.2 G) so byte counts never overflow.
  for (const TensorSpec& t : L.tensors_) {
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 44)) {
        return InvalidArgument("config implies tensor " + t.name + " of shape " + ShapeToString(t.shape) +
                               ", too large to be a real checkpoint tensor");
      }
    }
  }
  L.index_.reserve(L.tensors_.size());
  for (size_t k = 0; k < L.tensors_.size(); ++k) {
    if (!L.index_.emplace(L.tensors_[k].name, k).second) {
      return Internal("layout names tensor " + L.tensors_[k].name + " twice");
    }
  }
  return L;
}

const TensorSpec* Layout::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Layout::total_bytes() const {
  uint64_t n = 0;
  for (const TensorSpec& t : tensors_) n += t.nbytes();
  return n;
}

Status Layout::CheckParallelism(const Parallelism& par) const {
  if (par.tp < 1) return InvalidArgument("tensor-parallel degree must be >= 1, got " + std::to_string(par.tp));
  if (par.ep != 1 && par.ep != par.tp) {
    return Unsupported("expert parallelism must be 1 or equal to the TP degree (" +
                       std::to_string(par.tp) + "), got " + std::to_string(par.ep));
  }
  if (par.pad_align < 1 || par.pad_align % 32 != 0) {
    return InvalidArgument("MoE pad_align must be a positive multiple of 32, got " +
                           std::to_string(par.pad_align));
  }
  for (const TensorSpec& t : tensors_) {
    const Placement& p = t.placement;
    const int64_t size = p.kind == PlacementKind::kReplicated || p.kind == PlacementKind::kSkipped
                             ? 0
                             : t.shape[static_cast<size_t>(p.dim)];
    const int64_t units = p.units == 0 ? size : p.units;
    switch (p.kind) {
      case PlacementKind::kColumn:
      case PlacementKind::kRow:
      case PlacementKind::kHeadVector:
        if (units % par.tp != 0) {
          return InvalidArgument(t.name + ": " + std::to_string(units) + " " +
                                 (units == size ? "rows" : "heads") + " along dim " +
                                 std::to_string(p.dim) + " do not split over TP " +
                                 std::to_string(par.tp));
        }
        break;
      case PlacementKind::kExpertShard: {
        if (par.ep > 1) break;
        if (units % par.tp != 0) {
          return InvalidArgument(t.name + ": expert intermediate " + std::to_string(units) +
                                 " does not split over TP " + std::to_string(par.tp));
        }
        if (!par.experts_dequantized && (units / par.tp) % p.elems_per_index != 0) {
          return InvalidArgument(t.name + ": a TP " + std::to_string(par.tp) + " slice of " +
                                 std::to_string(units / par.tp) +
                                 " intermediate elements cuts an MXFP4 scale group of " +
                                 std::to_string(p.elems_per_index));
        }
        break;
      }
      default:
        break;
    }
  }
  return Status::Ok();
}

TensorSlice Layout::SliceFor(const TensorSpec& t, const Parallelism& par, int rank) const {
  TensorSlice s;
  const Placement& p = t.placement;
  const uint64_t total = t.nbytes();
  auto whole = [&] {
    s.dim = -1;
    s.loaded_bytes = s.allocated_bytes = total;
    return s;
  };
  if (p.kind == PlacementKind::kSkipped) {
    if (par.load_vision) return whole();
    s.loaded = false;
    return s;
  }
  if (p.kind == PlacementKind::kReplicated || par.tp == 1) return whole();

  const int64_t size = t.shape[static_cast<size_t>(p.dim)];
  const int64_t units = p.units == 0 ? size : p.units;
  // Bytes of one index along `dim`.
  const uint64_t per_index = size == 0 ? 0 : total / static_cast<uint64_t>(size);
  s.dim = p.dim;
  switch (p.kind) {
    case PlacementKind::kColumn:
    case PlacementKind::kRow: {
      KIMIRT_CHECK(units % par.tp == 0);
      const int64_t per = size / par.tp;
      s.begin = rank * per;
      s.length = s.allocated = per;
      break;
    }
    case PlacementKind::kVocab: {
      const int64_t per = CeilDiv(size, par.tp);
      s.begin = std::min<int64_t>(rank * per, size);
      s.length = std::min<int64_t>(per, size - s.begin);
      s.allocated = per;
      break;
    }
    case PlacementKind::kHeadVector: {
      KIMIRT_CHECK(units % par.tp == 0);
      // Only the first `units` entries are real (the rest is padding, spec §2.4).
      const int64_t per = units / par.tp;
      s.begin = rank * per;
      s.length = s.allocated = per;
      break;
    }
    case PlacementKind::kExpertShard: {
      if (par.ep > 1) {
        const int64_t experts = config_.num_experts;
        const int64_t per_rank = CeilDiv(experts, par.ep);
        if (t.expert / per_rank != rank) {
          s.loaded = false;
          s.dim = -1;
          return s;
        }
        return whole();
      }
      KIMIRT_CHECK(units % par.tp == 0);
      const int64_t elems = units / par.tp;
      const int64_t padded = RoundUp(elems, par.pad_align);
      s.begin = rank * elems / p.elems_per_index;
      s.length = elems / p.elems_per_index;
      s.allocated = padded / p.elems_per_index;
      break;
    }
    default:
      return whole();
  }
  s.loaded_bytes = per_index * static_cast<uint64_t>(s.length);
  s.allocated_bytes = per_index * static_cast<uint64_t>(s.allocated);
  return s;
}

Status LayoutMismatch::ToStatus(std::string_view checkpoint_dir) const {
  if (ok()) return Status::Ok();
  std::string msg = std::string(checkpoint_dir) + " does not match its config:";
  auto list = [&msg](const std::vector<std::string>& v, const char* what) {
    if (v.empty()) return;
    msg += " " + std::to_string(v.size()) + " " + what + " (";
    for (size_t i = 0; i < v.size() && i < 3; ++i) msg += (i ? "; " : "") + v[i];
    if (v.size() > 3) msg += "; ...";
    msg += ")";
  };
  list(missing, "missing");
  list(unexpected, "unexpected");
  list(wrong, "mis-shaped or mis-typed");
  return Corrupt(msg);
}

LayoutMismatch CheckCheckpoint(const Layout& layout, const Checkpoint& ckpt) {
  LayoutMismatch m;
  for (const TensorSpec& t : layout.tensors()) {
    const Checkpoint::Entry* e = ckpt.Find(t.name);
    if (e == nullptr) {
      m.missing.push_back(t.name);
      continue;
    }
    const TensorInfo& info = *e->info;
    if (info.shape != t.shape || (info.dtype != t.dtype && info.dtype != t.alt_dtype)) {
      m.wrong.push_back(t.name + " is " + ShapeToString(info.shape) + " " +
                        std::string(DTypeName(info.dtype)) + ", expected " + ShapeToString(t.shape) +
                        " " + std::string(DTypeName(t.dtype)));
    }
  }
  for (const Checkpoint::Entry& e : ckpt.entries()) {
    if (layout.Find(e.info->name) == nullptr) m.unexpected.push_back(e.info->name);
  }
  return m;
}

}  // namespace kimirt
