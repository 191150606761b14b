// Parses config.json (spec §1). Field reading is strict about types and ranges and names the
// field on error ("config.json: text_config.hidden_size: expected a positive integer, got
// \"abc\""). Keys we do not know are collected, not rejected: HF configs carry bookkeeping keys
// (auto_map, initializer_range, use_cache, ...) that change nothing we compute.
#include "kimirt/model/config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <sys/stat.h>

#include <nlohmann/json.hpp>

namespace kimirt {
namespace {

using Json = nlohmann::json;

std::string Describe(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// Reads fields of one JSON object, remembering which keys were consumed.
class FieldReader {
 public:
  FieldReader(const Json& obj, std::string path, std::string_view source)
      : obj_(obj), path_(std::move(path)), source_(source) {}

  std::string FieldName(std::string_view key) const {
    return path_.empty() ? std::string(key) : path_ + "." + std::string(key);
  }
  Status Error(std::string_view key, std::string_view what) const {
    return InvalidArgument(std::string(source_) + ": " + FieldName(key) + ": " + std::string(what));
  }

  const Json* Get(std::string_view key) {
    seen_.insert(std::string(key));
    auto it = obj_.find(key);
    if (it == obj_.end() || it->is_null()) return nullptr;
    return &*it;
  }
  bool Has(std::string_view key) const {
    auto it = obj_.find(key);
    return it != obj_.end() && !it->is_null();
  }
  void MarkSeen(std::string_view key) { seen_.insert(std::string(key)); }

  // Integer in [lo, hi]; missing -> `fallback` (nullopt fallback = required).
  // Sizes are capped at 2^24: far above any Kimi width, and products of a few dims stay far
  // inside int64, so a hostile config cannot overflow byte counts.
  static constexpr int64_t kMaxDim = int64_t{1} << 24;

  Status Int(std::string_view key, int64_t* out, std::optional<int64_t> fallback, int64_t lo = 1,
             int64_t hi = kMaxDim) {
    const Json* v = Get(key);
    if (v == nullptr) {
      if (!fallback) return Error(key, "required field is missing");
      *out = *fallback;
      return Status::Ok();
    }
    return ToInt(key, *v, out, lo, hi);
  }
  Status OptInt(std::string_view key, std::optional<int64_t>* out, int64_t lo = 1,
                int64_t hi = kMaxDim) {
    const Json* v = Get(key);
    if (v == nullptr) {
      out->reset();
      return Status::Ok();
    }
    int64_t x = 0;
    KIMIRT_RETURN_IF_ERROR(ToInt(key, *v, &x, lo, hi));
    *out = x;
    return Status::Ok();
  }
  Status ToInt(std::string_view key, const Json& v, int64_t* out, int64_t lo, int64_t hi) const {
    int64_t x = 0;
    if (v.is_number_integer()) {
      x = v.get<int64_t>();
    } else if (v.is_number_float() && std::isfinite(v.get<double>()) &&
               std::floor(v.get<double>()) == v.get<double>() && std::fabs(v.get<double>()) < 1e15) {
      x = static_cast<int64_t>(v.get<double>());  // 4.0 written for 4 is still an integer
    } else {
      return Error(key, "expected an integer, got " + Describe(v));
    }
    if (x < lo || x > hi) {
      return Error(key, "value " + std::to_string(x) + " is out of range [" + std::to_string(lo) +
                            ", " + std::to_string(hi) + "]");
    }
    *out = x;
    return Status::Ok();
  }
  Status Double(std::string_view key, double* out, std::optional<double> fallback) {
    const Json* v = Get(key);
    if (v == nullptr) {
      if (!fallback) return Error(key, "required field is missing");
      *out = *fallback;
      return Status::Ok();
    }
    if (!v->is_number() || !std::isfinite(v->get<double>())) {
      return Error(key, "expected a number, got " + Describe(*v));
    }
    *out = v->get<double>();
    return Status::Ok();
  }
  Status OptDouble(std::string_view key, std::optional<double>* out) {
    if (!Has(key)) {
      MarkSeen(key);
      out->reset();
      return Status::Ok();
    }
    double x = 0;
    KIMIRT_RETURN_IF_ERROR(Double(key, &x, std::nullopt));
    *out = x;
    return Status::Ok();
  }
  Status Bool(std::string_view key, bool* out, std::optional<bool> fallback) {
    const Json* v = Get(key);
    if (v == nullptr) {
      if (!fallback) return Error(key, "required field is missing");
      *out = *fallback;
      return Status::Ok();
    }
    if (!v->is_boolean()) return Error(key, "expected true or false, got " + Describe(*v));
    *out = v->get<bool>();
    return Status::Ok();
  }
  Status String(std::string_view key, std::string* out, std::optional<std::string> fallback) {
    const Json* v = Get(key);
    if (v == nullptr) {
      if (!fallback) return Error(key, "required field is missing");
      *out = *fallback;
      return Status::Ok();
    }
    if (!v->is_string()) return Error(key, "expected a string, got " + Describe(*v));
    *out = v->get<std::string>();
    return Status::Ok();
  }
  Status IntList(std::string_view key, std::vector<int64_t>* out, bool required) {
    const Json* v = Get(key);
    if (v == nullptr) {
      if (required) return Error(key, "required field is missing");
      out->clear();
      return Status::Ok();
    }
    if (!v->is_array()) return Error(key, "expected a list of integers, got " + Describe(*v));
    out->clear();
    for (size_t i = 0; i < v->size(); ++i) {
      int64_t x = 0;
      KIMIRT_RETURN_IF_ERROR(ToInt(std::string(key) + "[" + std::to_string(i) + "]", (*v)[i], &x,
                                   std::numeric_limits<int64_t>::min(),
                                   std::numeric_limits<int64_t>::max()));
      out->push_back(x);
    }
    return Status::Ok();
  }
  // Integer or list of integers (eos_token_id may be either in HF configs).
  Status IntOrList(std::string_view key, std::vector<int64_t>* out) {
    const Json* v = Get(key);
    out->clear();
    if (v == nullptr) return Status::Ok();
    if (v->is_array()) {
      MarkSeen(key);
      for (size_t i = 0; i < v->size(); ++i) {
        int64_t x = 0;
        KIMIRT_RETURN_IF_ERROR(
            ToInt(std::string(key) + "[" + std::to_string(i) + "]", (*v)[i], &x, 0, int64_t{1} << 40));
        out->push_back(x);
      }
      return Status::Ok();
    }
    int64_t x = 0;
    KIMIRT_RETURN_IF_ERROR(ToInt(key, *v, &x, 0, int64_t{1} << 40));
    out->push_back(x);
    return Status::Ok();
  }

  void CollectUnknown(const std::set<std::string>& ignorable, std::vector<std::string>* out) const {
    for (auto it = obj_.begin(); it != obj_.end(); ++it) {
      if (seen_.count(it.key()) || ignorable.count(it.key())) continue;
      out->push_back(FieldName(it.key()));
    }
  }

 private:
  const Json& obj_;
  std::string path_;
  std::string_view source_;
  std::set<std::string> seen_;
};

// HF / PretrainedConfig bookkeeping keys: present in real configs, irrelevant to the math.
const std::set<std::string>& BookkeepingKeys() {
  static const std::set<std::string> k = {
      "architectures", "auto_map", "dtype", "torch_dtype", "transformers_version", "use_cache",
      "initializer_range", "head_dim", "rope_theta", "rope_scaling", "ignore_index",
      "image_placeholder", "_name_or_path", "model_type", "output_attentions",
      "output_hidden_states", "return_dict", "use_return_dict", "is_encoder_decoder",
      "max_length", "chunk_size_feed_forward", "tokenizer_class", "problem_type", "pretraining_tp",
      "attention_bias", "attention_dropout", "aux_loss_alpha", "seq_aux", "norm_topk_prob",
      "scoring_func", "n_group", "n_routed_experts", "generation_config"};
  return k;
}

Status ParseLinearAttn(const Json& la, std::string_view source, ModelConfig* c,
                       std::vector<std::string>* unknown) {
  if (!la.is_object()) {
    return InvalidArgument(std::string(source) + ": linear_attn_config: expected an object");
  }
  FieldReader r(la, "linear_attn_config", source);
  LinearAttnConfig& l = c->linear_attn;
  // Spec §1.3: ATOM falls back to num_attention_heads / qk_nope_head_dim when absent.
  KIMIRT_RETURN_IF_ERROR(r.Int("num_heads", &l.num_heads, c->num_attention_heads));
  KIMIRT_RETURN_IF_ERROR(r.Int("head_dim", &l.head_dim, c->qk_nope_head_dim));
  KIMIRT_RETURN_IF_ERROR(r.Int("short_conv_kernel_size", &l.short_conv_kernel_size, 4, 1, 64));
  KIMIRT_RETURN_IF_ERROR(r.Bool("use_full_rank_gate", &l.use_full_rank_gate, false));
  KIMIRT_RETURN_IF_ERROR(r.OptDouble("gate_lower_bound", &l.gate_lower_bound));
  KIMIRT_RETURN_IF_ERROR(r.IntList("kda_layers", &l.kda_layers, /*required=*/true));
  KIMIRT_RETURN_IF_ERROR(r.IntList("full_attn_layers", &l.full_attn_layers, /*required=*/true));
  r.CollectUnknown({}, unknown);
  if (l.gate_lower_bound && *l.gate_lower_bound >= 0) {
    return r.Error("gate_lower_bound", "must be negative (the decay is exp(lower_bound * sigmoid))");
  }
  // Spec §1.2: the two 1-indexed lists must partition 1..L exactly.
  const int64_t n = c->num_hidden_layers;
  std::vector<int> owner(static_cast<size_t>(n + 1), 0);
  auto mark = [&](const std::vector<int64_t>& list, const char* name) -> Status {
    for (int64_t x : list) {
      if (x < 1 || x > n) {
        return r.Error(name, "layer " + std::to_string(x) + " is outside 1.." + std::to_string(n) +
                                 " (the lists are 1-indexed)");
      }
      if (owner[static_cast<size_t>(x)]++ != 0) {
        return r.Error(name, "layer " + std::to_string(x) + " is listed twice");
      }
    }
    return Status::Ok();
  };
  KIMIRT_RETURN_IF_ERROR(mark(l.kda_layers, "kda_layers"));
  KIMIRT_RETURN_IF_ERROR(mark(l.full_attn_layers, "full_attn_layers"));
  for (int64_t i = 1; i <= n; ++i) {
    if (owner[static_cast<size_t>(i)] == 0) {
      return r.Error("kda_layers", "layer " + std::to_string(i) +
                                       " is in neither kda_layers nor full_attn_layers");
    }
  }
  return Status::Ok();
}

Status ParseQuantization(const Json& q, std::string_view source, QuantizationConfig* out) {
  const std::string where = std::string(source) + ": quantization_config";
  if (!q.is_object()) return InvalidArgument(where + ": expected an object");
  auto method = q.find("quant_method");
  auto format = q.find("format");
  if (method == q.end() || !method->is_string()) {
    return InvalidArgument(where + ".quant_method: required string is missing");
  }
  out->quant_method = method->get<std::string>();
  out->format = (format != q.end() && format->is_string()) ? format->get<std::string>() : "";
  if (out->quant_method != "compressed-tensors" || out->format != "mxfp4-pack-quantized") {
    return Unsupported(where + ": only compressed-tensors mxfp4-pack-quantized is supported, got " +
                       out->quant_method + " " + out->format);
  }
  out->routed_experts_mxfp4 = true;
  // Group size: spec §2.9 fixes 32 (the E8M0 scale covers 32 elements); reject anything else.
  auto groups = q.find("config_groups");
  if (groups != q.end() && groups->is_object()) {
    for (auto g = groups->begin(); g != groups->end(); ++g) {
      auto w = g->find("weights");
      if (w == g->end() || !w->is_object()) continue;
      auto gs = w->find("group_size");
      if (gs != w->end() && !(gs->is_number_integer() && gs->get<int64_t>() == 32)) {
        return Unsupported(where + ".config_groups." + g.key() +
                           ".weights.group_size: MXFP4 needs 32, got " + Describe(*gs));
      }
      auto bits = w->find("num_bits");
      if (bits != w->end() && !(bits->is_number_integer() && bits->get<int64_t>() == 4)) {
        return Unsupported(where + ".config_groups." + g.key() + ".weights.num_bits: MXFP4 needs 4, got " +
                           Describe(*bits));
      }
    }
  }
  return Status::Ok();
}

Status ParseVision(const Json& v, std::string_view source, VisionConfig* out,
                   std::vector<std::string>* unknown) {
  if (!v.is_object()) return InvalidArgument(std::string(source) + ": vision_config: expected an object");
  FieldReader r(v, "vision_config", source);
  out->present = true;
  KIMIRT_RETURN_IF_ERROR(r.Int("patch_size", &out->patch_size, out->patch_size, 1, 1024));
  KIMIRT_RETURN_IF_ERROR(r.Int("vt_hidden_size", &out->hidden_size, out->hidden_size, 1, 65536));
  KIMIRT_RETURN_IF_ERROR(r.Int("vt_num_hidden_layers", &out->num_layers, out->num_layers, 1, 1024));
  KIMIRT_RETURN_IF_ERROR(
      r.Int("vt_intermediate_size", &out->intermediate_size, out->intermediate_size, 1, 1 << 20));
  KIMIRT_RETURN_IF_ERROR(r.Int("init_pos_emb_height", &out->pos_emb_height, out->pos_emb_height, 1, 4096));
  KIMIRT_RETURN_IF_ERROR(r.Int("init_pos_emb_width", &out->pos_emb_width, out->pos_emb_width, 1, 4096));
  // The rest of a vision config (mm_hidden_size, merge_kernel_size, ...) is not needed to count
  // the tower's bytes with the defaults above; keep it out of the unknown-key report.
  (void)unknown;
  return Status::Ok();
}

// Text-model fields, from `text_config` (K3) or the top level (kimi_linear).
Status ParseText(const Json& t, std::string path, std::string_view source, ModelConfig* c) {
  FieldReader r(t, path, source);
  const bool k3 = c->family == ModelFamily::kKimiK3;
  // Spec §1.3 recommends treating K3's feature switches as required: a default would silently
  // build a different model. For kimi_linear configs the defaults of spec §1.3 apply.
  auto k3_required = [&](auto fallback) -> decltype(std::optional(fallback)) {
    if (k3) return std::nullopt;
    return fallback;
  };
  KIMIRT_RETURN_IF_ERROR(r.Int("vocab_size", &c->vocab_size, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("hidden_size", &c->hidden_size, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_hidden_layers", &c->num_hidden_layers, std::nullopt, 1, 4096));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_attention_heads", &c->num_attention_heads, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(
      r.Int("num_key_value_heads", &c->num_key_value_heads, c->num_attention_heads));
  KIMIRT_RETURN_IF_ERROR(r.OptInt("q_lora_rank", &c->q_lora_rank));
  KIMIRT_RETURN_IF_ERROR(r.Int("kv_lora_rank", &c->kv_lora_rank, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("qk_nope_head_dim", &c->qk_nope_head_dim, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("qk_rope_head_dim", &c->qk_rope_head_dim, std::nullopt, 0));
  KIMIRT_RETURN_IF_ERROR(r.Int("v_head_dim", &c->v_head_dim, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Bool("mla_use_nope", &c->mla_use_nope, k3_required(false)));
  KIMIRT_RETURN_IF_ERROR(r.Bool("mla_use_output_gate", &c->mla_use_output_gate, k3_required(false)));

  KIMIRT_RETURN_IF_ERROR(r.Int("intermediate_size", &c->intermediate_size, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("first_k_dense_replace", &c->first_k_dense_replace, 1, 0));
  KIMIRT_RETURN_IF_ERROR(r.Int("moe_layer_freq", &c->moe_layer_freq, 1));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_experts", &c->num_experts, std::nullopt, 1, 65536));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_experts_per_token", &c->num_experts_per_token, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("moe_intermediate_size", &c->moe_intermediate_size, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_shared_experts", &c->num_shared_experts, int64_t{0}, 0));
  KIMIRT_RETURN_IF_ERROR(r.OptInt("routed_expert_hidden_size", &c->routed_expert_hidden_size));
  KIMIRT_RETURN_IF_ERROR(r.Bool("latent_moe_use_norm", &c->latent_moe_use_norm, k3_required(false)));
  KIMIRT_RETURN_IF_ERROR(r.String("hidden_act", &c->hidden_act, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.OptDouble("activation_situ_beta", &c->activation_situ_beta));
  KIMIRT_RETURN_IF_ERROR(r.OptDouble("activation_situ_linear_beta", &c->activation_situ_linear_beta));
  KIMIRT_RETURN_IF_ERROR(r.String("moe_router_activation_func", &c->moe_router_activation_func,
                                  std::string("sigmoid")));
  KIMIRT_RETURN_IF_ERROR(r.Bool("use_grouped_topk", &c->use_grouped_topk, true));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_expert_group", &c->num_expert_group, 1));
  KIMIRT_RETURN_IF_ERROR(r.Int("topk_group", &c->topk_group, 1));
  KIMIRT_RETURN_IF_ERROR(r.String("topk_method", &c->topk_method, std::string("noaux_tc")));
  KIMIRT_RETURN_IF_ERROR(r.Bool("moe_renormalize", &c->moe_renormalize, true));
  KIMIRT_RETURN_IF_ERROR(r.Double("routed_scaling_factor", &c->routed_scaling_factor, 1.0));
  KIMIRT_RETURN_IF_ERROR(r.Double("rms_norm_eps", &c->rms_norm_eps, std::nullopt));
  KIMIRT_RETURN_IF_ERROR(r.OptInt("attn_res_block_size", &c->attn_res_block_size));
  KIMIRT_RETURN_IF_ERROR(r.Bool("tie_word_embeddings", &c->tie_word_embeddings, false));
  KIMIRT_RETURN_IF_ERROR(r.Int("num_nextn_predict_layers", &c->num_nextn_predict_layers, 0, 0, 0));
  // Context length: K3 says max_position_embeddings, the 48B config model_max_length.
  std::optional<int64_t> max_pos, model_max;
  KIMIRT_RETURN_IF_ERROR(r.OptInt("max_position_embeddings", &max_pos, 1, int64_t{1} << 40));
  KIMIRT_RETURN_IF_ERROR(r.OptInt("model_max_length", &model_max, 1, int64_t{1} << 40));
  c->max_position_embeddings = max_pos.value_or(model_max.value_or(0));
  // Token ids: the text config's, else the wrapper's (set by the caller beforehand).
  if (r.Has("bos_token_id")) {
    KIMIRT_RETURN_IF_ERROR(r.Int("bos_token_id", &c->bos_token_id, std::nullopt, 0));
  } else {
    r.MarkSeen("bos_token_id");
  }
  if (r.Has("eos_token_id")) {
    KIMIRT_RETURN_IF_ERROR(r.IntOrList("eos_token_id", &c->eos_token_ids));
  } else {
    r.MarkSeen("eos_token_id");
  }
  if (r.Has("pad_token_id")) {
    KIMIRT_RETURN_IF_ERROR(r.Int("pad_token_id", &c->pad_token_id, std::nullopt, 0));
  } else {
    r.MarkSeen("pad_token_id");
  }

  if (const Json* la = r.Get("linear_attn_config")) {
    KIMIRT_RETURN_IF_ERROR(ParseLinearAttn(*la, source, c, &c->unknown_keys));
  } else {
    return r.Error("linear_attn_config", "required field is missing (it names the KDA layers)");
  }
  if (const Json* q = r.Get("quantization_config")) {
    KIMIRT_RETURN_IF_ERROR(ParseQuantization(*q, source, &c->quantization));
  }
  if (k3) {
    // Spec §1.3: these K3 switches have no safe default.
    for (const char* key : {"attn_res_block_size", "routed_expert_hidden_size",
                            "activation_situ_beta", "activation_situ_linear_beta"}) {
      if (!r.Has(key)) return r.Error(key, "required for Kimi-K3 (spec §1.3) but missing");
    }
    if (!c->linear_attn.use_full_rank_gate || !c->linear_attn.gate_lower_bound) {
      return InvalidArgument(std::string(source) + ": " + r.FieldName("linear_attn_config") +
                             ": Kimi-K3 needs use_full_rank_gate=true and gate_lower_bound");
    }
  }
  r.CollectUnknown(BookkeepingKeys(), &c->unknown_keys);

  // Cross-field checks (spec §1.1, §1.3). Values we cannot run are Unsupported, not silently
  // changed into another model.
  if (c->num_key_value_heads != c->num_attention_heads) {
    return r.Error("num_key_value_heads", "must equal num_attention_heads (" +
                                              std::to_string(c->num_attention_heads) +
                                              "): MLA has no GQA");
  }
  if (!c->mla_use_nope) {
    return Status(ErrorCode::kUnsupported,
                  std::string(source) + ": " + r.FieldName("mla_use_nope") +
                      ": RoPE MLA is not supported (Kimi models are NoPE, spec §6.3)");
  }
  if (c->num_experts_per_token > c->num_experts) {
    return r.Error("num_experts_per_token", std::to_string(c->num_experts_per_token) +
                                                " exceeds num_experts " + std::to_string(c->num_experts));
  }
  if (c->hidden_act != "situ" && c->hidden_act != "silu") {
    return Status(ErrorCode::kUnsupported, std::string(source) + ": " + r.FieldName("hidden_act") +
                                               ": expected \"situ\" or \"silu\", got \"" +
                                               c->hidden_act + "\"");
  }
  if (c->moe_router_activation_func != "sigmoid") {
    return Status(ErrorCode::kUnsupported,
                  std::string(source) + ": " + r.FieldName("moe_router_activation_func") +
                      ": only \"sigmoid\" is supported, got \"" + c->moe_router_activation_func + "\"");
  }
  if (c->num_expert_group != 1 || c->topk_group != 1) {
    return Status(ErrorCode::kUnsupported, std::string(source) + ": " +
                                               r.FieldName("num_expert_group") +
                                               ": grouped top-k with more than one group");
  }
  if (c->topk_method != "noaux_tc") {
    return Status(ErrorCode::kUnsupported, std::string(source) + ": " + r.FieldName("topk_method") +
                                               ": only \"noaux_tc\" is supported, got \"" +
                                               c->topk_method + "\"");
  }
  if (c->first_k_dense_replace > c->num_hidden_layers) {
    return r.Error("first_k_dense_replace", "exceeds num_hidden_layers");
  }
  if (c->rms_norm_eps <= 0) return r.Error("rms_norm_eps", "must be positive");
  // The layout enumerates every expert tensor; keep a hostile config from asking for billions.
  if (c->num_hidden_layers * c->num_experts > 4'000'000) {
    return r.Error("num_experts", std::to_string(c->num_experts) + " experts × " +
                                      std::to_string(c->num_hidden_layers) +
                                      " layers is more expert tensors than kimirt handles");
  }
  if (c->quantization.routed_experts_mxfp4) {
    if (c->ExpertHiddenSize() % 32 != 0 || c->moe_intermediate_size % 32 != 0) {
      return r.Error("moe_intermediate_size",
                     "MXFP4 experts need the expert hidden and intermediate sizes to be multiples "
                     "of the 32-element scale group");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string_view ModelFamilyName(ModelFamily f) {
  return f == ModelFamily::kKimiK3 ? "Kimi-K3" : "Kimi-Linear";
}

bool ModelConfig::IsKdaLayer(int64_t i) const {
  return std::find(linear_attn.kda_layers.begin(), linear_attn.kda_layers.end(), i + 1) !=
         linear_attn.kda_layers.end();
}

bool ModelConfig::IsMoeLayer(int64_t i) const {
  // Spec §1.1: MoE iff idx >= first_k_dense_replace and idx % moe_layer_freq == 0.
  return num_experts > 0 && i >= first_k_dense_replace && i % moe_layer_freq == 0;
}

int64_t ModelConfig::NumKdaLayers() const {
  return static_cast<int64_t>(linear_attn.kda_layers.size());
}

int64_t ModelConfig::NumMoeLayers() const {
  int64_t n = 0;
  for (int64_t i = 0; i < num_hidden_layers; ++i) n += IsMoeLayer(i) ? 1 : 0;
  return n;
}

int64_t ModelConfig::AttnResBlocks() const {
  if (!attn_res_block_size) return 0;
  return (num_hidden_layers + *attn_res_block_size - 1) / *attn_res_block_size;
}

Result<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source) {
  Json root = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return InvalidArgument(std::string(source) + ": not valid JSON");
  if (!root.is_object()) return InvalidArgument(std::string(source) + ": expected a JSON object");

  ModelConfig c;
  FieldReader top(root, "", source);
  std::string model_type;
  KIMIRT_RETURN_IF_ERROR(top.String("model_type", &model_type, std::string()));
  if (const Json* archs = top.Get("architectures")) {
    if (!archs->is_array() || archs->empty() || !(*archs)[0].is_string()) {
      return top.Error("architectures", "expected a non-empty list of strings");
    }
    c.architecture = (*archs)[0].get<std::string>();
  }
  const Json* text = top.Get("text_config");
  c.multimodal_wrapper = text != nullptr;
  if (model_type == "kimi_k3" || c.architecture.rfind("KimiK3", 0) == 0) {
    c.family = ModelFamily::kKimiK3;
  } else if (model_type == "kimi_linear" || c.architecture.rfind("KimiLinear", 0) == 0) {
    c.family = ModelFamily::kKimiLinear;
  } else {
    return Status(ErrorCode::kUnsupported,
                  std::string(source) + ": model_type \"" + model_type + "\" / architecture \"" +
                      c.architecture + "\" is not a Kimi-K3 or Kimi-Linear model");
  }
  if (c.family == ModelFamily::kKimiK3 && !c.multimodal_wrapper && model_type == "kimi_k3") {
    return top.Error("text_config", "a kimi_k3 config must carry its text model in text_config");
  }

  // Wrapper-level token ids first; text_config values override them.
  if (top.Has("bos_token_id")) KIMIRT_RETURN_IF_ERROR(top.Int("bos_token_id", &c.bos_token_id, std::nullopt, 0));
  if (top.Has("eos_token_id")) KIMIRT_RETURN_IF_ERROR(top.IntOrList("eos_token_id", &c.eos_token_ids));
  if (top.Has("pad_token_id")) KIMIRT_RETURN_IF_ERROR(top.Int("pad_token_id", &c.pad_token_id, std::nullopt, 0));
  if (text != nullptr) {
    if (!text->is_object()) return top.Error("text_config", "expected an object");
    KIMIRT_RETURN_IF_ERROR(ParseText(*text, "text_config", source, &c));
    if (const Json* v = top.Get("vision_config")) {
      KIMIRT_RETURN_IF_ERROR(ParseVision(*v, source, &c.vision, &c.unknown_keys));
    }
    for (const char* k : {"tie_word_embeddings", "media_placeholder_token_id"}) top.MarkSeen(k);
    top.CollectUnknown(BookkeepingKeys(), &c.unknown_keys);
  } else {
    KIMIRT_RETURN_IF_ERROR(ParseText(root, "", source, &c));
  }
  if (c.eos_token_ids.empty()) return top.Error("eos_token_id", "required field is missing");
  return c;
}

Result<std::string> ReadModelConfigText(const std::string& path, std::string* file_read) {
  std::string file = path;
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file = path + "/config.json";
  if (file_read != nullptr) *file_read = file;
  std::ifstream in(file, std::ios::binary);
  if (!in) return NotFound(file + ": cannot open config");
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<ModelConfig> LoadModelConfig(const std::string& path) {
  std::string file;
  KIMIRT_ASSIGN_OR_RETURN(std::string text, ReadModelConfigText(path, &file));
  return ParseModelConfig(text, file);
}

}  // namespace kimirt
