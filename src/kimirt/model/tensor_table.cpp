// The tensor table: every checkpoint tensor a config implies, one table per block kind, each entry
// labelled like gemma.cpp's tensor_info.cc. This file is the only place that spells a checkpoint
// tensor name; every other reader (loader, planner, checkpoint writer, bench) goes by the role.
//
// Order is the released checkpoint's (model-level, then each layer, then vision), which fixes the
// shard a tensor lands in when the checkpoint writer fills shards in table order.
#include "kimirt/model/tensor_table.h"

#include <optional>

namespace kimirt {
namespace {

using R = TensorRole;

int64_t RoundUp(int64_t a, int64_t b) { return (a + b - 1) / b * b; }

Placement Replicated() { return {}; }
Placement Column(int64_t units) { return {PlacementKind::kColumn, 0, units, 1}; }
Placement Row(int64_t units) { return {PlacementKind::kRow, 1, units, 1}; }

// One row of a block's table. `name` is relative to the block's prefix; `alt` is the dtype a
// loader also accepts (spec §15.3), none when only `dtype` is valid.
struct Entry {
  TensorRole role;
  std::string name;
  Shape shape;
  DType dtype = DType::kBF16;
  std::optional<DType> alt = std::nullopt;
  Category category = Category::kOther;
  Placement placement = Replicated();
};

// Appends entries under one prefix (a block of one layer, or of one expert).
class Block {
 public:
  Block(std::vector<TensorSpec>* out, std::string prefix, int64_t layer = -1, int64_t expert = -1,
        Component component = Component::kText)
      : out_(out), prefix_(std::move(prefix)), layer_(layer), expert_(expert), component_(component) {}

  void Add(Entry e) {
    // The text server skips the vision tower (spec §2.1); --with-vision loads it replicated.
    if (component_ == Component::kVision) e.placement = {PlacementKind::kSkipped, 0, 0, 1};
    TensorSpec t;
    t.name = prefix_ + e.name;
    t.role = e.role;
    t.shape = std::move(e.shape);
    t.dtype = e.dtype;
    t.alt_dtype = e.alt.value_or(e.dtype);
    t.category = e.category;
    t.component = component_;
    t.placement = e.placement;
    t.layer = static_cast<int32_t>(layer_);
    t.expert = static_cast<int32_t>(expert_);
    out_->push_back(std::move(t));
  }
  // A child block: `sub` appended to this prefix.
  Block Sub(const std::string& sub) const { return Block(out_, prefix_ + sub, layer_, expert_, component_); }
  // Decoder layer `i` of the model block; routed expert `e` of an MoE block.
  Block Layer(int64_t i) const { return Block(out_, prefix_ + "layers." + std::to_string(i) + ".", i); }
  Block Expert(int64_t e) const {
    return Block(out_, prefix_ + "experts." + std::to_string(e) + ".", layer_, e, component_);
  }

 private:
  std::vector<TensorSpec>* out_;
  std::string prefix_;
  int64_t layer_, expert_;
  Component component_;
};

// Spec §2.2: embeddings, final norm, head. Embedding and head are vocab-parallel (§11).
void EmbeddingTable(const ModelConfig& c, Block model, Block root) {
  const int64_t D = c.hidden_size, V = c.vocab_size;
  const Placement vocab{PlacementKind::kVocab, 0, 0, 1};
  model.Add({.role = R::kEmbed, .name = "embed_tokens.weight", .shape = {V, D}, .placement = vocab});
  if (!c.tie_word_embeddings) {
    root.Add({.role = R::kLmHead, .name = "lm_head.weight", .shape = {V, D}, .placement = vocab});
  }
  model.Add({.role = R::kFinalNorm, .name = "norm.weight", .shape = {D}, .category = Category::kNorm});
}

// Spec §2.2, §2.3, §8: AttnRes mixes, each an RMSNorm gain [D] and a pseudo-query [1, D],
// replicated: one over the model's output (`output`, in the model block), two in every layer
// (before attention, before the FFN).
void AttnResTable(const ModelConfig& c, Block b, bool output) {
  const int64_t D = c.hidden_size;
  const Category norm = Category::kNorm;
  if (output) {
    b.Add({.role = R::kOutputResNorm, .name = "output_attn_res_norm.weight", .shape = {D}, .category = norm});
    b.Add({.role = R::kOutputResProj, .name = "output_attn_res_proj.weight", .shape = {1, D}});
    return;
  }
  b.Add({.role = R::kAttnResNorm, .name = "self_attention_res_norm.weight", .shape = {D}, .category = norm});
  b.Add({.role = R::kAttnResProj, .name = "self_attention_res_proj.weight", .shape = {1, D}});
  b.Add({.role = R::kMlpResNorm, .name = "mlp_res_norm.weight", .shape = {D}, .category = norm});
  b.Add({.role = R::kMlpResProj, .name = "mlp_res_proj.weight", .shape = {1, D}});
}

// Spec §2.3: the two pre-norms of every layer.
void LayerNormTable(const ModelConfig& c, Block layer) {
  const int64_t D = c.hidden_size;
  layer.Add({.role = R::kInputNorm, .name = "input_layernorm.weight", .shape = {D},
             .category = Category::kNorm});
  layer.Add({.role = R::kPostAttnNorm, .name = "post_attention_layernorm.weight", .shape = {D},
             .category = Category::kNorm});
}

// Spec §2.4; placement §11 (heads split; f_a and the low-rank gate's down projection replicated).
void KdaTable(const ModelConfig& c, Block attn) {
  const bool k3 = c.family == ModelFamily::kKimiK3;
  const int64_t D = c.hidden_size;
  const int64_t H = c.linear_attn.num_heads;
  const int64_t K = c.linear_attn.head_dim;
  const int64_t P = c.KdaProjDim();
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  const Category gemm = Category::kKdaGemm;
  // Spec §2.8 vs the 48B fixture: K3 stores conv taps and o_norm F32; Kimi-Linear BF16.
  const DType islands = k3 ? DType::kF32 : DType::kBF16;
  const DType islands_alt = k3 ? DType::kBF16 : DType::kF32;
  const Placement heads = Column(H);
  attn.Add({.role = R::kKdaQ, .name = "q_proj.weight", .shape = {P, D}, .category = gemm, .placement = heads});
  attn.Add({.role = R::kKdaK, .name = "k_proj.weight", .shape = {P, D}, .category = gemm, .placement = heads});
  attn.Add({.role = R::kKdaV, .name = "v_proj.weight", .shape = {P, D}, .category = gemm, .placement = heads});
  if (c.linear_attn.use_full_rank_gate) {
    attn.Add({.role = R::kKdaGate, .name = "g_proj.weight", .shape = {P, D}, .category = gemm,
              .placement = heads});
  } else {
    attn.Add({.role = R::kKdaGateA, .name = "g_a_proj.weight", .shape = {K, D}, .category = gemm});
    attn.Add({.role = R::kKdaGateB, .name = "g_b_proj.weight", .shape = {P, K}, .category = gemm,
              .placement = heads});
  }
  attn.Add({.role = R::kKdaBeta, .name = "b_proj.weight", .shape = {H, D}, .category = gemm, .placement = heads});
  attn.Add({.role = R::kKdaDecayA, .name = "f_a_proj.weight", .shape = {K, D}, .category = gemm});
  attn.Add({.role = R::kKdaDecayB, .name = "f_b_proj.weight", .shape = {P, K}, .category = gemm,
            .placement = heads});
  attn.Add({.role = R::kKdaConvQ, .name = "q_conv1d.weight", .shape = {P, 1, W}, .dtype = islands,
            .alt = islands_alt, .placement = heads});
  attn.Add({.role = R::kKdaConvK, .name = "k_conv1d.weight", .shape = {P, 1, W}, .dtype = islands,
            .alt = islands_alt, .placement = heads});
  attn.Add({.role = R::kKdaConvV, .name = "v_conv1d.weight", .shape = {P, 1, W}, .dtype = islands,
            .alt = islands_alt, .placement = heads});
  // Spec §2.4: K3 stores A_log F32 padded to a multiple of 128 (only the first H are real);
  // Kimi-Linear as [1, 1, H, 1].
  attn.Add({.role = R::kKdaALog, .name = "A_log", .shape = k3 ? Shape{RoundUp(H, 128)} : Shape{1, 1, H, 1},
            .dtype = DType::kF32, .alt = DType::kBF16,
            .placement = {PlacementKind::kHeadVector, static_cast<int8_t>(k3 ? 0 : 2), H, 1}});
  attn.Add({.role = R::kKdaDtBias, .name = "dt_bias", .shape = {P}, .dtype = DType::kF32, .alt = DType::kBF16,
            .placement = heads});
  attn.Add({.role = R::kKdaOutNorm, .name = "o_norm.weight", .shape = {K}, .dtype = islands,
            .alt = islands_alt, .category = Category::kNorm});
  attn.Add({.role = R::kKdaOut, .name = "o_proj.weight", .shape = {D, P}, .category = gemm, .placement = Row(H)});
}

// Spec §2.5; placement §11 (q_a / kv_a replicated, head projections split).
void MlaTable(const ModelConfig& c, Block attn) {
  const int64_t D = c.hidden_size;
  const int64_t H = c.num_attention_heads;
  const int64_t qk = c.MlaQkHeadDim();
  const int64_t r = c.kv_lora_rank;
  const int64_t dv = c.v_head_dim;
  const Category gemm = Category::kMlaGemm;
  if (c.q_lora_rank) {
    const int64_t rq = *c.q_lora_rank;
    attn.Add({.role = R::kMlaQA, .name = "q_a_proj.weight", .shape = {rq, D}, .category = gemm});
    attn.Add({.role = R::kMlaQANorm, .name = "q_a_layernorm.weight", .shape = {rq},
              .category = Category::kNorm});
    attn.Add({.role = R::kMlaQB, .name = "q_b_proj.weight", .shape = {H * qk, rq}, .category = gemm,
              .placement = Column(H)});
  } else {
    attn.Add({.role = R::kMlaQ, .name = "q_proj.weight", .shape = {H * qk, D}, .category = gemm,
              .placement = Column(H)});
  }
  attn.Add({.role = R::kMlaKvA, .name = "kv_a_proj_with_mqa.weight", .shape = {r + c.qk_rope_head_dim, D},
            .category = gemm});
  attn.Add({.role = R::kMlaKvANorm, .name = "kv_a_layernorm.weight", .shape = {r},
            .category = Category::kNorm});
  attn.Add({.role = R::kMlaKvB, .name = "kv_b_proj.weight", .shape = {H * (c.qk_nope_head_dim + dv), r},
            .category = gemm, .placement = Column(H)});
  if (c.mla_use_output_gate) {
    attn.Add({.role = R::kMlaGate, .name = "g_proj.weight", .shape = {H * dv, D}, .category = gemm,
              .placement = Column(H)});
  }
  attn.Add({.role = R::kMlaOut, .name = "o_proj.weight", .shape = {D, H * dv}, .category = gemm,
            .placement = Row(H)});
}

// Spec §2.6, §2.7: a GLU MLP of intermediate width I (the dense FFN and the MoE's shared expert);
// gate/up column parallel, down row parallel.
struct GluRoles {
  TensorRole gate, up, down;
};
void GluMlpTable(const ModelConfig& c, Block mlp, int64_t I, Category cat, GluRoles roles) {
  const int64_t D = c.hidden_size;
  mlp.Add({.role = roles.gate, .name = "gate_proj.weight", .shape = {I, D}, .category = cat,
           .placement = Column(I)});
  mlp.Add({.role = roles.up, .name = "up_proj.weight", .shape = {I, D}, .category = cat, .placement = Column(I)});
  mlp.Add({.role = roles.down, .name = "down_proj.weight", .shape = {D, I}, .category = cat, .placement = Row(I)});
}

// Spec §2.7, §2.9: one routed expert's three matrices (w1 gate, w2 down, w3 up, in checkpoint
// order), split along the intermediate width I under TP (§11). A matrix is [rows, in] logically;
// MXFP4 stores it as codes [rows, in/2] and scales [rows, in/32], so along the input dim (w2) one
// stored index holds 2 (codes) or 32 (scales) logical elements.
void ExpertTable(const ModelConfig& c, Block expert) {
  const int64_t I = c.moe_intermediate_size;
  const int64_t Dl = c.ExpertHiddenSize();
  struct Matrix {
    const char* name;
    TensorRole plain, codes, scales;
    int64_t rows, in;
    int8_t dim;  // the intermediate dim
  };
  const Matrix matrices[] = {
      {"w1", R::kExpertGate, R::kExpertGateCodes, R::kExpertGateScales, I, Dl, 0},
      {"w2", R::kExpertDown, R::kExpertDownCodes, R::kExpertDownScales, Dl, I, 1},
      {"w3", R::kExpertUp, R::kExpertUpCodes, R::kExpertUpScales, I, Dl, 0},
  };
  auto shard = [I](int8_t dim, int32_t elems_per_index) {
    return Placement{PlacementKind::kExpertShard, dim, I, elems_per_index};
  };
  const Category cat = Category::kRoutedExpert;
  for (const Matrix& m : matrices) {
    const std::string n = std::string(m.name) + ".";
    if (!c.quantization.routed_experts_mxfp4) {
      expert.Add({.role = m.plain, .name = n + "weight", .shape = {m.rows, m.in}, .category = cat,
                  .placement = shard(m.dim, 1)});
      continue;
    }
    expert.Add({.role = m.codes, .name = n + "weight_packed", .shape = {m.rows, m.in / 2},
                .dtype = DType::kU8, .category = cat, .placement = shard(m.dim, m.dim == 1 ? 2 : 1)});
    expert.Add({.role = m.scales, .name = n + "weight_scale", .shape = {m.rows, m.in / 32},
                .dtype = DType::kU8, .category = cat, .placement = shard(m.dim, m.dim == 1 ? 32 : 1)});
  }
}

// Spec §2.7: the MoE block. Router and LatentMoE projections replicated (§11).
void MoeTable(const ModelConfig& c, Block moe) {
  const int64_t D = c.hidden_size;
  const int64_t E = c.num_experts;
  const int64_t Dl = c.ExpertHiddenSize();
  moe.Add({.role = R::kRouter, .name = "gate.weight", .shape = {E, D}});
  moe.Add({.role = R::kRouterBias, .name = "gate.e_score_correction_bias", .shape = {E}, .dtype = DType::kF32,
           .alt = DType::kBF16});
  if (c.UsesLatentMoe()) {
    moe.Add({.role = R::kLatentDown, .name = "routed_expert_down_proj.weight", .shape = {Dl, D}});
    moe.Add({.role = R::kLatentUp, .name = "routed_expert_up_proj.weight", .shape = {D, Dl}});
    if (c.latent_moe_use_norm) {
      moe.Add({.role = R::kLatentNorm, .name = "routed_expert_norm.weight", .shape = {Dl},
               .category = Category::kNorm});
    }
  }
  if (c.num_shared_experts > 0) {
    GluMlpTable(c, moe.Sub("shared_experts."), c.SharedExpertIntermediate(), Category::kSharedExpert,
                {R::kSharedGate, R::kSharedUp, R::kSharedDown});
  }
  for (int64_t e = 0; e < E; ++e) ExpertTable(c, moe.Expert(e));
}

// The MoonViT3d tower and projector (k3-checkpoint-memory.md inventory): 168 tensors, no biases,
// all skipped by the text server (Block::Add).
void VisionTable(const ModelConfig& c, std::vector<TensorSpec>* out) {
  const VisionConfig& v = c.vision;
  const int64_t D = c.hidden_size;
  const int64_t Hv = v.hidden_size;
  const int64_t Hmm = Hv * v.merge_kernel_area;
  const int64_t I = v.intermediate_size;
  const Category norm = Category::kNorm;
  Block tower(out, "vision_tower.", -1, -1, Component::kVision);
  tower.Add({.role = R::kVisionPatchProj, .name = "patch_embed.proj.weight",
             .shape = {Hv, 3, v.patch_size, v.patch_size}});
  tower.Add({.role = R::kVisionPosEmb, .name = "patch_embed.pos_emb.weight",
             .shape = {v.pos_emb_height, v.pos_emb_width, Hv}});
  for (int64_t b = 0; b < v.num_layers; ++b) {
    Block blk = tower.Sub("encoder.blocks." + std::to_string(b) + ".");
    blk.Add({.role = R::kVisionNorm0, .name = "norm0.weight", .shape = {Hv}, .category = norm});
    blk.Add({.role = R::kVisionNorm1, .name = "norm1.weight", .shape = {Hv}, .category = norm});
    blk.Add({.role = R::kVisionFc0, .name = "mlp.fc0.weight", .shape = {I, Hv}});
    blk.Add({.role = R::kVisionFc1, .name = "mlp.fc1.weight", .shape = {Hv, I}});
    blk.Add({.role = R::kVisionQkv, .name = "wqkv.weight", .shape = {3 * v.qkv_hidden_size, Hv}});
    blk.Add({.role = R::kVisionOut, .name = "wo.weight", .shape = {Hv, v.qkv_hidden_size}});
  }
  tower.Add({.role = R::kVisionFinalNorm, .name = "encoder.final_layernorm.weight", .shape = {Hv},
             .category = norm});
  Block projector(out, "mm_projector.", -1, -1, Component::kVision);
  projector.Add({.role = R::kProjectorFc0, .name = "proj.0.weight", .shape = {Hmm, Hmm}});
  projector.Add({.role = R::kProjectorFc2, .name = "proj.2.weight", .shape = {D, Hmm}});
  projector.Add({.role = R::kProjectorNorm, .name = "post_norm.weight", .shape = {D}, .category = norm});
}

}  // namespace

std::vector<TensorSpec> BuildTensorTable(const ModelConfig& c) {
  std::vector<TensorSpec> out;
  out.reserve(static_cast<size_t>(16 + c.num_hidden_layers * 24 + c.NumMoeLayers() * c.num_experts * 6 +
                                  200));
  // Spec §2.1: K3 wraps the text model in `language_model.` beside the vision tower.
  const Block root(&out, c.multimodal_wrapper ? "language_model." : "");
  const Block model = root.Sub("model.");
  EmbeddingTable(c, model, root);
  if (c.UsesAttnRes()) AttnResTable(c, model, /*output=*/true);
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    const Block layer = model.Layer(i);
    LayerNormTable(c, layer);
    if (c.UsesAttnRes()) AttnResTable(c, layer, /*output=*/false);
    const Block attn = layer.Sub("self_attn.");
    if (c.IsKdaLayer(i)) {
      KdaTable(c, attn);
    } else {
      MlaTable(c, attn);
    }
    if (c.IsMoeLayer(i)) {
      MoeTable(c, layer.Sub("block_sparse_moe."));
    } else {
      GluMlpTable(c, layer.Sub("mlp."), c.intermediate_size, Category::kDenseMlp,
                  {R::kMlpGate, R::kMlpUp, R::kMlpDown});
    }
  }
  if (c.multimodal_wrapper && c.vision.present) VisionTable(c, &out);
  return out;
}

}  // namespace kimirt
