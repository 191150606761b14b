// The tensor table and the loader's binding, held to the spec the way gemma.cpp's
// tensor_info_test holds its registry to the weights struct: every tensor of every known config
// binds to a field of its own, every field the model reads is bound, and the spec's names map to
// the roles the spec gives them (k3-model-spec.md §2.2-§2.7, §2.9).
#include "kimirt/model/tensor_table.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "kimirt/model/weight_binding.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::FixtureDir;
using testing::TestDataPath;

// Every config kimirt knows: the two released ones and the three fixtures.
std::vector<std::string> ConfigPaths() {
  return {TestDataPath("configs/kimi-k3.json"), TestDataPath("configs/kimi-linear-48b-a3b.json"),
          FixtureDir("tiny-a") + "/config.json", FixtureDir("tiny-b") + "/config.json",
          FixtureDir("kimi-linear-tiny") + "/config.json"};
}

Layout BuildLayout(const std::string& path) {
  Result<ModelConfig> c = LoadModelConfig(path);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  Result<Layout> l = Layout::Build(*c);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  return std::move(l).value();
}

// The fields the modules read for a config, from the spec's per-block lists (§2.2-§2.7),
// independently of the table.
std::set<const Tensor*> FieldsTheModelReads(const ModelConfig& c, ModelWeights& w) {
  std::set<const Tensor*> f;
  f.insert({&w.embed, &w.norm});
  if (!c.tie_word_embeddings) f.insert(&w.lm_head);
  if (c.UsesAttnRes()) f.insert({&w.out_res_norm, &w.out_res_proj});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    f.insert({&l.input_norm, &l.post_norm});
    if (c.UsesAttnRes()) f.insert({&l.attn_res_norm, &l.attn_res_proj, &l.mlp_res_norm, &l.mlp_res_proj});
    if (c.IsKdaLayer(i)) {
      KdaWeights& k = l.kda;
      f.insert({&k.q, &k.k, &k.v, &k.b, &k.f_a, &k.f_b, &k.conv_q, &k.conv_k, &k.conv_v, &k.a_log, &k.dt_bias,
                &k.o_norm, &k.o});
      if (c.linear_attn.use_full_rank_gate) {
        f.insert(&k.g);
      } else {
        f.insert({&k.g_a, &k.g_b});
      }
    } else {
      MlaWeights& m = l.mla;
      if (c.q_lora_rank) {
        f.insert({&m.q_a, &m.q_a_norm, &m.q_b});
      } else {
        f.insert(&m.q);
      }
      f.insert({&m.kv_a, &m.kv_a_norm, &m.kv_b, &m.o});
      if (c.mla_use_output_gate) f.insert(&m.g);
    }
    if (!c.IsMoeLayer(i)) {
      f.insert({&l.dense.gate, &l.dense.up, &l.dense.down});
      continue;
    }
    MoeWeights& m = l.moe;
    f.insert({&m.router, &m.bias});
    if (c.UsesLatentMoe()) {
      f.insert({&m.latent_down, &m.latent_up});
      if (c.latent_moe_use_norm) f.insert(&m.latent_norm);
    }
    if (c.num_shared_experts > 0) f.insert({&m.shared.gate, &m.shared.up, &m.shared.down});
    EXPECT_EQ(m.experts.gate.size(), static_cast<size_t>(c.num_experts));
    for (std::vector<Tensor>* v : {&m.experts.gate, &m.experts.up, &m.experts.down}) {
      for (Tensor& t : *v) f.insert(&t);
    }
    if (!c.quantization.routed_experts_mxfp4) continue;
    for (std::vector<Tensor>* v : {&m.experts.gate_scales, &m.experts.up_scales, &m.experts.down_scales}) {
      for (Tensor& t : *v) f.insert(&t);
    }
  }
  return f;
}

// Each tensor of each config fills one field that no other tensor fills (MXFP4 scales their own,
// listed just after their codes, both held as stored); vision tensors fill none; and the fields
// filled are exactly the fields the model reads.
TEST(TensorTable, EveryTensorBindsToItsOwnFieldAndEveryFieldIsBound) {
  for (const std::string& path : ConfigPaths()) {
    SCOPED_TRACE(path);
    KIMIRT_REQUIRE_FILE(path);
    Layout layout = BuildLayout(path);
    const ModelConfig& c = layout.config();
    ModelWeights w = EmptyModelWeights(c);
    std::map<const Tensor*, const TensorSpec*> filled_by;
    const TensorSpec* prev = nullptr;
    int64_t scales = 0;
    for (const TensorSpec& t : layout.tensors()) {
      ASSERT_NE(t.role, TensorRole::kSentinel) << t.name;
      const WeightBinding b = BindWeight(w, t);
      if (t.component == Component::kVision) {
        EXPECT_EQ(b.field, nullptr) << t.name;
        prev = &t;
        continue;
      }
      if (IsMxfp4Scales(t.role)) {
        ++scales;
        ASSERT_NE(prev, nullptr) << t.name;
        EXPECT_EQ(prev->role, Mxfp4CodesOf(t.role)) << t.name << " follows " << prev->name;
        EXPECT_EQ(b.held, HeldAs::kMxfp4) << t.name;
        EXPECT_EQ(BindWeight(w, *prev).held, HeldAs::kMxfp4) << prev->name;
        EXPECT_EQ(prev->layer, t.layer);
        EXPECT_EQ(prev->expert, t.expert);
      }
      ASSERT_NE(b.field, nullptr) << t.name;
      auto [it, fresh] = filled_by.emplace(b.field, &t);
      EXPECT_TRUE(fresh) << t.name << " binds to the field of " << it->second->name;
      prev = &t;
    }
    const int64_t moe_layers = c.NumMoeLayers();
    EXPECT_EQ(scales, c.quantization.routed_experts_mxfp4 ? moe_layers * c.num_experts * 3 : 0);
    const std::set<const Tensor*> want = FieldsTheModelReads(c, w);
    std::set<const Tensor*> got;
    for (const auto& [field, spec] : filled_by) got.insert(field);
    EXPECT_EQ(got.size(), want.size());
    for (const Tensor* f : want) EXPECT_TRUE(got.count(f)) << "a field the model reads is bound to no tensor";
  }
}

// The spec's names carry the spec's roles (§2.4's role column, §2.7's w1 = gate, w3 = up, w2 =
// down, §2.9's packed codes and E8M0 scales), one name per role K3 has.
TEST(TensorTable, K3NamesHaveTheSpecsRoles) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-k3.json"));
  Layout l = BuildLayout(TestDataPath("configs/kimi-k3.json"));
  using R = TensorRole;
  const std::string P = "language_model.model.";
  const std::string kda = P + "layers.1.self_attn.";  // layer 1: KDA and MoE (spec §1.2)
  const std::string mla = P + "layers.3.self_attn.";  // full_attn_layers[0] = 4, 1-indexed
  const std::string moe = P + "layers.1.block_sparse_moe.";
  const std::string e7 = moe + "experts.7.";
  const std::map<std::string, R> want = {
      {P + "embed_tokens.weight", R::kEmbed},
      {"language_model.lm_head.weight", R::kLmHead},
      {P + "norm.weight", R::kFinalNorm},
      {P + "output_attn_res_norm.weight", R::kOutputResNorm},
      {P + "output_attn_res_proj.weight", R::kOutputResProj},
      {P + "layers.5.input_layernorm.weight", R::kInputNorm},
      {P + "layers.5.post_attention_layernorm.weight", R::kPostAttnNorm},
      {P + "layers.5.self_attention_res_norm.weight", R::kAttnResNorm},
      {P + "layers.5.self_attention_res_proj.weight", R::kAttnResProj},
      {P + "layers.5.mlp_res_norm.weight", R::kMlpResNorm},
      {P + "layers.5.mlp_res_proj.weight", R::kMlpResProj},
      {kda + "q_proj.weight", R::kKdaQ},
      {kda + "k_proj.weight", R::kKdaK},
      {kda + "v_proj.weight", R::kKdaV},
      {kda + "g_proj.weight", R::kKdaGate},
      {kda + "b_proj.weight", R::kKdaBeta},
      {kda + "f_a_proj.weight", R::kKdaDecayA},
      {kda + "f_b_proj.weight", R::kKdaDecayB},
      {kda + "q_conv1d.weight", R::kKdaConvQ},
      {kda + "k_conv1d.weight", R::kKdaConvK},
      {kda + "v_conv1d.weight", R::kKdaConvV},
      {kda + "A_log", R::kKdaALog},
      {kda + "dt_bias", R::kKdaDtBias},
      {kda + "o_norm.weight", R::kKdaOutNorm},
      {kda + "o_proj.weight", R::kKdaOut},
      {mla + "q_a_proj.weight", R::kMlaQA},
      {mla + "q_a_layernorm.weight", R::kMlaQANorm},
      {mla + "q_b_proj.weight", R::kMlaQB},
      {mla + "kv_a_proj_with_mqa.weight", R::kMlaKvA},
      {mla + "kv_a_layernorm.weight", R::kMlaKvANorm},
      {mla + "kv_b_proj.weight", R::kMlaKvB},
      {mla + "g_proj.weight", R::kMlaGate},
      {mla + "o_proj.weight", R::kMlaOut},
      {P + "layers.0.mlp.gate_proj.weight", R::kMlpGate},
      {P + "layers.0.mlp.up_proj.weight", R::kMlpUp},
      {P + "layers.0.mlp.down_proj.weight", R::kMlpDown},
      {moe + "gate.weight", R::kRouter},
      {moe + "gate.e_score_correction_bias", R::kRouterBias},
      {moe + "routed_expert_down_proj.weight", R::kLatentDown},
      {moe + "routed_expert_up_proj.weight", R::kLatentUp},
      {moe + "routed_expert_norm.weight", R::kLatentNorm},
      {moe + "shared_experts.gate_proj.weight", R::kSharedGate},
      {moe + "shared_experts.up_proj.weight", R::kSharedUp},
      {moe + "shared_experts.down_proj.weight", R::kSharedDown},
      {e7 + "w1.weight_packed", R::kExpertGateCodes},
      {e7 + "w1.weight_scale", R::kExpertGateScales},
      {e7 + "w3.weight_packed", R::kExpertUpCodes},
      {e7 + "w3.weight_scale", R::kExpertUpScales},
      {e7 + "w2.weight_packed", R::kExpertDownCodes},
      {e7 + "w2.weight_scale", R::kExpertDownScales},
      {"vision_tower.patch_embed.proj.weight", R::kVisionPatchProj},
      {"vision_tower.patch_embed.pos_emb.weight", R::kVisionPosEmb},
      {"vision_tower.encoder.blocks.26.norm0.weight", R::kVisionNorm0},
      {"vision_tower.encoder.blocks.26.norm1.weight", R::kVisionNorm1},
      {"vision_tower.encoder.blocks.26.mlp.fc0.weight", R::kVisionFc0},
      {"vision_tower.encoder.blocks.26.mlp.fc1.weight", R::kVisionFc1},
      {"vision_tower.encoder.blocks.26.wqkv.weight", R::kVisionQkv},
      {"vision_tower.encoder.blocks.26.wo.weight", R::kVisionOut},
      {"vision_tower.encoder.final_layernorm.weight", R::kVisionFinalNorm},
      {"mm_projector.proj.0.weight", R::kProjectorFc0},
      {"mm_projector.proj.2.weight", R::kProjectorFc2},
      {"mm_projector.post_norm.weight", R::kProjectorNorm},
  };
  std::set<R> roles_in_k3;
  for (const TensorSpec& t : l.tensors()) roles_in_k3.insert(t.role);
  std::set<R> named;
  for (const auto& [name, role] : want) {
    const TensorSpec* t = l.Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->role, role) << name;
    named.insert(role);
  }
  EXPECT_EQ(named, roles_in_k3) << "a role of K3's table has no name in this test";
  // §2.9: codes [out, in/2] and scales [out, in/32], U8 both; their layer and expert are set.
  const TensorSpec* codes = l.Find(e7 + "w2.weight_packed");
  const TensorSpec* sc = l.Find(e7 + "w2.weight_scale");
  EXPECT_EQ(codes->shape, (Shape{3584, 1536}));
  EXPECT_EQ(sc->shape, (Shape{3584, 96}));
  EXPECT_EQ(codes->dtype, DType::kU8);
  EXPECT_EQ(sc->dtype, DType::kU8);
  EXPECT_EQ(sc->layer, 1);
  EXPECT_EQ(sc->expert, 7);
}

// The roles only Kimi-Linear has (§1.4): the low-rank KDA gate, MLA without q-LoRA, BF16 experts.
TEST(TensorTable, KimiLinearNamesHaveTheSpecsRoles) {
  KIMIRT_REQUIRE_FILE(TestDataPath("configs/kimi-linear-48b-a3b.json"));
  Layout l = BuildLayout(TestDataPath("configs/kimi-linear-48b-a3b.json"));
  using R = TensorRole;
  const std::map<std::string, R> want = {
      {"model.layers.0.self_attn.g_a_proj.weight", R::kKdaGateA},
      {"model.layers.0.self_attn.g_b_proj.weight", R::kKdaGateB},
      {"model.layers.3.self_attn.q_proj.weight", R::kMlaQ},
      {"model.layers.1.block_sparse_moe.experts.255.w1.weight", R::kExpertGate},
      {"model.layers.1.block_sparse_moe.experts.255.w3.weight", R::kExpertUp},
      {"model.layers.1.block_sparse_moe.experts.255.w2.weight", R::kExpertDown},
      {"lm_head.weight", R::kLmHead},
  };
  for (const auto& [name, role] : want) {
    const TensorSpec* t = l.Find(name);
    ASSERT_NE(t, nullptr) << name;
    EXPECT_EQ(t->role, role) << name;
  }
}

}  // namespace
}  // namespace kimirt
