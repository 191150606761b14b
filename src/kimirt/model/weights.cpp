// Loads one rank's weights: read each tensor's stored bytes, widen to F32 (BF16/F32 as stored;
// MXFP4 experts dequantized exactly, spec §2.9), cut the rank's slice by the Layout's placement
// (spec §11), upload. Slices are cut after widening, so MXFP4 experts split at any degree.
#include "kimirt/model/weights.h"

#include <cstring>

#include "kimirt/core/dtype_convert.h"

namespace kimirt {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// [outer, dim, inner] view of a shape around `dim`.
void SplitAround(const Shape& s, int dim, int64_t* outer, int64_t* inner) {
  *outer = 1;
  *inner = 1;
  for (int i = 0; i < dim; ++i) *outer *= s[static_cast<size_t>(i)];
  for (size_t i = static_cast<size_t>(dim) + 1; i < s.size(); ++i) *inner *= s[i];
}

// Entries [begin, begin + length) of `dim`, zero-padded to `allocated` entries.
Tensor SliceAlong(const Tensor& full, int dim, int64_t begin, int64_t length, int64_t allocated) {
  Shape out_shape = full.shape();
  out_shape[static_cast<size_t>(dim)] = allocated;
  Tensor out = Tensor::Host(out_shape);
  int64_t outer = 0, inner = 0;
  SplitAround(full.shape(), dim, &outer, &inner);
  const int64_t n = full.dim(dim);
  for (int64_t o = 0; o < outer; ++o) {
    std::memcpy(out.f32() + o * allocated * inner, full.f32() + (o * n + begin) * inner,
                static_cast<size_t>(length * inner) * sizeof(float));
  }
  return out;
}

// A host F32 tensor as BF16 (its values are BF16 values: exact).
Tensor ToBf16(const Tensor& f32) {
  Tensor t = Tensor::Host(f32.shape(), DType::kBF16);
  F32ToBf16(f32.f32(), static_cast<uint16_t*>(t.raw()), static_cast<size_t>(f32.numel()));
  return t;
}

class Loader {
 public:
  Loader(const Layout& layout, const Checkpoint& ckpt, int tp, int rank, Backend& backend, const LoadOptions& o)
      : layout_(layout), ckpt_(ckpt), rank_(rank), backend_(backend), options_(o) {
    par_.tp = tp;
    par_.experts_dequantized = true;
  }

  Status Check() const { return layout_.CheckParallelism(par_); }

  // A GEMM weight: held as options.matrix_dtype when the checkpoint's values fit it exactly.
  Result<Tensor> Matrix(const std::string& name) { return Get(name, {}, /*matrix=*/true); }

  // The rank's slice of `name` as a device tensor, reshaped to `shape` if given.
  Result<Tensor> Get(const std::string& name, Shape shape = {}, bool matrix = false) {
    const TensorSpec* spec = layout_.Find(name);
    if (spec == nullptr) return Internal("loader asked for " + name + ", which the layout does not have");
    KIMIRT_ASSIGN_OR_RETURN(Tensor full, ReadF32(*spec));
    Tensor part = full;
    const Placement& p = spec->placement;
    if (p.kind == PlacementKind::kExpertShard || p.kind == PlacementKind::kHeadVector) {
      // Experts: logical intermediate elements per rank. Head vectors: also at TP 1, to strip
      // the stored padding (K3's A_log holds 128 entries for 96 heads, spec §2.4).
      const int64_t per = p.units / par_.tp;
      part = SliceAlong(full, p.dim, rank_ * per, per, per);
    } else {
      const TensorSlice s = layout_.SliceFor(*spec, par_, rank_);
      if (s.dim >= 0) part = SliceAlong(full, s.dim, s.begin, s.length, s.allocated);
      if (p.kind == PlacementKind::kVocab) vocab_begin_ = s.dim >= 0 ? s.begin : 0;
    }
    if (!shape.empty()) part = part.Reshape(std::move(shape));
    if (matrix && options_.matrix_dtype == DType::kBF16 && StoredExactlyAsBf16(*spec)) return backend_.Upload(ToBf16(part));
    return backend_.Upload(part);
  }

  int64_t vocab_begin() const { return vocab_begin_; }

 private:
  // The whole tensor in its logical shape as F32 host data.
  Result<Tensor> ReadF32(const TensorSpec& spec) {
    if (EndsWith(spec.name, ".weight_packed")) {
      const std::string base = spec.name.substr(0, spec.name.size() - std::string_view(".weight_packed").size());
      KIMIRT_ASSIGN_OR_RETURN(std::span<const uint8_t> packed, ckpt_.Data(spec.name));
      KIMIRT_ASSIGN_OR_RETURN(std::span<const uint8_t> scale, ckpt_.Data(base + ".weight_scale"));
      const int64_t rows = spec.shape[0], cols = spec.shape[1] * 2;
      Tensor t = Tensor::Host({rows, cols});
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeMxfp4Row(packed.data() + r * cols / 2, scale.data() + r * cols / 32, cols, t.f32() + r * cols);
      }
      return t;
    }
    const Checkpoint::Entry* e = ckpt_.Find(spec.name);
    if (e == nullptr) return NotFound(spec.name + ": not in the checkpoint");
    KIMIRT_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, ckpt_.Data(spec.name));
    Tensor t = Tensor::Host(e->info->shape);
    const size_t n = static_cast<size_t>(t.numel());
    switch (e->info->dtype) {
      case DType::kF32:
        std::memcpy(t.f32(), bytes.data(), n * sizeof(float));
        break;
      case DType::kBF16: {
        std::vector<uint16_t> h(n);
        std::memcpy(h.data(), bytes.data(), n * sizeof(uint16_t));
        Bf16ToF32(h.data(), t.f32(), n);
        break;
      }
      default:
        return Unsupported(spec.name + ": stored as " + std::string(DTypeName(e->info->dtype)) +
                           ", which the CPU loader does not widen");
    }
    return t;
  }

  // BF16 in the checkpoint, or MXFP4 (E2M1 values times a power of two, all BF16 values).
  bool StoredExactlyAsBf16(const TensorSpec& spec) const {
    if (EndsWith(spec.name, ".weight_packed")) return true;
    const Checkpoint::Entry* e = ckpt_.Find(spec.name);
    return e != nullptr && e->info->dtype == DType::kBF16;
  }

  const Layout& layout_;
  const Checkpoint& ckpt_;
  int rank_;
  Backend& backend_;
  LoadOptions options_;
  Parallelism par_;
  int64_t vocab_begin_ = 0;
};

}  // namespace

Result<ModelWeights> LoadModelWeights(const Layout& layout, const Checkpoint& checkpoint, int tp,
                                      int rank, Backend& backend, const LoadOptions& options) {
  KIMIRT_RETURN_IF_ERROR(CheckCheckpoint(layout, checkpoint).ToStatus(checkpoint.dir()));
  if (options.matrix_dtype != DType::kF32 &&
      (options.matrix_dtype != DType::kBF16 || backend.device() == Device::kCpu)) {
    return Unsupported(std::string(backend.name()) + " backend: weights held as " +
                       std::string(DTypeName(options.matrix_dtype)) + " are not supported (the CPU computes with F32 "
                       "weights; CUDA takes F32 or BF16)");
  }
  Loader ld(layout, checkpoint, tp, rank, backend, options);
  KIMIRT_RETURN_IF_ERROR(ld.Check());
  const ModelConfig& c = layout.config();
  const std::string& P = layout.model_prefix();
  const std::string root = c.multimodal_wrapper ? "language_model." : "";
  ModelWeights w;
  KIMIRT_ASSIGN_OR_RETURN(w.embed, ld.Get(P + "embed_tokens.weight"));
  w.embed_row_begin = ld.vocab_begin();
  if (c.tie_word_embeddings) {
    w.lm_head = w.embed;
  } else {
    KIMIRT_ASSIGN_OR_RETURN(w.lm_head, ld.Matrix(root + "lm_head.weight"));
  }
  KIMIRT_ASSIGN_OR_RETURN(w.norm, ld.Get(P + "norm.weight"));
  if (c.UsesAttnRes()) {
    KIMIRT_ASSIGN_OR_RETURN(w.out_res_norm, ld.Get(P + "output_attn_res_norm.weight"));
    KIMIRT_ASSIGN_OR_RETURN(w.out_res_proj, ld.Get(P + "output_attn_res_proj.weight", {c.hidden_size}));
  }
  const int64_t D = c.hidden_size;
  const int64_t H = c.linear_attn.num_heads / tp;
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  const int64_t Pl = c.KdaProjDim() / tp;
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights lw;
    const std::string L = layout.LayerPrefix(i);
    lw.is_kda = c.IsKdaLayer(i);
    lw.is_moe = c.IsMoeLayer(i);
    KIMIRT_ASSIGN_OR_RETURN(lw.input_norm, ld.Get(L + "input_layernorm.weight"));
    KIMIRT_ASSIGN_OR_RETURN(lw.post_norm, ld.Get(L + "post_attention_layernorm.weight"));
    if (c.UsesAttnRes()) {
      KIMIRT_ASSIGN_OR_RETURN(lw.attn_res_norm, ld.Get(L + "self_attention_res_norm.weight"));
      KIMIRT_ASSIGN_OR_RETURN(lw.attn_res_proj, ld.Get(L + "self_attention_res_proj.weight", {D}));
      KIMIRT_ASSIGN_OR_RETURN(lw.mlp_res_norm, ld.Get(L + "mlp_res_norm.weight"));
      KIMIRT_ASSIGN_OR_RETURN(lw.mlp_res_proj, ld.Get(L + "mlp_res_proj.weight", {D}));
    }
    const std::string A = L + "self_attn.";
    if (lw.is_kda) {
      KdaWeights& k = lw.kda;
      KIMIRT_ASSIGN_OR_RETURN(k.q, ld.Matrix(A + "q_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(k.k, ld.Matrix(A + "k_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(k.v, ld.Matrix(A + "v_proj.weight"));
      if (c.linear_attn.use_full_rank_gate) {
        KIMIRT_ASSIGN_OR_RETURN(k.g, ld.Matrix(A + "g_proj.weight"));
      } else {
        KIMIRT_ASSIGN_OR_RETURN(k.g_a, ld.Matrix(A + "g_a_proj.weight"));
        KIMIRT_ASSIGN_OR_RETURN(k.g_b, ld.Matrix(A + "g_b_proj.weight"));
      }
      KIMIRT_ASSIGN_OR_RETURN(k.b, ld.Matrix(A + "b_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(k.f_a, ld.Matrix(A + "f_a_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(k.f_b, ld.Matrix(A + "f_b_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(k.conv_q, ld.Get(A + "q_conv1d.weight", {Pl, W}));
      KIMIRT_ASSIGN_OR_RETURN(k.conv_k, ld.Get(A + "k_conv1d.weight", {Pl, W}));
      KIMIRT_ASSIGN_OR_RETURN(k.conv_v, ld.Get(A + "v_conv1d.weight", {Pl, W}));
      KIMIRT_ASSIGN_OR_RETURN(k.a_log, ld.Get(A + "A_log", {H}));
      KIMIRT_ASSIGN_OR_RETURN(k.dt_bias, ld.Get(A + "dt_bias"));
      KIMIRT_ASSIGN_OR_RETURN(k.o_norm, ld.Get(A + "o_norm.weight"));
      KIMIRT_ASSIGN_OR_RETURN(k.o, ld.Matrix(A + "o_proj.weight"));
    } else {
      MlaWeights& m = lw.mla;
      if (c.q_lora_rank) {
        KIMIRT_ASSIGN_OR_RETURN(m.q_a, ld.Matrix(A + "q_a_proj.weight"));
        KIMIRT_ASSIGN_OR_RETURN(m.q_a_norm, ld.Get(A + "q_a_layernorm.weight"));
        KIMIRT_ASSIGN_OR_RETURN(m.q_b, ld.Matrix(A + "q_b_proj.weight"));
      } else {
        KIMIRT_ASSIGN_OR_RETURN(m.q, ld.Matrix(A + "q_proj.weight"));
      }
      KIMIRT_ASSIGN_OR_RETURN(m.kv_a, ld.Matrix(A + "kv_a_proj_with_mqa.weight"));
      KIMIRT_ASSIGN_OR_RETURN(m.kv_a_norm, ld.Get(A + "kv_a_layernorm.weight"));
      KIMIRT_ASSIGN_OR_RETURN(m.kv_b, ld.Matrix(A + "kv_b_proj.weight"));
      if (c.mla_use_output_gate) {
        KIMIRT_ASSIGN_OR_RETURN(m.g, ld.Matrix(A + "g_proj.weight"));
      }
      KIMIRT_ASSIGN_OR_RETURN(m.o, ld.Matrix(A + "o_proj.weight"));
    }
    if (!lw.is_moe) {
      const std::string M = L + "mlp.";
      KIMIRT_ASSIGN_OR_RETURN(lw.dense.gate, ld.Matrix(M + "gate_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(lw.dense.up, ld.Matrix(M + "up_proj.weight"));
      KIMIRT_ASSIGN_OR_RETURN(lw.dense.down, ld.Matrix(M + "down_proj.weight"));
    } else {
      const std::string M = L + "block_sparse_moe.";
      MoeWeights& m = lw.moe;
      KIMIRT_ASSIGN_OR_RETURN(m.router, ld.Get(M + "gate.weight"));
      KIMIRT_ASSIGN_OR_RETURN(m.bias, ld.Get(M + "gate.e_score_correction_bias"));
      if (c.UsesLatentMoe()) {
        KIMIRT_ASSIGN_OR_RETURN(m.latent_down, ld.Matrix(M + "routed_expert_down_proj.weight"));
        KIMIRT_ASSIGN_OR_RETURN(m.latent_up, ld.Matrix(M + "routed_expert_up_proj.weight"));
        if (c.latent_moe_use_norm) {
          KIMIRT_ASSIGN_OR_RETURN(m.latent_norm, ld.Get(M + "routed_expert_norm.weight"));
        }
      }
      if (c.num_shared_experts > 0) {
        KIMIRT_ASSIGN_OR_RETURN(m.shared.gate, ld.Matrix(M + "shared_experts.gate_proj.weight"));
        KIMIRT_ASSIGN_OR_RETURN(m.shared.up, ld.Matrix(M + "shared_experts.up_proj.weight"));
        KIMIRT_ASSIGN_OR_RETURN(m.shared.down, ld.Matrix(M + "shared_experts.down_proj.weight"));
      }
      const bool mxfp4 = c.quantization.routed_experts_mxfp4;
      const char* suffix = mxfp4 ? ".weight_packed" : ".weight";
      for (int64_t e = 0; e < c.num_experts; ++e) {
        const std::string X = M + "experts." + std::to_string(e) + ".";
        KIMIRT_ASSIGN_OR_RETURN(Tensor g, ld.Matrix(X + "w1" + suffix));
        KIMIRT_ASSIGN_OR_RETURN(Tensor u, ld.Matrix(X + "w3" + suffix));
        KIMIRT_ASSIGN_OR_RETURN(Tensor d, ld.Matrix(X + "w2" + suffix));
        m.experts.gate.push_back(std::move(g));
        m.experts.up.push_back(std::move(u));
        m.experts.down.push_back(std::move(d));
      }
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

}  // namespace kimirt
