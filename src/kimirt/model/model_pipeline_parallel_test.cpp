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
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
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
// steps, and one decode step of each of kBatches' sizes (ForwardDecode: on pipeline stages the
// step's micro-batches in flight; on one stage, the reference, each sequence's Forward alone,
// which batch invariance says each row must equal). Other stages return no logits. Every stage is
// fed the same tokens (decode steps take fixed tokens, since only the first stage has the logits
// a greedy choice would come from; the runners send rank 0's choice).
constexpr int64_t kBatches[] = {1, 3, 5, 64};
struct StageOutput {
  std::string error;
  Tensor logits;
  std::vector<int32_t> step_argmax;
  std::vector<Tensor> batches;  // per kBatches entry, [B, vocab]
  bool got_logits = false;
};

// One decode step of `B` sequences after prompts of different lengths (1 to 19 tokens), as
// ForwardDecode on pipeline stages, each sequence alone on one stage.
Result<Tensor> DecodeBatch(Model& m, const std::vector<int32_t>& ids, int64_t B) {
  const int64_t V = m.config().vocab_size;
  std::vector<SequenceState> seqs;
  for (int64_t b = 0; b < B; ++b) seqs.push_back(m.NewSequence());
  std::vector<SequenceState*> ptrs;
  std::vector<int32_t> next;
  ForwardOptions o;
  o.all_logits = false;
  for (int64_t b = 0; b < B; ++b) {
    const size_t len = static_cast<size_t>(1 + (b * 7) % 19);
    KIMIRT_RETURN_IF_ERROR(m.Forward(&seqs[static_cast<size_t>(b)],
                                     std::span<const int32_t>(ids).subspan(static_cast<size_t>(b % 4), len), o)
                               .status());
    ptrs.push_back(&seqs[static_cast<size_t>(b)]);
    next.push_back(ids[static_cast<size_t>(b % 50)]);
  }
  if (m.stage().pp > 1) return m.ForwardDecode(ptrs, next);
  Tensor out = Tensor::Host({B, V});
  for (int64_t b = 0; b < B; ++b) {
    KIMIRT_ASSIGN_OR_RETURN(Tensor row, m.Forward(ptrs[static_cast<size_t>(b)], std::span<const int32_t>(&next[static_cast<size_t>(b)], 1), o));
    std::copy_n(row.f32(), V, out.f32() + b * V);
  }
  return out;
}

Status RunStage(Model& m, const std::vector<int32_t>& ids, StageOutput* out) {
  const int64_t V = m.config().vocab_size;
  const bool first = m.gets_logits();
  out->logits = Tensor::Host({static_cast<int64_t>(ids.size()), V});
  SequenceState st = m.NewSequence();
  for (size_t at = 0; at < ids.size(); at += 33) {
    const size_t n = std::min<size_t>(33, ids.size() - at);
    KIMIRT_ASSIGN_OR_RETURN(Tensor part, m.Forward(&st, std::span<const int32_t>(ids).subspan(at, n)));
    if (part.defined() != first) return Internal("logits on a rank other than rank 0, or none on rank 0");
    if (first) std::copy_n(part.f32(), n * static_cast<size_t>(V), out->logits.f32() + at * static_cast<size_t>(V));
  }
  ForwardOptions o;
  o.all_logits = false;
  const int32_t tokens[kDecodeSteps] = {7, 11, 3, 5, 2, 13, 17, 19};
  for (int32_t t : tokens) {
    KIMIRT_ASSIGN_OR_RETURN(Tensor step, m.Forward(&st, std::vector<int32_t>{t}, o));
    if (first) out->step_argmax.push_back(testing::ArgMax(step.f32(), V));
  }
  for (int64_t B : kBatches) {
    KIMIRT_ASSIGN_OR_RETURN(Tensor batch, DecodeBatch(m, ids, B));
    if (batch.defined() != first) return Internal("a decode step's logits on a rank other than rank 0");
    if (first) out->batches.push_back(batch);
  }
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
  // Rank 0 got the reference's bits (rank 0's of `ref`); the other ranks got no logits.
  void ExpectEqualsReference(const std::vector<StageOutput>& got, const std::vector<StageOutput>& ref) {
    for (size_t w = 0; w < got.size(); ++w) {
      SCOPED_TRACE("world rank " + std::to_string(w));
      ASSERT_TRUE(got[w].error.empty()) << got[w].error;
      ASSERT_EQ(got[w].got_logits, w == 0);
      if (w != 0) continue;
      const StageOutput& want = ref[w];
      EXPECT_TRUE(SameBits(got[w].logits, want.logits)) << "max |diff| " << testing::MaxAbsDiff(got[w].logits, want.logits);
      ASSERT_EQ(got[w].batches.size(), want.batches.size());
      for (size_t i = 0; i < want.batches.size(); ++i) {
        EXPECT_TRUE(SameBits(got[w].batches[i], want.batches[i]))
            << "a decode step of " << kBatches[i] << ": max |diff| "
            << testing::MaxAbsDiff(got[w].batches[i], want.batches[i]);
      }
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
    ExpectEqualsReference(RunGrid(GetParam(), 1, pp, ids_), one);
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
    ExpectEqualsReference(RunGrid(GetParam(), 2, pp, ids_), tp2);
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

// Micro-batches in flight (docs/distributed.md "Micro-batches in flight"). The pipeline group as
// the model sees it, with every stage's Send and Recv counted and one gate: stage `gated`'s first
// Send (the end of its work on micro-batch 0: it has received that micro-batch's whole state and
// runs its layers before sending it on) waits until stage 0 has sent `gate_calls` times what
// `gated` had received by then — by default twice: until stage 0 has run micro-batch 1 too. Run
// one step at a time (stage 0 waiting for a micro-batch's logits before it starts the next) that
// never happens: the gate times out and says so. In flight, stage 0 runs micro-batch 1 while
// `gated` sits in micro-batch 0.
struct PipelineLog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<int64_t> sends, recvs;      // per stage: Send calls made, Recv calls returned
  std::vector<size_t> message_floats;     // every Send's size
  std::vector<size_t> stage0_floats;      // stage 0's Sends' sizes, in order
  int gated = -1;
  int64_t gate_calls = 2;
  bool gate_timed_out = false;
  int64_t stage0_sends_at_release = -1;   // stage 0's Send count when the gate opened
  int64_t gated_recvs_at_gate = -1;
};

class LoggedPipeline final : public Communicator {
 public:
  LoggedPipeline(Communicator& inner, PipelineLog& log) : inner_(inner), log_(log) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }
  void AllReduceSum(float* data, size_t n) override { inner_.AllReduceSum(data, n); }
  void AllGather(const float* send, size_t n, float* recv) override { inner_.AllGather(send, n, recv); }
  void Barrier() override { inner_.Barrier(); }
  void Send(const float* data, size_t n, int peer) override {
    std::unique_lock<std::mutex> lock(log_.mu);
    const size_t s = static_cast<size_t>(rank());
    if (rank() == log_.gated && log_.sends[s] == 0) {
      const int64_t received = log_.recvs[s];
      log_.gated_recvs_at_gate = received;
      const bool ok = log_.cv.wait_for(lock, std::chrono::seconds(10),
                                       [&] { return log_.sends[0] >= log_.gate_calls * received; });
      log_.gate_timed_out = !ok;
      log_.stage0_sends_at_release = log_.sends[0];
    }
    if (peer == rank() + 1) log_.message_floats.push_back(n);  // the residual state, not the logits
    if (rank() == 0) log_.stage0_floats.push_back(n);
    log_.sends[s] += 1;
    log_.cv.notify_all();
    lock.unlock();
    inner_.Send(data, n, peer);
  }
  void Recv(float* data, size_t n, int peer) override {
    inner_.Recv(data, n, peer);
    std::lock_guard<std::mutex> lock(log_.mu);
    log_.recvs[static_cast<size_t>(rank())] += 1;
    log_.cv.notify_all();
  }

 private:
  Communicator& inner_;
  PipelineLog& log_;
};

// tiny-a on `pp` thread stages, each over a LoggedPipeline into `log` with stage 1 gated, running
// `body`; each stage's error ("" if none), and tiny-a's hidden size in `hidden`.
std::vector<std::string> RunGatedStages(int pp, PipelineLog& log, const std::function<Status(Model&)>& body,
                                        int64_t* hidden) {
  log.sends.assign(static_cast<size_t>(pp), 0);
  log.recvs.assign(static_cast<size_t>(pp), 0);
  log.gated = 1;
  std::vector<std::string> errors(static_cast<size_t>(pp));
  RunOnThreadGrid(1, pp, [&](Communicator& tp_comm, Communicator& pp_comm) {
    auto backend = MakeCpuBackend();
    LoggedPipeline logged(pp_comm, log);
    auto m = Model::Load(FixtureDir("tiny-a"), *backend, tp_comm, {}, &logged);
    std::string& e = errors[static_cast<size_t>(pp_comm.rank())];
    if (!m.ok()) {
      e = m.status().ToString();
      return;
    }
    *hidden = (*m)->config().hidden_size;
    if (Status s = body(**m); !s.ok()) e = s.ToString();
  });
  return errors;
}

// tiny-a on one stage, running `body`: the tests' reference.
void OnOneStage(const std::function<void(Model&)>& body) {
  RunOnThreadGrid(1, 1, [&](Communicator& tp_comm, Communicator& pp_comm) {
    auto backend = MakeCpuBackend();
    auto m = Model::Load(FixtureDir("tiny-a"), *backend, tp_comm, {}, &pp_comm);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    body(**m);
  });
}

TEST(PipelineMicroBatches, StagesRunDifferentMicroBatchesAtOnce) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  constexpr int kPp = 3;
  constexpr int64_t kRows = 4;
  PipelineLog log;
  int64_t hidden = 0;
  Tensor got, want;
  const std::vector<std::string> errors = RunGatedStages(kPp, log, [&](Model& m) -> Status {
    // A decode step of fresh sequences: the step is the first thing the pipeline carries.
    std::vector<SequenceState> seqs;
    std::vector<SequenceState*> ptrs;
    for (int64_t b = 0; b < kRows; ++b) seqs.push_back(m.NewSequence());
    for (SequenceState& st : seqs) ptrs.push_back(&st);
    const std::vector<int32_t> next = {5, 6, 7, 8};
    KIMIRT_ASSIGN_OR_RETURN(Tensor step, m.ForwardDecode(ptrs, next));
    if (m.stage().is_first()) got = step;
    return Status::Ok();
  }, &hidden);
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  EXPECT_FALSE(log.gate_timed_out) << "stage 0 did not run micro-batch 1 while stage 1 held micro-batch 0 (stage 0 "
                                      "had sent " << log.stage0_sends_at_release << " messages)";
  EXPECT_GT(log.gated_recvs_at_gate, 0);
  EXPECT_GE(log.stage0_sends_at_release, 2 * log.gated_recvs_at_gate);
  // The step splits as MicroBatchRows says (one micro-batch per stage: rows 2, 1, 1): each state
  // message carries one micro-batch's rows, and each stage boundary carries the same count of them.
  const std::vector<int64_t> micro = MicroBatchRows(kRows, MakeCpuBackend()->RowInvariantRows(), kPp);
  ASSERT_EQ(micro, (std::vector<int64_t>{2, 1, 1}));
  ASSERT_FALSE(log.message_floats.empty());
  for (size_t n : log.message_floats) {
    EXPECT_TRUE(n == static_cast<size_t>(2 * hidden) || n == static_cast<size_t>(hidden)) << n;
  }
  EXPECT_EQ(log.sends[0] % static_cast<int64_t>(micro.size()), 0);
  EXPECT_EQ(log.sends[0], log.recvs[1]);
  // The bits are one stage's, each sequence alone.
  OnOneStage([&](Model& model) {
    want = Tensor::Host({kRows, model.config().vocab_size});
    for (int64_t b = 0; b < kRows; ++b) {
      SequenceState st = model.NewSequence();
      auto row = model.Forward(&st, std::vector<int32_t>{static_cast<int32_t>(5 + b)});
      ASSERT_TRUE(row.ok());
      std::copy_n(row->f32(), row->numel(), want.f32() + b * row->numel());
    }
  });
  EXPECT_TRUE(SameBits(got, want)) << "max |diff| " << testing::MaxAbsDiff(got, want);
}

// Steps in flight (Model::LaunchStep / CollectStep; docs/distributed.md "Steps in flight"):
// every stage launches step A (two decode rows) and then step B (two other sequences' chunks)
// before collecting A. With stage 1 held at its first send until stage 0 has sent B's state too,
// stage 0 must launch B while A is still in the later stages — which one ForwardStep per step
// cannot do (stage 0 would wait in A for A's logits). Each step's logits are one stage's, each
// sequence alone.
TEST(PipelineStepsInFlight, StageZeroLaunchesTheNextStepWhileTheLaterStagesHoldThisOne) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  const std::vector<int32_t> decode_ids = {5, 6}, chunk0 = {1, 2, 3}, chunk1 = {4, 5, 6, 7};
  for (int pp : {2, 3}) {
    SCOPED_TRACE("PP " + std::to_string(pp));
    PipelineLog log;
    int64_t hidden = 0;
    StepLogits got_a, got_b;
    const std::vector<std::string> errors = RunGatedStages(pp, log, [&](Model& m) -> Status {
      std::vector<SequenceState> seqs;
      for (int i = 0; i < 4; ++i) seqs.push_back(m.NewSequence());
      SequenceState* rows[2] = {&seqs[0], &seqs[1]};
      const PrefillChunk chunks[2] = {{&seqs[2], chunk0, false, nullptr}, {&seqs[3], chunk1, true, nullptr}};
      KIMIRT_ASSIGN_OR_RETURN(const StepInFlight a, m.LaunchStep(DecodeRows{rows, decode_ids}, {}));
      KIMIRT_ASSIGN_OR_RETURN(const StepInFlight b, m.LaunchStep(DecodeRows{}, chunks));
      StepLogits la = m.CollectStep(a), lb = m.CollectStep(b);
      if (m.stage().is_first()) {
        got_a = std::move(la);
        got_b = std::move(lb);
      }
      return Status::Ok();
    }, &hidden);
    for (const std::string& e : errors) ASSERT_EQ(e, "");
    EXPECT_FALSE(log.gate_timed_out) << "stage 0 did not launch step B while stage 1 held step A (stage 0 had sent "
                                     << log.stage0_sends_at_release << " messages)";
    EXPECT_GT(log.gated_recvs_at_gate, 0);
    ASSERT_EQ(got_b.chunks.size(), 2u);
    OnOneStage([&](Model& model) {
      for (int b = 0; b < 2; ++b) {
        SequenceState st = model.NewSequence();
        auto row = model.Forward(&st, std::span(&decode_ids[static_cast<size_t>(b)], 1));
        ASSERT_TRUE(row.ok());
        EXPECT_TRUE(SameBits(got_a.decode.Rows(b, 1), *row)) << "decode row " << b;
      }
      int i = 0;
      for (const std::vector<int32_t>* ids : {&chunk0, &chunk1}) {
        SequenceState st = model.NewSequence();
        ForwardOptions o;
        o.all_logits = i == 1;
        auto logits = model.Forward(&st, *ids, o);
        ASSERT_TRUE(logits.ok());
        EXPECT_TRUE(SameBits(got_b.chunks[static_cast<size_t>(i)], *logits)) << "chunk " << i;
        ++i;
      }
    });
  }
}

// Prefill chunks in flight (Model::ForwardChunks; docs/distributed.md "Prefill chunks in
// flight"): a step's chunks of three sequences, twice (the second round with the logits of every
// position for one of them), at PP 3. The same gate as above holds stage 1's first send (the end
// of its chunk 0) until stage 0 has sent chunk 1's state too: stage 1 works on chunk 0 while stage
// 0 runs chunk 1. One Forward after another on the stages (the mutation tried: ForwardChunks
// calling Forward per chunk on pipeline stages), the gate times out. Every chunk's logits are one
// stage's bits, each sequence's chunks forwarded alone in order.
TEST(PipelineMicroBatches, StagesRunDifferentPrefillChunksAtOnce) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  constexpr int kPp = 3;
  const std::vector<std::vector<size_t>> lengths = {{9, 5, 12}, {7, 3, 10}};  // per round, per sequence
  auto ids_of = [](size_t round, size_t seq, size_t n) {
    std::vector<int32_t> ids;
    for (size_t k = 0; k < n; ++k) ids.push_back(static_cast<int32_t>((round * 101 + seq * 37 + k * 13 + 1) % 500));
    return ids;
  };
  auto all_logits = [](size_t round, size_t seq) { return round == 1 && seq == 2; };
  // Chunk logits per round, per sequence: through ForwardChunks (stage 0's) and one stage's Forward.
  auto run = [&](Model& m, bool chunks, std::vector<std::vector<Tensor>>* out) -> Status {
    std::vector<SequenceState> seqs;
    for (size_t i = 0; i < lengths[0].size(); ++i) seqs.push_back(m.NewSequence());
    for (size_t round = 0; round < lengths.size(); ++round) {
      std::vector<std::vector<int32_t>> ids;
      std::vector<PrefillChunk> pcs;
      for (size_t i = 0; i < seqs.size(); ++i) ids.push_back(ids_of(round, i, lengths[round][i]));
      for (size_t i = 0; i < seqs.size(); ++i) pcs.push_back({&seqs[i], ids[i], all_logits(round, i), nullptr});
      if (chunks) {
        KIMIRT_ASSIGN_OR_RETURN(std::vector<Tensor> logits, m.ForwardChunks(pcs));
        out->push_back(std::move(logits));
        continue;
      }
      out->emplace_back();
      for (const PrefillChunk& c : pcs) {
        ForwardOptions o;
        o.all_logits = c.all_logits;
        KIMIRT_ASSIGN_OR_RETURN(Tensor logits, m.Forward(c.state, c.ids, o));
        out->back().push_back(std::move(logits));
      }
    }
    return Status::Ok();
  };
  PipelineLog log;
  int64_t hidden = 0;
  std::vector<std::vector<Tensor>> got, want;
  const std::vector<std::string> errors = RunGatedStages(kPp, log, [&](Model& m) -> Status {
    std::vector<std::vector<Tensor>> mine;
    KIMIRT_RETURN_IF_ERROR(run(m, true, &mine));
    for (const std::vector<Tensor>& round : mine) {
      for (const Tensor& t : round) {
        if (t.defined() != m.stage().is_first()) return Internal("logits on a stage other than the first, or none on the first");
      }
    }
    if (m.stage().is_first()) got = std::move(mine);
    return Status::Ok();
  }, &hidden);
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  EXPECT_FALSE(log.gate_timed_out) << "stage 0 did not run chunk 1 while stage 1 held chunk 0 (stage 0 had sent "
                                   << log.stage0_sends_at_release << " messages)";
  EXPECT_GT(log.gated_recvs_at_gate, 0);
  EXPECT_GE(log.stage0_sends_at_release, 2 * log.gated_recvs_at_gate);
  // Each chunk crosses whole (T rows of the hidden size per message), and every chunk of both
  // rounds crossed each boundary the same number of times.
  ASSERT_FALSE(log.message_floats.empty());
  for (size_t n : log.message_floats) EXPECT_EQ(n % static_cast<size_t>(hidden), 0u) << n;
  EXPECT_EQ(log.sends[0] % 6, 0);
  EXPECT_EQ(log.sends[0], log.recvs[1]);
  EXPECT_EQ(log.gated_recvs_at_gate * 6, log.recvs[1]) << "stage 1 had received more than chunk 0 at its first send";
  OnOneStage([&](Model& model) { ASSERT_TRUE(run(model, false, &want).ok()); });
  ASSERT_EQ(got.size(), want.size());
  for (size_t round = 0; round < want.size(); ++round) {
    ASSERT_EQ(got[round].size(), want[round].size());
    for (size_t i = 0; i < want[round].size(); ++i) {
      const int64_t rows = all_logits(round, i) ? static_cast<int64_t>(lengths[round][i]) : 1;
      ASSERT_EQ(want[round][i].dim(0), rows);
      EXPECT_TRUE(SameBits(got[round][i], want[round][i]))
          << "round " << round << " chunk " << i << ": max |diff| " << testing::MaxAbsDiff(got[round][i], want[round][i]);
    }
  }
}

// A step in one flow (Model::ForwardStep; docs/distributed.md "A step in one flow"): two rounds
// of a step of two decode rows (two micro-batches on the CPU) and two sequences' prefill chunks
// (9 and 4 tokens, then 7 and 3, one with every position's logits) at PP 3. The gate holds stage
// 1's first send (the end of its work on decode micro-batch 0) until stage 0 has sent three
// calls' state — both decode micro-batches and the first chunk: stage 0 starts the chunks while
// stage 1 is still in the decodes, so the pipeline fills once for the whole step. With the
// decodes and the chunks in two flows (ForwardStep as ForwardDecode, then ForwardChunks: the
// mutation tried), stage 0 waits for the decodes' logits — which need stage 1's held send —
// before it runs a chunk: the gate times out and the test fails. Stage 0 sends the decodes first,
// then the chunks, each whole; every decode row and chunk is one stage's bits, each forwarded
// alone.
TEST(PipelineMicroBatches, AStepsDecodesAndChunksFlowThroughTheStagesAsOne) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  constexpr int kPp = 3;
  const std::vector<std::vector<size_t>> lengths = {{9, 4}, {7, 3}};  // per round, per chunk
  auto chunk_ids = [](size_t round, size_t seq, size_t n) {
    std::vector<int32_t> ids;
    for (size_t k = 0; k < n; ++k) ids.push_back(static_cast<int32_t>((round * 89 + seq * 41 + k * 11 + 3) % 500));
    return ids;
  };
  auto all_logits = [](size_t round, size_t seq) { return round == 1 && seq == 0; };
  auto decode_ids = [](size_t round) { return std::vector<int32_t>{static_cast<int32_t>(5 + round), static_cast<int32_t>(17 + round)}; };
  struct Round {
    Tensor decode;  // [2, vocab]
    std::vector<Tensor> chunks;
  };
  // Per round: through ForwardStep (stage 0's), or on one stage each decode row's and chunk's
  // Forward alone.
  auto run = [&](Model& m, bool one_flow, std::vector<Round>* out) -> Status {
    std::vector<SequenceState> decoding, prefilling;
    for (int i = 0; i < 2; ++i) decoding.push_back(m.NewSequence());
    for (int i = 0; i < 2; ++i) prefilling.push_back(m.NewSequence());
    std::vector<SequenceState*> rows = {&decoding[0], &decoding[1]};
    for (size_t round = 0; round < lengths.size(); ++round) {
      const std::vector<int32_t> next = decode_ids(round);
      std::vector<std::vector<int32_t>> ids;
      std::vector<PrefillChunk> pcs;
      for (size_t i = 0; i < prefilling.size(); ++i) ids.push_back(chunk_ids(round, i, lengths[round][i]));
      for (size_t i = 0; i < prefilling.size(); ++i) pcs.push_back({&prefilling[i], ids[i], all_logits(round, i), nullptr});
      Round r;
      if (one_flow) {
        KIMIRT_ASSIGN_OR_RETURN(StepLogits step, m.ForwardStep(DecodeRows{rows, next}, pcs));
        if (step.decode.defined() != m.stage().is_first() || step.chunks.size() != pcs.size()) {
          return Internal("decode logits on a stage other than the first, or none on the first");
        }
        r.decode = std::move(step.decode);
        r.chunks = std::move(step.chunks);
        out->push_back(std::move(r));
        continue;
      }
      const int64_t V = m.config().vocab_size;
      r.decode = Tensor::Host({2, V});
      for (size_t b = 0; b < rows.size(); ++b) {
        KIMIRT_ASSIGN_OR_RETURN(Tensor row, m.Forward(rows[b], std::span<const int32_t>(&next[b], 1)));
        std::copy_n(row.f32(), V, r.decode.f32() + static_cast<int64_t>(b) * V);
      }
      for (const PrefillChunk& c : pcs) {
        ForwardOptions o;
        o.all_logits = c.all_logits;
        KIMIRT_ASSIGN_OR_RETURN(Tensor logits, m.Forward(c.state, c.ids, o));
        r.chunks.push_back(std::move(logits));
      }
      out->push_back(std::move(r));
    }
    return Status::Ok();
  };
  PipelineLog log;
  log.gate_calls = 3;
  int64_t hidden = 0;
  std::vector<Round> got, want;
  const std::vector<std::string> errors = RunGatedStages(kPp, log, [&](Model& m) -> Status {
    std::vector<Round> mine;
    KIMIRT_RETURN_IF_ERROR(run(m, true, &mine));
    if (m.stage().is_first()) got = std::move(mine);
    return Status::Ok();
  }, &hidden);
  for (const std::string& e : errors) ASSERT_EQ(e, "");
  EXPECT_FALSE(log.gate_timed_out) << "stage 0 did not start the chunks while stage 1 held decode micro-batch 0 (stage "
                                      "0 had sent " << log.stage0_sends_at_release << " messages)";
  const int64_t per_call = log.gated_recvs_at_gate;  // messages a call's state takes across a boundary
  ASSERT_GT(per_call, 0);
  EXPECT_GE(log.stage0_sends_at_release, 3 * per_call);
  // Stage 0 sent, each round, decode micro-batch 0 and 1 (a row each), then each chunk whole.
  std::vector<size_t> want_floats;
  for (const std::vector<size_t>& round : lengths) {
    for (size_t rows : {size_t{1}, size_t{1}, round[0], round[1]}) {
      for (int64_t k = 0; k < per_call; ++k) want_floats.push_back(rows * static_cast<size_t>(hidden));
    }
  }
  EXPECT_EQ(log.stage0_floats, want_floats);
  EXPECT_EQ(log.sends[0], log.recvs[1]);
  OnOneStage([&](Model& model) { ASSERT_TRUE(run(model, false, &want).ok()); });
  ASSERT_EQ(got.size(), want.size());
  for (size_t round = 0; round < want.size(); ++round) {
    EXPECT_TRUE(SameBits(got[round].decode, want[round].decode))
        << "round " << round << " decode rows: max |diff| " << testing::MaxAbsDiff(got[round].decode, want[round].decode);
    ASSERT_EQ(got[round].chunks.size(), want[round].chunks.size());
    for (size_t i = 0; i < want[round].chunks.size(); ++i) {
      const int64_t rows = all_logits(round, i) ? static_cast<int64_t>(lengths[round][i]) : 1;
      ASSERT_EQ(want[round].chunks[i].dim(0), rows);
      EXPECT_TRUE(SameBits(got[round].chunks[i], want[round].chunks[i]))
          << "round " << round << " chunk " << i << ": max |diff| "
          << testing::MaxAbsDiff(got[round].chunks[i], want[round].chunks[i]);
    }
  }
}

// All or nothing: a step whose last chunk holds a token outside the vocabulary fails on every
// stage at PP 2 before any of its calls runs — no decode row, no chunk advances its sequence —
// and the same step with the token fixed then gives one stage's bits, as if the failed call had
// never been made. A step naming a sequence twice (a decode row and a chunk) is refused alike.
TEST(PipelineMicroBatches, AFailingCallFailsTheWholeStepBeforeAnyRuns) {
  KIMIRT_REQUIRE_FIXTURE("tiny-a");
  std::vector<int32_t> good = {3, 1, 4, 1, 5, 9}, bad = {3, 1, 4, 1, 5, 100000};
  auto step = [&](Model& m, std::vector<SequenceState>& seqs, std::span<const int32_t> last) {
    std::vector<SequenceState*> rows = {&seqs[0], &seqs[1]};
    const std::vector<int32_t> next = {7, 8};
    const std::vector<int32_t> first = {2, 7, 1, 8};
    const PrefillChunk pcs[] = {{&seqs[2], first, false, nullptr}, {&seqs[3], last, true, nullptr}};
    return m.ForwardStep(DecodeRows{rows, next}, pcs);
  };
  std::vector<Tensor> got, want;  // decode rows, then the two chunks
  std::vector<std::string> errors(2), failures(2), twice(2);
  std::vector<std::vector<int64_t>> lengths(2);
  RunOnThreadGrid(1, 2, [&](Communicator& tp_comm, Communicator& pp_comm) {
    const size_t s = static_cast<size_t>(pp_comm.rank());
    auto backend = MakeCpuBackend();
    auto m = Model::Load(FixtureDir("tiny-a"), *backend, tp_comm, {}, &pp_comm);
    if (!m.ok()) {
      errors[s] = m.status().ToString();
      return;
    }
    std::vector<SequenceState> seqs;
    for (int i = 0; i < 4; ++i) seqs.push_back((*m)->NewSequence());
    // Every sequence a token in first (one stage's ones too, below), so a wrong advance shows.
    for (SequenceState& st : seqs) {
      if (Status f = (*m)->Forward(&st, std::vector<int32_t>{11}).status(); !f.ok()) errors[s] = f.ToString();
    }
    failures[s] = step(**m, seqs, bad).status().ToString();
    std::vector<SequenceState*> rows = {&seqs[0], &seqs[1]};
    const std::vector<int32_t> next = {7, 8}, ids = {1, 2};
    const PrefillChunk again[] = {{&seqs[1], ids, false, nullptr}};
    twice[s] = (*m)->ForwardStep(DecodeRows{rows, next}, again).status().ToString();
    for (const SequenceState& st : seqs) lengths[s].push_back(st.length);
    auto ok = step(**m, seqs, good);
    if (!ok.ok()) {
      errors[s] = ok.status().ToString();
      return;
    }
    if (s == 0) got = {ok->decode, ok->chunks[0], ok->chunks[1]};
  });
  for (int s = 0; s < 2; ++s) {
    ASSERT_EQ(errors[static_cast<size_t>(s)], "") << "stage " << s;
    EXPECT_NE(failures[static_cast<size_t>(s)].find("token id 100000 is outside the vocabulary"), std::string::npos)
        << "stage " << s << ": " << failures[static_cast<size_t>(s)];
    EXPECT_NE(twice[static_cast<size_t>(s)].find("a step names one sequence twice"), std::string::npos)
        << "stage " << s << ": " << twice[static_cast<size_t>(s)];
    EXPECT_EQ(lengths[static_cast<size_t>(s)], (std::vector<int64_t>{1, 1, 1, 1})) << "stage " << s;
  }
  OnOneStage([&](Model& model) {
    std::vector<SequenceState> seqs;
    for (int i = 0; i < 4; ++i) seqs.push_back(model.NewSequence());
    for (SequenceState& st : seqs) ASSERT_TRUE(model.Forward(&st, std::vector<int32_t>{11}).ok());
    // Each alone: the reference is a sequence's own forward (the rows' bits are the same batched,
    // RowInvariantRows, which DecodeBatchTest holds).
    const int64_t V = model.config().vocab_size;
    Tensor rows = Tensor::Host({2, V});
    for (int b = 0; b < 2; ++b) {
      auto row = model.Forward(&seqs[static_cast<size_t>(b)], std::vector<int32_t>{7 + b});
      ASSERT_TRUE(row.ok()) << row.status().ToString();
      std::copy_n(row->f32(), V, rows.f32() + b * V);
    }
    ForwardOptions last_only, every;
    last_only.all_logits = false;
    auto first = model.Forward(&seqs[2], std::vector<int32_t>{2, 7, 1, 8}, last_only);
    auto last = model.Forward(&seqs[3], good, every);
    ASSERT_TRUE(first.ok() && last.ok());
    want = {rows, *first, *last};
  });
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_TRUE(SameBits(got[i], want[i])) << "part " << i << ": max |diff| " << testing::MaxAbsDiff(got[i], want[i]);
  }
}

// How a step splits: enough micro-batches that none exceeds the row-invariant size, else the
// count asked for (at most one per row), as equal as can be.
TEST(PipelineStages, MicroBatchRowsSplitsEvenlyWithinTheRowInvariantSize) {
  using V = std::vector<int64_t>;
  EXPECT_EQ(MicroBatchRows(3, 1, 2), (V{1, 1, 1}));     // the CPU: a row each
  EXPECT_EQ(MicroBatchRows(64, 64, 2), (V{32, 32}));    // CUDA at PP 2
  EXPECT_EQ(MicroBatchRows(5, 64, 2), (V{3, 2}));
  EXPECT_EQ(MicroBatchRows(1, 64, 4), (V{1}));          // never more than one per row
  EXPECT_EQ(MicroBatchRows(3, 64, 4), (V{1, 1, 1}));
  EXPECT_EQ(MicroBatchRows(130, 64, 1), (V{44, 43, 43}));  // 1 asked, 3 needed
  EXPECT_EQ(MicroBatchRows(64, 64, 1), (V{64}));
  EXPECT_EQ(MicroBatchRows(7, 64, 0), (V{7}));          // 0 counts as 1
  for (int64_t rows : {1, 2, 7, 63, 64, 65, 200}) {
    for (int64_t r : {1, 8, 64}) {
      for (int64_t want : {1, 2, 4, 9}) {
        const V s = MicroBatchRows(rows, r, want);
        int64_t sum = 0;
        for (int64_t n : s) {
          EXPECT_GE(n, 1);
          EXPECT_LE(n, r);
          EXPECT_LE(s.front() - n, 1);
          sum += n;
        }
        EXPECT_EQ(sum, rows);
      }
    }
  }
}

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
