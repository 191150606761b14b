// `kimirt plan --fit-layers`: the chosen cut fits and the next cut point does not, each checked by
// planning K3's first L layers independently of the cut's JSON path (ModelConfig edited in the
// test, Layout::Build, PlanFromLayout); the written config is the published one with only its
// layer count and lists changed; bad inputs name their problem.
#include "kimirt/tools/plan_fit.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using testing::TestDataPath;

std::string ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The seed's serving settings on 8 × H200 at a 128K context (issue 17): -tp 8, FP8 latent cache,
// --max-num-seqs 64, --gpu-memory-utilization 0.93, prefix caching as serve's default.
PlanOptions H200x8Tp8() {
  PlanOptions o;
  o.par.tp = 8;
  o.context_tokens = 131072;
  o.num_seqs = 64;
  o.kv_cache_dtype = PlanKvDType::kFP8;
  o.gpu = FindGpu("h200");
  o.gpu_memory_utilization = 0.93;
  o.suggest = false;
  return o;
}

// K3's first `layers` layers planned without CutConfigJson: the parsed config's layer count and
// lists edited here, as spec §1.2 defines them (1-indexed lists over 1..L).
Result<PlanReport> PlanFirstLayers(const ModelConfig& full, int64_t layers, const PlanOptions& o) {
  ModelConfig c = full;
  c.num_hidden_layers = layers;
  for (std::vector<int64_t>* list : {&c.linear_attn.kda_layers, &c.linear_attn.full_attn_layers}) {
    list->erase(std::remove_if(list->begin(), list->end(), [&](int64_t x) { return x > layers; }), list->end());
  }
  KIMIRT_ASSIGN_OR_RETURN(Layout l, Layout::Build(c));
  return PlanFromLayout(l, o, "test");
}

class PlanFitK3 : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = TestDataPath("configs/kimi-k3.json");
    KIMIRT_REQUIRE_FILE(path_);
    text_ = ReadText(path_);
    Result<ModelConfig> c = ParseModelConfig(text_, path_);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    k3_ = *c;
  }
  std::string path_, text_;
  ModelConfig k3_;
};

TEST_F(PlanFitK3, CutPointsAreWholeAttnResBlocksEndingOnMla) {
  // Multiples of 12 up to 84 (each ends on layer 4k, an MLA layer), then the published 93.
  EXPECT_EQ(LayerCutPoints(k3_), (std::vector<int64_t>{12, 24, 36, 48, 60, 72, 84, 93}));
}

TEST_F(PlanFitK3, ChosenCutFitsAndTheNextWholeBlockDoesNot) {
  const PlanOptions o = H200x8Tp8();
  Result<LayerFit> fit = FitLayers(text_, path_, o);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  const int64_t L = fit->layers;
  ASSERT_EQ(L % 12, 0);
  ASSERT_LT(L, 93);  // the whole of K3 needs 2+ TB of weights: never 8 × 141 GB

  // Independently: L fits, L + 12 does not.
  Result<PlanReport> at = PlanFirstLayers(k3_, L, o);
  ASSERT_TRUE(at.ok()) << at.status().ToString();
  EXPECT_TRUE(at->fits) << FormatPlanText(*at);
  Result<PlanReport> over = PlanFirstLayers(k3_, L + 12, o);
  ASSERT_TRUE(over.ok()) << over.status().ToString();
  EXPECT_FALSE(over->fits) << FormatPlanText(*over);
  // ... and the fit's own plans are those plans, byte for byte.
  EXPECT_EQ(fit->plan.heaviest().total(), at->heaviest().total());
  EXPECT_EQ(fit->plan.heaviest().weights, at->heaviest().weights);
  ASSERT_TRUE(fit->next.has_value());
  EXPECT_EQ(fit->next->layers, L + 12);
  EXPECT_EQ(fit->next->heaviest().total(), over->heaviest().total());

  // Hand arithmetic for the row that grows fastest: 64 × 131,072 tokens × 576 bytes (FP8 latent,
  // held whole by every rank) per MLA layer, one MLA layer in four.
  EXPECT_EQ(at->heaviest().runtime[0].bytes, 64ull * 131072 * 576 * (static_cast<uint64_t>(L) / 4));

  const std::string text = FormatLayerFitText(*fit);
  EXPECT_NE(text.find("Chosen: " + std::to_string(L) + " layers"), std::string::npos) << text;
  EXPECT_NE(text.find("Why not " + std::to_string(L + 12)), std::string::npos) << text;
  EXPECT_NE(text.find("DOES NOT FIT"), std::string::npos) << text;
  const nlohmann::json j = nlohmann::json::parse(FormatLayerFitJson(*fit));
  EXPECT_EQ(j["fit_layers"]["layers"], L);
  EXPECT_EQ(j["fit_layers"]["next_layers"], L + 12);
  EXPECT_EQ(j["plan"]["layers"]["total"], L);
}

TEST_F(PlanFitK3, WrittenConfigIsThePublishedOneCutToLLayers) {
  Result<LayerFit> fit = FitLayers(text_, path_, H200x8Tp8());
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  const int64_t L = fit->layers;
  Result<ModelConfig> cut = ParseModelConfig(fit->config_json, "cut");
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  EXPECT_EQ(cut->num_hidden_layers, L);
  EXPECT_TRUE(cut->unknown_keys.empty());
  // K3's pattern for its first L layers: layers 4k+1..4k+3 KDA, 4k+4 MLA (1-indexed), 3:1.
  for (int64_t i = 0; i < L; ++i) {
    EXPECT_EQ(cut->IsKdaLayer(i), (i + 1) % 4 != 0) << "layer " << i;
    EXPECT_EQ(cut->IsKdaLayer(i), k3_.IsKdaLayer(i)) << "layer " << i;
  }
  EXPECT_EQ(cut->NumKdaLayers(), 3 * cut->NumMlaLayers());
  ASSERT_TRUE(cut->attn_res_block_size.has_value());
  EXPECT_EQ(cut->num_hidden_layers % *cut->attn_res_block_size, 0);  // whole AttnRes blocks
  EXPECT_EQ(cut->first_k_dense_replace, 1);
  EXPECT_EQ(cut->NumMoeLayers(), L - 1);
  EXPECT_EQ(cut->num_experts, 896);
  EXPECT_EQ(cut->num_experts_per_token, 16);
  EXPECT_EQ(cut->num_shared_experts, 2);
  EXPECT_EQ(cut->vocab_size, 163840);
  EXPECT_TRUE(cut->quantization.routed_experts_mxfp4);

  // Every other field is the published one: the two JSON documents differ only there.
  nlohmann::json a = nlohmann::json::parse(text_), b = nlohmann::json::parse(fit->config_json);
  for (nlohmann::json* j : {&a, &b}) {
    (*j)["text_config"].erase("num_hidden_layers");
    (*j)["text_config"]["linear_attn_config"].erase("kda_layers");
    (*j)["text_config"]["linear_attn_config"].erase("full_attn_layers");
  }
  EXPECT_EQ(a, b);

  // The config committed for issue 17 is this cut (bench/configs/README.md has the command).
  const std::string bench = TestDataPath("bench/configs/kimi-k3-h200x8-tp8.json");
  KIMIRT_REQUIRE_FILE(bench);
  EXPECT_EQ(ReadText(bench), fit->config_json);
}

// The whole Kimi-Linear-48B's first layers on one H100 (bench/configs/README.md has the command:
// `--gpu h100 --max-model-len 4096 --max-num-seqs 64 --gpu-memory-utilization 0.8`, the rest the
// CLI's defaults): 16 of its 27 layers, 12 KDA + 4 MLA in its own 3:1 pattern; 20 would not fit.
// The committed file is this cut.
TEST(PlanFitKimiLinear, TheH100CutIsTheCommittedConfig) {
  const std::string path = TestDataPath("configs/kimi-linear-48b-a3b.json");
  KIMIRT_REQUIRE_FILE(path);
  PlanOptions o;
  o.context_tokens = 4096;
  o.num_seqs = 64;
  o.gpu = FindGpu("h100");
  o.gpu_memory_utilization = 0.8;
  o.suggest = false;
  Result<LayerFit> fit = FitLayers(ReadText(path), path, o);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_EQ(fit->layers, 16);
  Result<ModelConfig> full = ParseModelConfig(ReadText(path), path);
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  Result<PlanReport> next = PlanFirstLayers(*full, 20, o);
  ASSERT_TRUE(next.ok()) << next.status().ToString();
  EXPECT_FALSE(next->fits);
  const std::string bench = TestDataPath("bench/configs/kimi-linear-48b-h100-16layer.json");
  KIMIRT_REQUIRE_FILE(bench);
  EXPECT_EQ(ReadText(bench), fit->config_json);
}

TEST_F(PlanFitK3, AGpuTooSmallForTheSmallestCutIsNamed) {
  PlanOptions o = H200x8Tp8();
  o.gpu = GpuSpec{"custom", "16 GiB", 16ull << 30, "test", 0.0, 8};
  Result<LayerFit> fit = FitLayers(text_, path_, o);
  ASSERT_FALSE(fit.ok());
  const std::string m = fit.status().message();
  EXPECT_NE(m.find("even the smallest cut, 12 layers"), std::string::npos) << m;
  EXPECT_NE(m.find("over the budget of"), std::string::npos) << m;
  // The smallest cut really is over that budget.
  Result<PlanReport> twelve = PlanFirstLayers(k3_, 12, o);
  ASSERT_TRUE(twelve.ok()) << twelve.status().ToString();
  EXPECT_FALSE(twelve->fits);

  o.gpu.reset();
  fit = FitLayers(text_, path_, o);
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("needs a GPU"), std::string::npos) << fit.status().message();
}

TEST_F(PlanFitK3, CutsOutsideTheModelAreRefused) {
  for (int64_t bad : {0, 94, -3}) {
    Result<std::string> cut = CutConfigJson(text_, path_, bad);
    ASSERT_FALSE(cut.ok()) << bad;
    EXPECT_NE(cut.status().message().find("cannot cut to " + std::to_string(bad) + " layers"), std::string::npos)
        << cut.status().message();
  }
}

TEST(PlanFit, ConfigWithoutLayersNamesTheField) {
  const std::string path = TestDataPath("configs/kimi-k3.json");
  KIMIRT_REQUIRE_FILE(path);
  nlohmann::ordered_json j = nlohmann::ordered_json::parse(ReadText(path));
  j["text_config"]["num_hidden_layers"] = 0;
  j["text_config"]["linear_attn_config"]["kda_layers"] = nlohmann::ordered_json::array();
  j["text_config"]["linear_attn_config"]["full_attn_layers"] = nlohmann::ordered_json::array();
  Result<LayerFit> fit = FitLayers(j.dump(), "nolayers.json", H200x8Tp8());
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("nolayers.json: text_config.num_hidden_layers"), std::string::npos)
      << fit.status().message();
  j["text_config"].erase("num_hidden_layers");
  fit = FitLayers(j.dump(), "nolayers.json", H200x8Tp8());
  ASSERT_FALSE(fit.ok());
  EXPECT_NE(fit.status().message().find("num_hidden_layers: required field is missing"), std::string::npos)
      << fit.status().message();
}

// Kimi-Linear-48B has no AttnRes: its cut points are the MLA layers (every 4th, and the last).
// On one H200 at its 1M context the whole model fits (plan_test.cpp); on a 40 GiB GPU it does not
// and the fit stops at an MLA layer, the next cut point over the budget.
TEST(PlanFit, KimiLinearCutsEndOnItsMlaLayers) {
  const std::string path = TestDataPath("configs/kimi-linear-48b-a3b.json");
  KIMIRT_REQUIRE_FILE(path);
  const std::string text = ReadText(path);
  Result<ModelConfig> c = ParseModelConfig(text, path);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(LayerCutPoints(*c), (std::vector<int64_t>{4, 8, 12, 16, 20, 24, 27}));

  PlanOptions o;
  o.gpu = FindGpu("h200");
  o.suggest = false;
  Result<LayerFit> whole = FitLayers(text, path, o);
  ASSERT_TRUE(whole.ok()) << whole.status().ToString();
  EXPECT_EQ(whole->layers, 27);
  EXPECT_FALSE(whole->next.has_value());
  EXPECT_NE(FormatLayerFitText(*whole).find("the whole model fits"), std::string::npos);

  o.gpu = GpuSpec{"custom", "40 GiB", 40ull << 30, "test", 0.0, 8};
  Result<LayerFit> cut = FitLayers(text, path, o);
  ASSERT_TRUE(cut.ok()) << cut.status().ToString();
  ASSERT_TRUE(cut->next.has_value());
  EXPECT_EQ(cut->layers % 4, 0);
  EXPECT_EQ(cut->next->layers, cut->layers + 4);
  Result<PlanReport> at = PlanFirstLayers(*c, cut->layers, o);
  Result<PlanReport> over = PlanFirstLayers(*c, cut->layers + 4, o);
  ASSERT_TRUE(at.ok() && over.ok());
  EXPECT_TRUE(at->fits);
  EXPECT_FALSE(over->fits);
  Result<ModelConfig> written = ParseModelConfig(cut->config_json, "cut");
  ASSERT_TRUE(written.ok()) << written.status().ToString();
  EXPECT_EQ(written->num_hidden_layers, cut->layers);
  EXPECT_FALSE(written->IsKdaLayer(cut->layers - 1));
  EXPECT_FALSE(written->multimodal_wrapper);
}

}  // namespace
}  // namespace kimirt
