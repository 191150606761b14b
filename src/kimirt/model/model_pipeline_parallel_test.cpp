// Pipeline parallelism on CPU thread ranks (docs/distributed.md "Pipeline parallelism"): the
// layers split into stages by the planner's rule (model/pipeline_stages.h), each stage holding
// and running only its own, the residual stream's state (AttnRes bank and prefix, or h) sent
// stage to stage, the last stage's logits sent back to the first.
//
// Nothing a stage computes changes with pipelining — every op sees the same inputs, no sum is
// regrouped, the state crosses as exact F32 copies — so the logits must equal one stage's bit
// for bit, and the tests assert exactly that (memcmp), at PP 2, 3 and 4 (and 9 on tiny-b), and
// TP 2 × PP 2 against TP 2 (the TP sums are the same per stage). Checked on every fixture:
// tiny-a (AttnRes blocks of 2 over 6 layers: PP 4 cuts inside blocks), tiny-b (blocks of 3 over
// 9) and kimi-linear-tiny (no AttnRes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/model/model_test_util.h"
#include "kimirt/model/pipeline_stages.h"

namespace kimirt {
namespace {

using testing::FixtureDir;
using testing::Goldens;

constexpr int kDecodeSteps = 8;

// What a rank of the first stage produced: every prompt position's logits (prefilled in chunks of
// 33, so the 70-token prompt crosses the 64-token KDA chunk), the argmax of each of 8 decode
// steps, and one batched decode step of three sequences (ForwardDecode). Other stages return no
// logits. Every stage is fed the same tokens (decode steps take fixed tokens, since only the first
// stage has the logits a greedy choice would come from; the runners send rank 0's choice).
struct StageOutput {
  std::string error;
  Tensor logits;
  std::vector<int32_t> step_argmax;
  Tensor batch;
  bool got_logits = false;
};

Status RunStage(Model& m, const std::vector<int32_t>& ids, StageOutput* out) {
  const int64_t V = m.config().vocab_size;
  const bool first = m.stage().is_first();
  out->logits = Tensor::Host({static_cast<int64_t>(ids.size()), V});
  SequenceState st = m.NewSequence();
  for (size_t at = 0; at < ids.size(); at += 33) {
    const size_t n = std::min<size_t>(33, ids.size() - at);
    KIMIRT_ASSIGN_OR_RETURN(Tensor part, m.Forward(&st, std::span<const int32_t>(ids).subspan(at, n)));
    if (part.defined() != first) return Internal("logits on a stage other than the first, or none on the first");
    if (first) std::copy_n(part.f32(), n * static_cast<size_t>(V), out->logits.f32() + at * static_cast<size_t>(V));
  }
  ForwardOptions o;
  o.all_logits = false;
  const int32_t tokens[kDecodeSteps] = {7, 11, 3, 5, 2, 13, 17, 19};
  for (int32_t t : tokens) {
    KIMIRT_ASSIGN_OR_RETURN(Tensor step, m.Forward(&st, std::vector<int32_t>{t}, o));
    if (first) out->step_argmax.push_back(testing::ArgMax(step.f32(), V));
  }
  // One decode step of three sequences at once, after prompts of different lengths.
  std::vector<SequenceState> seqs;
  for (int b = 0; b < 3; ++b) seqs.push_back(m.NewSequence());
  for (int b = 0; b < 3; ++b) {
    KIMIRT_RETURN_IF_ERROR(
        m.Forward(&seqs[static_cast<size_t>(b)], std::span<const int32_t>(ids).subspan(0, 5 + 9 * b), o).status());
  }
  std::vector<SequenceState*> ptrs = {&seqs[0], &seqs[1], &seqs[2]};
  KIMIRT_ASSIGN_OR_RETURN(Tensor batch, m.ForwardDecode(ptrs, std::vector<int32_t>{ids[1], ids[2], ids[3]}));
  if (first) out->batch = batch;
  out->got_logits = first;
  return Status::Ok();
}

// RunStage on every rank of `fixture` at TP `tp` × PP `pp` (stage-major thread ranks, each on its
// own CPU backend); entry w is world rank w's.
std::vector<StageOutput> RunGrid(const std::string& fixture, int tp, int pp, const std::vector<int32_t>& ids,
                                 const std::function<void(Model&, int world)>& inspect = {}) {
  std::vector<StageOutput> out(static_cast<size_t>(tp * pp));
  RunOnThreadGrid(tp, pp, [&](Communicator& tp_comm, Communicator& pp_comm) {
    const int w = pp_comm.rank() * tp + tp_comm.rank();
    auto backend = MakeCpuBackend();
    auto m = Model::Load(FixtureDir(fixture), *backend, tp_comm, {}, &pp_comm);
    if (!m.ok()) {  // every rank loads the same checkpoint at the same degrees: all fail or none
      out[static_cast<size_t>(w)].error = m.status().ToString();
      return;
    }
    if (inspect) inspect(**m, w);
    StageOutput& o = out[static_cast<size_t>(w)];
    if (Status s = RunStage(**m, ids, &o); !s.ok()) o.error = s.ToString();
  });
  return out;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.defined() && b.defined() && a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

class PipelineParallelTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    KIMIRT_REQUIRE_FIXTURE(GetParam());
    ids_ = Goldens(FixtureDir(GetParam()) + "/goldens.safetensors").Ids("prompt3.ids");
    auto c = LoadModelConfig(FixtureDir(GetParam()));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    layers_ = c->num_hidden_layers;
  }
  // Every rank of the first stage got the reference's bits; the other ranks got no logits.
  void ExpectEqualsReference(const std::vector<StageOutput>& got, int tp, const std::vector<StageOutput>& ref) {
    for (size_t w = 0; w < got.size(); ++w) {
      SCOPED_TRACE("world rank " + std::to_string(w));
      ASSERT_TRUE(got[w].error.empty()) << got[w].error;
      const bool first_stage = static_cast<int>(w) < tp;
      ASSERT_EQ(got[w].got_logits, first_stage);
      if (!first_stage) continue;
      const StageOutput& want = ref[w];
      EXPECT_TRUE(SameBits(got[w].logits, want.logits)) << "max |diff| " << testing::MaxAbsDiff(got[w].logits, want.logits);
      EXPECT_TRUE(SameBits(got[w].batch, want.batch)) << "max |diff| " << testing::MaxAbsDiff(got[w].batch, want.batch);
      EXPECT_EQ(got[w].step_argmax, want.step_argmax);
    }
  }
  std::vector<int32_t> ids_;
  int64_t layers_ = 0;
};

TEST_P(PipelineParallelTest, LogitsEqualOneStageBitForBit) {
  const std::vector<StageOutput> one = RunGrid(GetParam(), 1, 1, ids_);
  ASSERT_TRUE(one[0].error.empty()) << one[0].error;
  ASSERT_EQ(one[0].step_argmax.size(), static_cast<size_t>(kDecodeSteps));
  std::vector<int> degrees = {2, 3, 4};
  if (layers_ == 9) degrees.push_back(9);  // tiny-b: a stage per layer
  for (int pp : degrees) {
    SCOPED_TRACE("PP" + std::to_string(pp));
    ExpectEqualsReference(RunGrid(GetParam(), 1, pp, ids_), 1, one);
  }
}

// TP 2 × PP 2 and × PP 3 (4 and 6 ranks) against TP 2, on the fixtures whose heads split over
// two ranks (tiny-b's 3 KDA heads split over no TP degree).
class TensorPipelineTest : public PipelineParallelTest {};

TEST_P(TensorPipelineTest, EqualsTensorParallelBitForBit) {
  const std::vector<StageOutput> tp2 = RunGrid(GetParam(), 2, 1, ids_);
  for (const StageOutput& r : tp2) ASSERT_TRUE(r.error.empty()) << r.error;
  for (int pp : {2, 3}) {
    SCOPED_TRACE("TP2 x PP" + std::to_string(pp));
    ExpectEqualsReference(RunGrid(GetParam(), 2, pp, ids_), 2, tp2);
  }
}

// Each rank holds its stage's tensors only: layer weights of its own layers, the embedding on
// the first stage, the final norm and head on the last; KDA state slots and the latent cache
// have exactly its stage's KDA and MLA layers. Summed over the stages, the held bytes are one
// rank's: nothing is lost or held twice.
TEST_P(PipelineParallelTest, EachStageHoldsItsOwnLayersOnly) {
  uint64_t one_bytes = 0;
  RunOnThreadGrid(1, 1, [&](Communicator& t, Communicator& p) {
    auto backend = MakeCpuBackend();
    auto m = Model::Load(FixtureDir(GetParam()), *backend, t, {}, &p);
    ASSERT_TRUE(m.ok());
    one_bytes = HeldBytes((*m)->weights());
  });
  for (int pp : {2, 3}) {
    SCOPED_TRACE("PP" + std::to_string(pp));
    const std::vector<PipelineStage> stages = PipelineStages(layers_, pp);
    std::vector<uint64_t> bytes(static_cast<size_t>(pp));
    std::vector<std::string> bad(static_cast<size_t>(pp));
    RunGrid(GetParam(), 1, pp, ids_, [&](Model& m, int w) {
      const PipelineStage& s = stages[static_cast<size_t>(w)];
      std::string& e = bad[static_cast<size_t>(w)];
      if (m.stage().first_layer != s.first_layer || m.stage().end_layer != s.end_layer) e += "wrong layer range; ";
      bytes[static_cast<size_t>(w)] = HeldBytes(m.weights());
      const ModelConfig& c = m.config();
      int64_t kda = 0, mla = 0;
      for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
        const bool held = m.weights().layers[static_cast<size_t>(i)].input_norm.defined();
        if (held != s.holds_layer(i)) e += "layer " + std::to_string(i) + (held ? " held; " : " missing; ");
        if (s.holds_layer(i)) (c.IsKdaLayer(i) ? kda : mla) += 1;
      }
      if (m.weights().embed.defined() != s.is_first()) e += "embedding; ";
      if (m.weights().lm_head.defined() != s.is_last() || m.weights().norm.defined() != s.is_last()) e += "head; ";
      if (m.MakeKdaStates(1)->num_layers() != kda) e += "KDA slots not the stage's layers; ";
      if (m.MakeKvCache(4, 16, KvCacheDType::kF32, false)->num_layers() != mla) e += "latent cache not the stage's; ";
    });
    uint64_t sum = 0;
    for (int s = 0; s < pp; ++s) {
      EXPECT_EQ(bad[static_cast<size_t>(s)], "") << "stage " << s;
      EXPECT_GT(bytes[static_cast<size_t>(s)], 0u) << "stage " << s;
      sum += bytes[static_cast<size_t>(s)];
    }
    EXPECT_EQ(sum, one_bytes);
  }
}

TEST_P(PipelineParallelTest, MoreStagesThanLayersIsAnErrorNamingBoth) {
  const int pp = static_cast<int>(layers_) + 1;
  const std::vector<StageOutput> out = RunGrid(GetParam(), 1, pp, ids_);
  const std::string want = "-pp " + std::to_string(pp) + ": must be between 1 and the " + std::to_string(layers_) + " layers";
  for (const StageOutput& r : out) EXPECT_NE(r.error.find(want), std::string::npos) << r.error;
}

std::string FixtureName(const ::testing::TestParamInfo<std::string>& info) {
  std::string n = info.param;
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}
INSTANTIATE_TEST_SUITE_P(Fixtures, PipelineParallelTest, ::testing::Values("tiny-a", "tiny-b", "kimi-linear-tiny"),
                         FixtureName);
INSTANTIATE_TEST_SUITE_P(Fixtures, TensorPipelineTest, ::testing::Values("tiny-a", "kimi-linear-tiny"), FixtureName);

// The rule itself (vLLM's get_pp_indices), which `kimirt plan` prints from too.
TEST(PipelineStages, SplitLikeVllmAndCoverEveryLayerOnce) {
  auto ranges = [](int64_t layers, int pp) {
    std::vector<int64_t> n;
    for (const PipelineStage& s : PipelineStages(layers, pp)) n.push_back(s.num_layers());
    return n;
  };
  EXPECT_EQ(ranges(93, 7), (std::vector<int64_t>{13, 13, 13, 13, 14, 14, 13}));
  EXPECT_EQ(ranges(6, 4), (std::vector<int64_t>{1, 2, 2, 1}));
  EXPECT_EQ(ranges(9, 3), (std::vector<int64_t>{3, 3, 3}));
  EXPECT_EQ(ranges(5, 1), (std::vector<int64_t>{5}));
  const auto s = PipelineStages(93, 7);
  EXPECT_EQ(s.front().first_layer, 0);
  EXPECT_EQ(s.back().end_layer, 93);
  for (size_t i = 1; i < s.size(); ++i) EXPECT_EQ(s[i].first_layer, s[i - 1].end_layer);
  EXPECT_FALSE(CheckPipelineDegree(93, 0).ok());
  EXPECT_FALSE(CheckPipelineDegree(93, 94).ok());
  EXPECT_TRUE(CheckPipelineDegree(93, 93).ok());
}

}  // namespace
}  // namespace kimirt
