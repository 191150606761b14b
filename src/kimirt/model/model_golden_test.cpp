// The model on each backend against the reference implementations' FP32 goldens
// (tests/fixtures/*/README.md; the realheads fixtures' from tools/reference): logits of every
// position of every prompt, per-layer sub-layer outputs, and the greedy continuation. The CPU
// backend always runs; the CUDA one where the build has it and a GPU is visible (else those cases
// skip, saying why).
#include <gtest/gtest.h>

#include <cstdio>
#include <tuple>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/model/model_test_util.h"

namespace kimirt {
namespace {

using testing::FixtureDir;
using testing::Goldens;

// (fixture, device)
class GoldenTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  static const std::string& Fixture() { return std::get<0>(GetParam()); }
  void SetUp() override {
    KIMIRT_REQUIRE_FIXTURE(Fixture());
    // "cuda-bf16": the CUDA backend holding GEMM weights as BF16 (the fixtures store them as
    // BF16 or MXFP4, so the values are the same and so is the bar).
    const std::string device = std::get<1>(GetParam());
    auto be = MakeBackend(device == "cuda-bf16" ? "cuda" : device);
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    backend_ = std::move(be).value();
    comm_ = MakeSingleRankCommunicator();
    LoadOptions lo;
    if (device == "cuda-bf16") lo.matrix_dtype = DType::kBF16;
    auto m = Model::Load(FixtureDir(Fixture()), *backend_, *comm_, lo);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
    // The F32 goldens pin F32 math: BF16-held weights with the exact decode GEMM and, for prompts
    // of more than RowInvariantRows tokens (prompt3: 70), the F32 prefill — not the BF16
    // tensor-core prefill Model::Load turns on with BF16 weights (issue 14; its bar is the
    // reference's own BF16-vs-F32 spread, item 4, not these goldens).
    if (device == "cuda-bf16") backend_->set_bf16_prefill(false);
    goldens_ = std::make_unique<Goldens>(FixtureDir(Fixture()) + "/goldens.safetensors");
  }

  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<Goldens> goldens_;
};

TEST_P(GoldenTest, LogitsOfEveryPromptMatchTheFp32Reference) {
  const int64_t V = model_->config().vocab_size;
  for (int p = 0; p < 4; ++p) {
    SCOPED_TRACE("prompt" + std::to_string(p));
    const std::string pre = "prompt" + std::to_string(p) + ".";
    const std::vector<int32_t> ids = goldens_->Ids(pre + "ids");
    const Tensor want = goldens_->Get(pre + "logits_fp32");
    SequenceState st = model_->NewSequence();
    auto got = model_->Forward(&st, ids);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->numel(), want.numel());
    // Issue bar: max |diff| <= 1e-3; the fixture README's bar is 1e-4 × max|logit|.
    const float diff = testing::MaxAbsDiff(*got, want);
    EXPECT_LE(diff, 1e-3f);
    EXPECT_LE(diff, 1e-4f * testing::MaxAbs(want)) << "max|diff| " << diff;
    for (size_t t = 0; t < ids.size(); ++t) {
      EXPECT_EQ(testing::ArgMax(got->f32() + t * V, V), testing::ArgMax(want.f32() + t * V, V)) << "position " << t;
    }
  }
}

TEST_P(GoldenTest, PerLayerOutputsOfPrompt2) {
  const std::vector<int32_t> ids = goldens_->Ids("prompt2.ids");
  SequenceState st = model_->NewSequence();
  ForwardTrace trace;
  ForwardOptions o;
  o.trace = &trace;
  ASSERT_TRUE(model_->Forward(&st, ids, o).ok());
  // One entry per decoder layer, each against that layer's golden: an empty or short trace fails.
  const size_t layers = static_cast<size_t>(model_->config().num_hidden_layers);
  ASSERT_EQ(trace.attn_out.size(), layers);
  ASSERT_EQ(trace.ffn_out.size(), layers);
  ASSERT_TRUE(goldens_->Has("prompt2.layer" + std::to_string(layers - 1) + ".ffn_out"));
  for (size_t i = 0; i < layers; ++i) {
    const std::string pre = "prompt2.layer" + std::to_string(i) + ".";
    EXPECT_LE(testing::RelL2(trace.attn_out[i], goldens_->Get(pre + "attn_out")), 5e-5) << pre << "attn_out";
    EXPECT_LE(testing::RelL2(trace.ffn_out[i], goldens_->Get(pre + "ffn_out")), 5e-5) << pre << "ffn_out";
  }
}

TEST_P(GoldenTest, GreedyContinuationByIncrementalDecode) {
  const std::vector<int32_t> prompt = goldens_->Ids("prompt1.ids");
  const std::vector<int32_t> want = goldens_->Ids("prompt1.greedy_fp32");
  const int64_t V = model_->config().vocab_size;
  SequenceState st = model_->NewSequence();
  ForwardOptions last;
  last.all_logits = false;
  auto logits = model_->Forward(&st, prompt, last);
  ASSERT_TRUE(logits.ok());
  std::vector<int32_t> got;
  for (size_t step = 0; step < want.size(); ++step) {
    const int32_t next = testing::ArgMax(logits->f32(), V);
    got.push_back(next);
    logits = model_->Forward(&st, std::vector<int32_t>{next}, last);
    ASSERT_TRUE(logits.ok());
  }
  EXPECT_EQ(got, want);
}

TEST(ModelLoad, TheCpuBackendRefusesBf16HeldWeights) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  auto be = MakeBackend("cpu");
  auto comm = MakeSingleRankCommunicator();
  LoadOptions lo;
  lo.matrix_dtype = DType::kBF16;
  auto m = Model::Load(FixtureDir("tiny-a"), **be, *comm, lo);
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("the CPU computes with F32 weights"), std::string::npos) << m.status().ToString();
}

INSTANTIATE_TEST_SUITE_P(Fixtures, GoldenTest,
                         ::testing::Combine(::testing::Values("tiny-a", "tiny-b", "kimi-linear-tiny",
                                                              "kimi-linear-realheads", "k3-realheads"),
                                            ::testing::ValuesIn(testing::BuiltDevices({"cuda", "cuda-bf16"}))),
                         testing::FixtureDeviceName);

// The BF16 mode as served: BF16-held weights with Model::Load's BF16 tensor-core prefill left on
// (issue 14 item 4). Its bar is the reference's own BF16 policy (spec §6.4, which rounds more
// than this mode): for every prompt, the distance of our logits to `logits_fp32` may not exceed
// the distance of the goldens' `logits_bf16` to them (docs/numerics.md says why 1x). Only the
// realheads fixtures reach those kernels (KDA head dim 128, MLA 128/64/128 heads, prompts of 70
// and 200 tokens), and their prompts keep routing away from ties, so the spread is rounding. The
// CPU case runs the exact mode against the same bar, which it meets with room: it shows the test
// compares real tensors wherever the suite runs.
class Bf16SpreadTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(Bf16SpreadTest, LogitsOfEveryPromptWithinTheReferencesBf16Spread) {
  const std::string fixture = std::get<0>(GetParam()), device = std::get<1>(GetParam());
  KIMIRT_REQUIRE_FIXTURE(fixture);
  auto be = MakeBackend(device == "cuda-bf16" ? "cuda" : device);
  ASSERT_TRUE(be.ok()) << be.status().ToString();
  std::unique_ptr<Backend> backend = std::move(be).value();
  auto comm = MakeSingleRankCommunicator();
  LoadOptions lo;
  if (device == "cuda-bf16") lo.matrix_dtype = DType::kBF16;
  auto m = Model::Load(FixtureDir(fixture), *backend, *comm, lo);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  ASSERT_EQ(backend->bf16_prefill(), device == "cuda-bf16");
  const Goldens goldens(FixtureDir(fixture) + "/goldens.safetensors");
  int prefill_prompts = 0;
  for (int p = 0; goldens.Has("prompt" + std::to_string(p) + ".ids"); ++p) {
    SCOPED_TRACE("prompt" + std::to_string(p));
    const std::string pre = "prompt" + std::to_string(p) + ".";
    const std::vector<int32_t> ids = goldens.Ids(pre + "ids");
    const Tensor fp32 = goldens.Get(pre + "logits_fp32"), bf16 = goldens.Get(pre + "logits_bf16");
    SequenceState st = (*m)->NewSequence();
    auto got = (*m)->Forward(&st, ids);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->numel(), fp32.numel());
    const double spread = testing::RelL2(bf16, fp32), ours = testing::RelL2(*got, fp32);
    ASSERT_GT(spread, 0.0);  // the goldens hold two different modes
    EXPECT_LE(ours, spread) << "ours vs logits_fp32 rel-L2 " << ours << ", the reference's bf16 spread " << spread;
    std::printf("[ spread   ] %s %s prompt%d T=%zu: ours vs fp32 rel-L2 %.3g, reference bf16 vs fp32 %.3g\n",
                fixture.c_str(), device.c_str(), p, ids.size(), ours, spread);
    if (static_cast<int64_t>(ids.size()) > backend->RowInvariantRows()) ++prefill_prompts;
  }
  EXPECT_GE(prefill_prompts, 2) << "the fixture must carry prompts longer than the decode kernels' rows";
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Bf16SpreadTest,
                         ::testing::Combine(::testing::Values("kimi-linear-realheads", "k3-realheads"),
                                            ::testing::ValuesIn(testing::BuiltDevices({"cuda-bf16"}))),
                         testing::FixtureDeviceName);

}  // namespace
}  // namespace kimirt
