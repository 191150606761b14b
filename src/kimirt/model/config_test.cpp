#include "kimirt/model/config.h"

#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::TestDataPath;

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(ModelConfig, ParsesTheKimiK3ReleaseConfig) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Result<ModelConfig> c = LoadModelConfig(TestDataPath("configs/kimi-k3.json"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kKimiK3);
  EXPECT_TRUE(c->multimodal_wrapper);
  EXPECT_EQ(c->hidden_size, 7168);
  EXPECT_EQ(c->num_hidden_layers, 93);
  // Spec §1.2: 69 KDA + 24 MLA; layer 3 (1-indexed 4) is the first MLA; 91 and 92 are MLA.
  EXPECT_EQ(c->NumKdaLayers(), 69);
  EXPECT_EQ(c->NumMlaLayers(), 24);
  EXPECT_TRUE(c->IsKdaLayer(0));
  EXPECT_FALSE(c->IsKdaLayer(3));
  EXPECT_TRUE(c->IsKdaLayer(90));
  EXPECT_FALSE(c->IsKdaLayer(91));
  EXPECT_FALSE(c->IsKdaLayer(92));
  EXPECT_EQ(c->NumMoeLayers(), 92);
  EXPECT_FALSE(c->IsMoeLayer(0));
  EXPECT_EQ(c->AttnResBlocks(), 8);
  EXPECT_EQ(c->ExpertHiddenSize(), 3584);
  EXPECT_EQ(c->SharedExpertIntermediate(), 6144);
  EXPECT_EQ(c->q_lora_rank.value_or(0), 1536);
  EXPECT_TRUE(c->mla_use_output_gate);
  EXPECT_TRUE(c->linear_attn.use_full_rank_gate);
  EXPECT_DOUBLE_EQ(c->linear_attn.gate_lower_bound.value_or(0), -5.0);
  EXPECT_TRUE(c->quantization.routed_experts_mxfp4);
  EXPECT_TRUE(c->vision.present);
  EXPECT_EQ(c->vision.hidden_size, 1024);
  EXPECT_FALSE(c->RouterCombineUsesBiasedScores());
  EXPECT_EQ(c->eos_token_ids, std::vector<int64_t>{163586});
  EXPECT_EQ(c->bos_token_id, 163584);
  EXPECT_EQ(c->max_position_embeddings, 1048576);
}

TEST(ModelConfig, ParsesKimiLinear48B) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-linear-48b-a3b.json"));
  Result<ModelConfig> c = LoadModelConfig(TestDataPath("configs/kimi-linear-48b-a3b.json"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->family, ModelFamily::kKimiLinear);
  EXPECT_FALSE(c->multimodal_wrapper);
  EXPECT_EQ(c->num_hidden_layers, 27);
  EXPECT_EQ(c->NumKdaLayers(), 20);
  EXPECT_EQ(c->NumMlaLayers(), 7);
  EXPECT_FALSE(c->q_lora_rank.has_value());
  EXPECT_FALSE(c->UsesAttnRes());
  EXPECT_FALSE(c->UsesLatentMoe());
  EXPECT_FALSE(c->mla_use_output_gate);
  EXPECT_FALSE(c->linear_attn.use_full_rank_gate);
  EXPECT_FALSE(c->linear_attn.gate_lower_bound.has_value());
  EXPECT_TRUE(c->RouterCombineUsesBiasedScores());
  EXPECT_DOUBLE_EQ(c->routed_scaling_factor, 2.446);
  EXPECT_EQ(c->hidden_act, "silu");
  EXPECT_FALSE(c->quantization.routed_experts_mxfp4);
  EXPECT_EQ(c->max_position_embeddings, 1048576);  // from model_max_length
}

TEST(ModelConfig, ParsesEveryFixtureConfig) {
  for (const char* fx : {"tiny-a", "tiny-b", "kimi-linear-tiny"}) {
    const std::string path = TestDataPath(std::string("fixtures/") + fx + "/config.json");
    KIMIRT_REQUIRE_FILE(path);
    Result<ModelConfig> c = LoadModelConfig(path);
    ASSERT_TRUE(c.ok()) << fx << ": " << c.status().ToString();
    EXPECT_EQ(c->vocab_size, std::string(fx) == "tiny-b" ? 1000 : 512) << fx;
  }
}

// A minimal K3-shaped config to mutate in the error tests.
std::string TinyK3(const std::string& text_extra = "", const std::string& drop = "") {
  std::string text = R"({
    "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
    "num_key_value_heads": 2, "q_lora_rank": 16, "kv_lora_rank": 16, "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4, "v_head_dim": 8, "mla_use_nope": true, "mla_use_output_gate": true,
    "intermediate_size": 64, "first_k_dense_replace": 1, "num_experts": 4,
    "num_experts_per_token": 2, "moe_intermediate_size": 32, "num_shared_experts": 1,
    "routed_expert_hidden_size": 32, "latent_moe_use_norm": true, "hidden_act": "situ",
    "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0, "rms_norm_eps": 1e-5,
    "attn_res_block_size": 1, "eos_token_id": 2,
    "linear_attn_config": {"num_heads": 2, "head_dim": 8, "short_conv_kernel_size": 4,
      "use_full_rank_gate": true, "gate_lower_bound": -5.0, "kda_layers": [1],
      "full_attn_layers": [2]})";
  if (!drop.empty()) {
    const size_t at = text.find("\"" + drop + "\"");
    const size_t comma = text.find(',', at);
    text.erase(at, comma - at + 1);
  }
  text += text_extra + "}";
  return R"({"architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
             "text_config": )" + text + "}";
}

TEST(ModelConfig, TinyK3Parses) {
  Result<ModelConfig> c = ParseModelConfig(TinyK3(), "tiny.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE(c->unknown_keys.empty());
}

void ExpectError(const std::string& json, const std::string& needle) {
  Result<ModelConfig> c = ParseModelConfig(json, "cfg.json");
  ASSERT_FALSE(c.ok()) << "expected an error mentioning " << needle;
  EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("cfg.json"), std::string::npos) << c.status().message();
}

TEST(ModelConfig, ErrorsNameTheField) {
  ExpectError("{not json", "not valid JSON");
  ExpectError("[1, 2]", "expected a JSON object");
  ExpectError(R"({"model_type": "llama"})", "not a Kimi-K3 or Kimi-Linear model");
  ExpectError(TinyK3(R"(, "hidden_size": "abc")", "hidden_size"), "text_config.hidden_size: expected an integer");
  ExpectError(TinyK3("", "hidden_size"), "text_config.hidden_size: required field is missing");
  ExpectError(TinyK3(R"(, "num_hidden_layers": -3)", "num_hidden_layers"), "text_config.num_hidden_layers: value -3");
  ExpectError(TinyK3(R"(, "rms_norm_eps": "small")", "rms_norm_eps"), "text_config.rms_norm_eps: expected a number");
  ExpectError(TinyK3(R"(, "mla_use_nope": 1)", "mla_use_nope"), "mla_use_nope: expected true or false");
  ExpectError(TinyK3("", "attn_res_block_size"), "text_config.attn_res_block_size: required for Kimi-K3");
  ExpectError(TinyK3(R"(, "num_experts_per_token": 9)", "num_experts_per_token"), "exceeds num_experts");
  ExpectError(TinyK3(R"(, "hidden_act": "gelu")", "hidden_act"), "hidden_act");
  ExpectError(TinyK3(R"(, "num_key_value_heads": 1)", "num_key_value_heads"), "num_key_value_heads: must equal");
  ExpectError(TinyK3(R"(, "moe_router_activation_func": "softmax")"), "moe_router_activation_func");
}

TEST(ModelConfig, LayerListsMustPartitionTheLayers) {
  auto with_lists = [](const std::string& kda, const std::string& full) {
    std::string j = TinyK3();
    j.replace(j.find("\"kda_layers\": [1]"), 17, "\"kda_layers\": " + kda);
    j.replace(j.find("\"full_attn_layers\": [2]"), 23, "\"full_attn_layers\": " + full);
    return j;
  };
  ExpectError(with_lists("[1]", "[]"), "layer 2 is in neither");
  ExpectError(with_lists("[1, 2]", "[2]"), "layer 2 is listed twice");
  ExpectError(with_lists("[0]", "[2]"), "layer 0 is outside 1..2");
  ExpectError(with_lists("[1]", "\"x\""), "full_attn_layers: expected a list");
}

TEST(ModelConfig, UnknownKeysAreReportedNotFatal) {
  Result<ModelConfig> c = ParseModelConfig(TinyK3(R"(, "hiden_size": 5)"), "cfg.json");
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->unknown_keys.size(), 1u);
  EXPECT_EQ(c->unknown_keys[0], "text_config.hiden_size");
}

}  // namespace
}  // namespace kimirt
