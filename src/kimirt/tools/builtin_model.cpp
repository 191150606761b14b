#include "kimirt/tools/builtin_model.h"

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"
#include "kimirt/tokenizer/tokenizer.h"
#include "kimirt/tools/checkpoint_writer.h"

namespace kimirt {
namespace embedded {
extern const std::string_view kBuiltinTiktokenModel;
extern const std::string_view kBuiltinTokenizerConfig;
}  // namespace embedded

namespace {

// Bump when the config, the weights' recipe or the tokenizer changes, so caches are rebuilt.
constexpr const char* kVersion = "v3";  // v3: MXFP4 experts filled as random codes + scales

// A K3-shaped text config at toy widths; the special ids sit at K3's offsets from the base
// vocabulary (spec §10.2), so the chat renderer's markers work unchanged. Eight KDA and MLA heads
// and a 32K context let the seed's command line (-tp 8 --max-model-len 16384) run as written.
std::string BuiltinConfig(int32_t base, int32_t vocab) {
  const std::string b = std::to_string(base);
  return R"({
  "architectures": ["KimiK3ForConditionalGeneration"],
  "model_type": "kimi_k3",
  "bos_token_id": )" + b + R"(,
  "eos_token_id": )" + std::to_string(base + 2) + R"(,
  "pad_token_id": )" + std::to_string(base + 255) + R"(,
  "tie_word_embeddings": false,
  "text_config": {
    "model_type": "kimi_linear",
    "vocab_size": )" + std::to_string(vocab) + R"(,
    "hidden_size": 256, "num_hidden_layers": 6, "intermediate_size": 512,
    "num_attention_heads": 8, "num_key_value_heads": 8, "q_lora_rank": 128, "kv_lora_rank": 64,
    "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
    "mla_use_nope": true, "mla_use_output_gate": true,
    "first_k_dense_replace": 1, "moe_layer_freq": 1, "num_experts": 8, "num_experts_per_token": 2,
    "moe_intermediate_size": 128, "num_shared_experts": 1, "routed_expert_hidden_size": 128,
    "latent_moe_use_norm": true, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "moe_router_activation_func": "sigmoid",
    "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
    "moe_renormalize": true, "routed_scaling_factor": 1.0, "rms_norm_eps": 1e-05,
    "attn_res_block_size": 2, "max_position_embeddings": 32768, "tie_word_embeddings": false,
    "eos_token_id": )" + std::to_string(base + 2) + R"(,
    "linear_attn_config": {"num_heads": 8, "head_dim": 32, "short_conv_kernel_size": 4,
      "use_full_rank_gate": true, "gate_lower_bound": -5.0,
      "kda_layers": [1, 2, 3, 5], "full_attn_layers": [4, 6]},
    "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}}}
  }
}
)";
}

std::string DefaultCacheRoot() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x != nullptr && *x != '\0') return x;
  if (const char* h = std::getenv("HOME"); h != nullptr && *h != '\0') return std::string(h) + "/.cache";
  return "/tmp";
}

Status WriteText(const std::string& path, std::string_view text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  return out ? Status::Ok() : IoError(path + ": write failed");
}

}  // namespace

Result<std::string> EnsureBuiltinModel(const std::string& cache_dir) {
  namespace fs = std::filesystem;
  const std::string root = cache_dir.empty() ? DefaultCacheRoot() + "/kimirt" : cache_dir;
  const std::string dir = root + "/builtin-" + kVersion;
  if (fs::exists(dir + "/.complete")) return dir;

  // Build in a private directory and rename it into place, so concurrent first runs and
  // interrupted ones never leave a half-written model behind.
  const std::string tmp = dir + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  fs::create_directories(tmp, ec);
  if (ec) return IoError(tmp + ": cannot create: " + ec.message());
  KIMIRT_RETURN_IF_ERROR(WriteText(tmp + "/tiktoken.model", embedded::kBuiltinTiktokenModel));
  KIMIRT_RETURN_IF_ERROR(WriteText(tmp + "/tokenizer_config.json", embedded::kBuiltinTokenizerConfig));
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Tokenizer> tok, Tokenizer::Load(tmp));
  const std::string config = BuiltinConfig(tok->num_base_tokens(), tok->vocab_size());
  KIMIRT_RETURN_IF_ERROR(WriteText(tmp + "/config.json", config));
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig mc, ParseModelConfig(config, "builtin config.json"));
  KIMIRT_ASSIGN_OR_RETURN(Layout layout, Layout::Build(mc));
  CheckpointWriteOptions o;
  o.fill = CheckpointFill::kRandom;
  o.seed = kBuiltinWeightsSeed;
  o.shards = 1;
  KIMIRT_RETURN_IF_ERROR(WriteCheckpoint(layout, tmp, o).status());
  KIMIRT_RETURN_IF_ERROR(WriteText(tmp + "/.complete", kVersion));
  fs::rename(tmp, dir, ec);
  if (ec) {
    // Another process finished first: use its copy.
    fs::remove_all(tmp, ec);
    if (!fs::exists(dir + "/.complete")) return IoError(dir + ": cannot install the built-in model");
  }
  return dir;
}

}  // namespace kimirt
