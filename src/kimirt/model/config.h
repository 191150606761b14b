// ModelConfig: the parsed config.json of Kimi-K3 (`KimiK3ForConditionalGeneration`, text part in
// `text_config`) or of a bare `kimi_linear` model (Kimi-Linear-48B-A3B), with the field aliases,
// defaults and validation of spec §1. Parsing never aborts: errors name the field.
//
// What this does not do: decide tensor names or shapes (model/layout.h) or hold weights.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

// Spec §1.4 / §15.6: the two released models differ in behaviour that no config field names
// (router combine weights from biased vs unbiased scores; which small tensors are stored F32).
enum class ModelFamily : uint8_t {
  kKimiK3,      // KimiK3ForConditionalGeneration / model_type kimi_k3
  kKimiLinear,  // KimiLinearForCausalLM (Kimi-Linear-48B-A3B and bare kimi_linear configs)
};
std::string_view ModelFamilyName(ModelFamily f);

struct LinearAttnConfig {
  int64_t num_heads = 0;
  int64_t head_dim = 0;
  int64_t short_conv_kernel_size = 4;
  bool use_full_rank_gate = false;          // K3: one g_proj; else low-rank g_a_proj/g_b_proj
  std::optional<double> gate_lower_bound;   // K3: -5 (bounded sigmoid decay, spec §5.3)
  std::vector<int64_t> kda_layers;          // 1-indexed, as in config.json (spec §1.2)
  std::vector<int64_t> full_attn_layers;    // 1-indexed
};

// compressed-tensors MXFP4 of the routed experts (spec §2.9). Absent: experts stored BF16.
struct QuantizationConfig {
  bool routed_experts_mxfp4 = false;
  int64_t group_size = 32;
  std::string quant_method;  // "compressed-tensors"
  std::string format;        // "mxfp4-pack-quantized"
};

// MoonViT3d tower + projector of the K3 release. Only its tensor inventory matters to us (the
// text server skips it); sizes not in config.json default to the K3 release (k3-checkpoint-memory.md).
struct VisionConfig {
  bool present = false;
  int64_t patch_size = 14;
  int64_t hidden_size = 1024;
  int64_t num_layers = 27;
  int64_t intermediate_size = 4096;
  int64_t qkv_hidden_size = 1536;  // wqkv is [3 * qkv_hidden, hidden], wo [hidden, qkv_hidden]
  int64_t pos_emb_height = 64;
  int64_t pos_emb_width = 64;
  int64_t merge_kernel_area = 4;   // 2x2 patch merge: projector input = hidden * 4
};

struct ModelConfig {
  ModelFamily family = ModelFamily::kKimiLinear;
  std::string architecture;        // architectures[0], or "" if absent
  bool multimodal_wrapper = false; // text under `text_config`, tensors under `language_model.`

  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;

  // MLA (spec §6)
  std::optional<int64_t> q_lora_rank;  // null: a single q_proj (Kimi-Linear-48B)
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  bool mla_use_nope = true;
  bool mla_use_output_gate = false;

  // FFN (spec §7)
  int64_t intermediate_size = 0;
  int64_t first_k_dense_replace = 0;
  int64_t moe_layer_freq = 1;
  int64_t num_experts = 0;
  int64_t num_experts_per_token = 0;
  int64_t moe_intermediate_size = 0;
  int64_t num_shared_experts = 0;  // a width multiplier: one shared MLP of moe_intermediate × n
  std::optional<int64_t> routed_expert_hidden_size;  // LatentMoE latent width
  bool latent_moe_use_norm = false;
  std::string hidden_act = "silu";  // "situ" or "silu"
  std::optional<double> activation_situ_beta;
  std::optional<double> activation_situ_linear_beta;
  std::string moe_router_activation_func = "sigmoid";
  bool use_grouped_topk = true;
  int64_t num_expert_group = 1;
  int64_t topk_group = 1;
  std::string topk_method = "noaux_tc";
  bool moe_renormalize = true;
  double routed_scaling_factor = 1.0;

  double rms_norm_eps = 1e-5;
  std::optional<int64_t> attn_res_block_size;  // Block AttnRes (spec §8); absent: plain residual
  LinearAttnConfig linear_attn;

  int64_t bos_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t pad_token_id = -1;
  bool tie_word_embeddings = false;
  int64_t num_nextn_predict_layers = 0;
  int64_t max_position_embeddings = 0;  // 0 if the config does not say

  QuantizationConfig quantization;
  VisionConfig vision;

  // Keys we did not recognise (HF bookkeeping we do not list, or typos); reported, not fatal.
  std::vector<std::string> unknown_keys;

  // --- Derived (spec §1.2, §7, §8) ---
  bool IsKdaLayer(int64_t i) const;  // zero-based i is KDA iff (i+1) is in kda_layers
  bool IsMoeLayer(int64_t i) const;
  int64_t NumKdaLayers() const;
  int64_t NumMlaLayers() const { return num_hidden_layers - NumKdaLayers(); }
  int64_t NumMoeLayers() const;
  bool UsesAttnRes() const { return attn_res_block_size.has_value(); }
  // Snapshots the AttnRes bank holds after the last layer: ceil(L / block) (spec §8.1).
  int64_t AttnResBlocks() const;
  bool UsesLatentMoe() const { return routed_expert_hidden_size.has_value(); }
  // Width the routed experts work in: the latent width, else hidden_size.
  int64_t ExpertHiddenSize() const { return routed_expert_hidden_size.value_or(hidden_size); }
  int64_t SharedExpertIntermediate() const { return moe_intermediate_size * num_shared_experts; }
  int64_t KdaProjDim() const { return linear_attn.num_heads * linear_attn.head_dim; }
  int64_t MlaQkHeadDim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Spec §15.6: K3 gathers combine weights from unbiased scores, Kimi-Linear-48B from biased.
  bool RouterCombineUsesBiasedScores() const { return family == ModelFamily::kKimiLinear; }
};

// Parses config.json text. `source` names the file in error messages.
Result<ModelConfig> ParseModelConfig(std::string_view json_text, std::string_view source);
// Reads a config.json file, or DIR/config.json if given a directory.
Result<ModelConfig> LoadModelConfig(const std::string& path);
// The text LoadModelConfig parses (for tools that rewrite a config, e.g. `plan --fit-layers`);
// `file_read`, when given, gets the file's path (DIR/config.json for a directory).
Result<std::string> ReadModelConfigText(const std::string& path, std::string* file_read = nullptr);

}  // namespace kimirt
