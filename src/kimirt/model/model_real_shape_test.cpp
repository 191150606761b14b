// Real-shape smoke test: a 2-layer model at the true Kimi-K3 widths (hidden 7168, 96 KDA heads
// × 128, MLA 96 heads with q-LoRA 1536 and latent 512 + 64, LatentMoE 3584 with MXFP4 experts
// of intermediate 3072) written by `kimirt make-checkpoint --random` loads and runs a prefill
// and a decode step. It proves no size is hard-coded for the tiny fixtures. The vocabulary and
// the expert count are small to keep CI's memory and time low; neither is a width.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "kimirt/model/model_test_util.h"

namespace kimirt {
namespace {

constexpr const char* kConfig = R"({
  "architectures": ["KimiK3ForConditionalGeneration"], "model_type": "kimi_k3",
  "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0,
  "text_config": {
    "vocab_size": 1024, "hidden_size": 7168, "num_hidden_layers": 2,
    "num_attention_heads": 96, "num_key_value_heads": 96, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "mla_use_nope": true, "mla_use_output_gate": true, "intermediate_size": 33792,
    "first_k_dense_replace": 0, "num_experts": 4, "num_experts_per_token": 2,
    "moe_intermediate_size": 3072, "num_shared_experts": 1, "routed_expert_hidden_size": 3584,
    "latent_moe_use_norm": true, "hidden_act": "situ", "activation_situ_beta": 4.0,
    "activation_situ_linear_beta": 25.0, "moe_router_activation_func": "sigmoid",
    "use_grouped_topk": true, "num_expert_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
    "moe_renormalize": true, "routed_scaling_factor": 1.0, "rms_norm_eps": 1e-05,
    "attn_res_block_size": 12, "tie_word_embeddings": false, "eos_token_id": 2,
    "linear_attn_config": {"num_heads": 96, "head_dim": 128, "short_conv_kernel_size": 4,
      "use_full_rank_gate": true, "gate_lower_bound": -5.0, "kda_layers": [1], "full_attn_layers": [2]},
    "quantization_config": {"quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "group_size": 32}}}}
  }
})";

TEST(ModelRealShape, TwoLayersAtK3WidthsPrefillAndDecode) {
  const std::string dir = ::testing::TempDir() + "kimirt_realshape_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const std::string cfg = dir + "/k3-2layer.json";
  std::ofstream(cfg) << kConfig;
  const std::string cmd = std::string(KIMIRT_BINARY) + " make-checkpoint --quiet --random --seed 3 --shards 2 --config " +
                          cfg + " --out " + dir + "/ckpt > /dev/null";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;

  auto backend = MakeCpuBackend();
  auto comm = MakeSingleRankCommunicator();
  auto m = Model::Load(dir + "/ckpt", *backend, *comm);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  const ModelConfig& c = (*m)->config();
  EXPECT_EQ(c.hidden_size, 7168);
  EXPECT_EQ(c.KdaProjDim(), 12288);

  const std::vector<int32_t> prompt = {5, 17, 900, 3, 41};
  SequenceState st = (*m)->NewSequence();
  auto pre = (*m)->Forward(&st, prompt);
  ASSERT_TRUE(pre.ok()) << pre.status().ToString();
  ASSERT_EQ(pre->dim(0), 5);
  ASSERT_EQ(pre->dim(1), 1024);
  for (int64_t i = 0; i < pre->numel(); ++i) ASSERT_TRUE(std::isfinite(pre->f32()[i])) << i;
  auto dec = (*m)->Forward(&st, std::vector<int32_t>{7});
  ASSERT_TRUE(dec.ok()) << dec.status().ToString();
  EXPECT_EQ(st.length, 6);

  // The decode step (recurrent KDA, absorbed MLA) equals the last row of a one-call prefill of
  // all six tokens (expanded MLA) at these widths too.
  SequenceState st2 = (*m)->NewSequence();
  std::vector<int32_t> six = prompt;
  six.push_back(7);
  ForwardOptions last;
  last.all_logits = false;
  auto ref = (*m)->Forward(&st2, six, last);
  ASSERT_TRUE(ref.ok());
  EXPECT_LE(testing::MaxAbsDiff(*dec, *ref), 1e-3f * std::max(1.0f, testing::MaxAbs(*ref)));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kimirt
