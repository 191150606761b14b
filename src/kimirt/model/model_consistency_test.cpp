// Two implementations of the same math must agree (DESIGN.md "Testing and measuring"):
// prefill at once == prefill in chunks == token-by-token decode; chunked KDA == recurrent KDA;
// absorbed MLA == expanded MLA; TP = 2, 4 (threaded communicator) == TP = 1.
#include <gtest/gtest.h>

#include <cstring>
#include <thread>

#include "kimirt/model/model_test_util.h"

namespace kimirt {
namespace {

using testing::FixtureDir;
using testing::Goldens;

// Logits of `ids` run as consecutive calls of `chunk` tokens (all positions concatenated).
Tensor RunInChunks(Model& m, const std::vector<int32_t>& ids, size_t chunk, const ForwardOptions& o = {}) {
  const int64_t V = m.config().vocab_size;
  Tensor all = Tensor::Host({static_cast<int64_t>(ids.size()), V});
  SequenceState st = m.NewSequence();
  for (size_t at = 0; at < ids.size(); at += chunk) {
    const size_t n = std::min(chunk, ids.size() - at);
    auto part = m.Forward(&st, std::span<const int32_t>(ids).subspan(at, n), o);
    EXPECT_TRUE(part.ok()) << part.status().ToString();
    if (!part.ok()) return all;
    std::copy_n(part->f32(), n * static_cast<size_t>(V), all.f32() + at * static_cast<size_t>(V));
  }
  EXPECT_EQ(st.length, static_cast<int64_t>(ids.size()));
  return all;
}

class ConsistencyTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FIXTURE(GetParam());
    backend_ = MakeCpuBackend();
    comm_ = MakeSingleRankCommunicator();
    auto m = Model::Load(FixtureDir(GetParam()), *backend_, *comm_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
    // Prompt 3 (70 tokens) crosses the 64-token KDA chunk.
    ids_ = Goldens(FixtureDir(GetParam()) + "/goldens.safetensors").Ids("prompt3.ids");
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
  std::vector<int32_t> ids_;
};

TEST_P(ConsistencyTest, PrefillInChunksAndDecodeEqualOneCall) {
  const Tensor once = RunInChunks(*model_, ids_, ids_.size());
  const float scale = testing::MaxAbs(once);
  for (size_t chunk : {1, 5, 16}) {
    const Tensor parts = RunInChunks(*model_, ids_, chunk);
    EXPECT_LE(testing::MaxAbsDiff(parts, once), 1e-4f * std::max(1.0f, scale)) << "chunk " << chunk;
  }
}

TEST_P(ConsistencyTest, ChunkedKdaEqualsRecurrentKda) {
  ForwardOptions rec, chk;
  rec.kda_form = KdaForm::kRecurrent;
  chk.kda_form = KdaForm::kChunked;
  const Tensor a = RunInChunks(*model_, ids_, ids_.size(), rec);
  const Tensor b = RunInChunks(*model_, ids_, ids_.size(), chk);
  EXPECT_LE(testing::MaxAbsDiff(a, b), 1e-4f * std::max(1.0f, testing::MaxAbs(a)));
}

TEST_P(ConsistencyTest, AbsorbedMlaEqualsExpandedMla) {
  ForwardOptions exp, abs;
  exp.mla_form = MlaForm::kExpanded;
  abs.mla_form = MlaForm::kAbsorbed;
  const Tensor a = RunInChunks(*model_, ids_, 16, exp);
  const Tensor b = RunInChunks(*model_, ids_, 16, abs);
  EXPECT_LE(testing::MaxAbsDiff(a, b), 1e-4f * std::max(1.0f, testing::MaxAbs(a)));
}

// Backend::bf16_prefill sends the expanded-form prefill chunks through
// KvStorage::AttendPrefill (model/mla.cpp, issue 14); on the CPU that is Gather + the expanded
// kernel, so the logits keep their bits, in one call and in chunks (the one-token chunk absorbed).
TEST_P(ConsistencyTest, PagedPrefillModeKeepsTheCpuBits) {
  ASSERT_FALSE(backend_->bf16_prefill());
  ASSERT_EQ(ids_.size() % 23, 1u);  // chunks of 23 end with one token: the absorbed form
  const Tensor off = RunInChunks(*model_, ids_, 23);
  backend_->set_bf16_prefill(true);
  const Tensor on = RunInChunks(*model_, ids_, 23);
  const Tensor on_once = RunInChunks(*model_, ids_, ids_.size());
  backend_->set_bf16_prefill(false);
  const Tensor off_once = RunInChunks(*model_, ids_, ids_.size());
  ASSERT_EQ(on.numel(), off.numel());
  EXPECT_EQ(std::memcmp(on.f32(), off.f32(), static_cast<size_t>(off.numel()) * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(on_once.f32(), off_once.f32(), static_cast<size_t>(off.numel()) * sizeof(float)), 0);
}

TEST_P(ConsistencyTest, TensorParallelEqualsOneRank) {
  const Tensor one = RunInChunks(*model_, ids_, 33);
  const int64_t heads = model_->config().linear_attn.num_heads;
  std::vector<int> degrees;
  for (int tp : {2, 4}) {
    if (heads % tp == 0 && model_->config().num_attention_heads % tp == 0) degrees.push_back(tp);
  }
  if (degrees.empty()) {
    // tiny-b's 3 KDA heads split over neither: loading it at TP 2 must say so, naming a tensor.
    RunOnThreadRanks(2, [&](Communicator& comm) {
      auto backend = MakeCpuBackend();
      auto m = Model::Load(FixtureDir(GetParam()), *backend, comm);
      ASSERT_FALSE(m.ok());
      EXPECT_NE(m.status().message().find("do not split over TP 2"), std::string::npos) << m.status().ToString();
    });
    return;
  }
  for (int tp : degrees) {
    std::vector<Tensor> results(static_cast<size_t>(tp));
    std::vector<std::string> errors(static_cast<size_t>(tp));
    RunOnThreadRanks(tp, [&](Communicator& comm) {
      auto backend = MakeCpuBackend();
      auto m = Model::Load(FixtureDir(GetParam()), *backend, comm);
      if (!m.ok()) {
        // Every rank fails the same way (same checkpoint, same degree), so no rank waits in a
        // collective the others never reach.
        errors[static_cast<size_t>(comm.rank())] = m.status().ToString();
        return;
      }
      results[static_cast<size_t>(comm.rank())] = RunInChunks(**m, ids_, 33);
    });
    for (int r = 0; r < tp; ++r) {
      ASSERT_TRUE(errors[static_cast<size_t>(r)].empty()) << "TP" << tp << ": " << errors[static_cast<size_t>(r)];
      EXPECT_LE(testing::MaxAbsDiff(results[static_cast<size_t>(r)], one), 1e-5f * std::max(1.0f, testing::MaxAbs(one)))
          << "TP" << tp << " rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, ConsistencyTest, ::testing::Values("tiny-a", "tiny-b", "kimi-linear-tiny"),
                         [](const auto& info) {
                           std::string n = info.param;
                           std::replace(n.begin(), n.end(), '-', '_');
                           return n;
                         });

TEST(ModelLoad, CheckpointThatDoesNotMatchItsConfigNamesTheTensor) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  // tiny-a's config over tiny-b's tensors: a directory holding both.
  const std::string dir = ::testing::TempDir() + "kimirt_mismatch_" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  for (const auto& e : std::filesystem::directory_iterator(FixtureDir("tiny-b"))) {
    if (e.path().filename().string().rfind("model", 0) == 0) {
      std::filesystem::create_symlink(e.path(), dir + "/" + e.path().filename().string());
    }
  }
  std::filesystem::copy_file(FixtureDir("tiny-a") + "/config.json", dir + "/config.json");
  auto backend = MakeCpuBackend();
  auto comm = MakeSingleRankCommunicator();
  auto m = Model::Load(dir, *backend, *comm);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("language_model.model.embed_tokens.weight is [1000, 96] BF16, expected [512, 64]"),
            std::string::npos)
      << m.status().message();
  std::filesystem::remove_all(dir);
}

TEST(ModelForward, RejectsTokensOutsideTheVocabulary) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  auto backend = MakeCpuBackend();
  auto comm = MakeSingleRankCommunicator();
  auto m = Model::Load(FixtureDir("tiny-a"), *backend, *comm);
  ASSERT_TRUE(m.ok());
  SequenceState st = (*m)->NewSequence();
  auto r = (*m)->Forward(&st, std::vector<int32_t>{1, 512});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("512"), std::string::npos);
  EXPECT_EQ(st.length, 0);  // nothing was consumed
  EXPECT_FALSE((*m)->Forward(&st, std::vector<int32_t>{}).ok());
}

}  // namespace
}  // namespace kimirt

namespace kimirt {
namespace {

// Issue: an FP8 latent cache stays within a stated tolerance of BF16, and the difference is
// reported. Random-weight MoE fixtures are chaotic (fixtures/*/README.md): a perturbation of
// 1e-3 flips near-tie routing decisions downstream and moves logits by O(1), whatever caused
// it. So the bound is stated where the cache acts alone — the output of the first MLA layer,
// which reads every position back from the cache — and end-to-end logits are reported.
TEST_P(ConsistencyTest, KvCacheDtypesStayCloseToTheF32Reference) {
  const ModelConfig& c = model_->config();
  int64_t first_mla = 0;
  while (c.IsKdaLayer(first_mla)) ++first_mla;
  struct Run {
    Tensor logits, mla_out;
  };
  auto run = [&](KvCacheDType dt) {
    auto kv = model_->MakeKvCache(0, 16, dt, /*growable=*/true);
    SequenceState st = model_->NewSequence(kv.get());
    ForwardTrace trace;
    ForwardOptions o;
    o.trace = &trace;
    auto logits = model_->Forward(&st, ids_, o);
    EXPECT_TRUE(logits.ok());
    return Run{*logits, trace.attn_out[static_cast<size_t>(first_mla)]};
  };
  const Run f32 = run(KvCacheDType::kF32), bf16 = run(KvCacheDType::kBF16), fp8 = run(KvCacheDType::kFP8);
  const double layer_bf16 = testing::RelL2(bf16.mla_out, f32.mla_out);
  const double layer_fp8 = testing::RelL2(fp8.mla_out, bf16.mla_out);
  const int64_t V = c.vocab_size;
  int agree = 0;
  for (size_t t = 0; t < ids_.size(); ++t) {
    agree += testing::ArgMax(fp8.logits.f32() + t * V, V) == testing::ArgMax(bf16.logits.f32() + t * V, V);
  }
  std::printf("[ kv-cache ] %s: layer %lld MLA output rel-L2: bf16 vs f32 %.2e, fp8 vs bf16 %.2e | "
              "logits max|diff|: bf16 vs f32 %.3g, fp8 vs bf16 %.3g (max|logit| %.3g); fp8/bf16 argmax %d/%zu\n",
              GetParam().c_str(), static_cast<long long>(first_mla), layer_bf16, layer_fp8,
              testing::MaxAbsDiff(bf16.logits, f32.logits), testing::MaxAbsDiff(fp8.logits, bf16.logits),
              testing::MaxAbs(f32.logits), agree, ids_.size());
  RecordProperty("mla_out_rel_l2_bf16_vs_f32", std::to_string(layer_bf16));
  RecordProperty("mla_out_rel_l2_fp8_vs_bf16", std::to_string(layer_fp8));
  // BF16 rounds each latent by ≤ 2^-9 relative; E4M3 by ≤ 2^-4 (latent_kv_cache_test.cpp).
  // Measured (docs/kv-cache.md): 2e-3 and 3e-2; the bounds are about 3× and 2.5× those.
  EXPECT_LE(layer_bf16, 6e-3);
  EXPECT_LE(layer_fp8, 8e-2);
}

}  // namespace
}  // namespace kimirt
