// Model::ForwardDecode (several sequences, one token each, one forward) against each sequence
// decoded alone, over two steps so the carried KDA states, conv windows and latent rows are
// checked too. Up to the backend's RowInvariantRows (CPU and CUDA: 64) the rows must match alone
// bit for bit; beyond, within rounding (rel-L2 1e-5).
#include <gtest/gtest.h>

#include <cstring>
#include <tuple>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/model/model_test_util.h"

namespace kimirt {
namespace {

using testing::FixtureDir;

class DecodeBatchTest : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {
 protected:
  void SetUp() override {
    const std::string& fixture = std::get<0>(GetParam());
    KIMIRT_REQUIRE_FIXTURE(fixture);
    auto be = MakeBackend(std::get<1>(GetParam()));
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    backend_ = std::move(be).value();
    comm_ = MakeSingleRankCommunicator();
    auto m = Model::Load(FixtureDir(fixture), *backend_, *comm_);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    model_ = std::move(m).value();
  }
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Model> model_;
};

TEST_P(DecodeBatchTest, EachRowIsTheSequenceDecodedAlone) {
  const int64_t V = model_->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 301, 44}, {9}, {120, 7, 7, 7, 7, 7, 250, 3, 2, 60}};
  const size_t B = prompts.size();
  std::vector<SequenceState> batched, alone;
  for (const auto& p : prompts) {
    for (auto* set : {&batched, &alone}) {
      set->push_back(model_->NewSequence());
      ASSERT_TRUE(model_->Forward(&set->back(), p).ok());
    }
  }
  const bool exact = backend_->RowInvariantRows() >= static_cast<int64_t>(B);
  std::vector<int32_t> next = {11, 400, 3};
  for (int step = 0; step < 2; ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    std::vector<SequenceState*> states;
    for (SequenceState& s : batched) states.push_back(&s);
    auto got = model_->ForwardDecode(states, next);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    ASSERT_EQ(got->dim(0), static_cast<int64_t>(B));
    for (size_t b = 0; b < B; ++b) {
      ForwardOptions last;
      last.all_logits = false;
      auto want = model_->Forward(&alone[b], std::vector<int32_t>{next[b]}, last);
      ASSERT_TRUE(want.ok());
      Tensor row = got->Rows(static_cast<int64_t>(b), 1);
      if (exact) {
        EXPECT_EQ(0, std::memcmp(row.f32(), want->f32(), static_cast<size_t>(V) * sizeof(float))) << "row " << b;
      } else {
        EXPECT_LE(testing::RelL2(row, *want), 1e-5) << "row " << b;
      }
      EXPECT_EQ(batched[b].length, alone[b].length);
      next[b] = testing::ArgMax(want->f32(), V);
    }
  }
  // Bad batches fail cleanly.
  std::vector<SequenceState*> twice = {&batched[0], &batched[0]};
  EXPECT_FALSE(model_->ForwardDecode(twice, std::vector<int32_t>{1, 2}).ok());
  std::vector<SequenceState*> two = {&batched[0], &batched[1]};
  EXPECT_FALSE(model_->ForwardDecode(two, std::vector<int32_t>{1}).ok());
}

// Decode graphs (docs/cuda.md "Decode graphs") give the bits of the op-by-op step while
// sequences join, finish and come back, and batch 1 stays right after bigger batches were
// captured (vllm#52531: a captured batch-1 step silently corrupted its output). Two sets of
// the same sequences step in lockstep, one with graphs, one without; every row bit for bit.
TEST_P(DecodeBatchTest, GraphsGiveTheEagerBits) {
  const int64_t V = model_->config().vocab_size;
  const std::vector<std::vector<int32_t>> prompts = {{5, 17, 301, 44}, {9}, {120, 7, 7, 250, 3}, {2, 60}};
  std::vector<SequenceState> graphed, eager;
  for (const auto& p : prompts) {
    for (auto* set : {&graphed, &eager}) {
      set->push_back(model_->NewSequence());
      ASSERT_TRUE(model_->Forward(&set->back(), p).ok());
    }
  }
  std::vector<int32_t> next = {11, 400, 3, 77};
  // Which sequences decode at each step: a shape recurs (1st eager, 2nd captured, then replayed).
  const std::vector<std::vector<size_t>> schedule = {{0},       {0},    {0},       {0, 1},    {0, 1}, {0, 1},
                                                     {0, 1, 2}, {0, 1, 2}, {0, 1, 2}, {1, 2},    {1},    {1},
                                                     {1},       {0, 1, 2, 3}, {0, 1, 2, 3}, {3}, {3}, {3}};
  const int64_t replays_before = model_->graph_replays();
  for (size_t step = 0; step < schedule.size(); ++step) {
    SCOPED_TRACE("step " + std::to_string(step));
    const std::vector<size_t>& rows = schedule[step];
    std::vector<SequenceState*> g, e;
    std::vector<int32_t> ids;
    for (size_t i : rows) {
      g.push_back(&graphed[i]);
      e.push_back(&eager[i]);
      ids.push_back(next[i]);
    }
    model_->set_decode_graphs(true);
    auto got = model_->ForwardDecode(g, ids);
    model_->set_decode_graphs(false);
    auto want = model_->ForwardDecode(e, ids);
    ASSERT_TRUE(got.ok() && want.ok());
    ASSERT_EQ(got->numel(), want->numel());
    EXPECT_EQ(0, std::memcmp(got->f32(), want->f32(), static_cast<size_t>(got->numel()) * sizeof(float)));
    for (size_t r = 0; r < rows.size(); ++r) next[rows[r]] = testing::ArgMax(want->f32() + r * V, V);
  }
  model_->set_decode_graphs(true);
  if (backend_->SupportsGraphs()) EXPECT_GT(model_->graph_replays(), replays_before + 8);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, DecodeBatchTest,
                         ::testing::Combine(::testing::Values("tiny-a", "kimi-linear-tiny"),
                                            ::testing::ValuesIn(testing::BuiltDevices())),
                         testing::FixtureDeviceName);

}  // namespace
}  // namespace kimirt
