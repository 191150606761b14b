// Test helpers for a model on CPU thread ranks: load a fixture on every rank of a TP group and run
// a prompt and a greedy continuation on each (the TP, EP and latent-sharding tests).
#pragma once

#include <algorithm>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/model/model_test_util.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt::testing {

// Tokens of greedy continuation RunRank takes.
constexpr int kRankGreedyTokens = 12;

// What one rank produced: every prompt position's logits (prefilled in chunks of 33, so the
// 70-token prompt crosses the 64-token KDA chunk), then a greedy continuation.
struct RankOutput {
  std::string error;
  Tensor logits;
  std::vector<int32_t> greedy;
};

inline RankOutput RunRank(Model& m, const std::vector<int32_t>& ids) {
  RankOutput out;
  const int64_t V = m.config().vocab_size;
  out.logits = Tensor::Host({static_cast<int64_t>(ids.size()), V});
  SequenceState st = m.NewSequence();
  for (size_t at = 0; at < ids.size(); at += 33) {
    const size_t n = std::min<size_t>(33, ids.size() - at);
    auto part = m.Forward(&st, std::span<const int32_t>(ids).subspan(at, n));
    if (!part.ok()) {
      out.error = part.status().ToString();
      return out;
    }
    std::copy_n(part->f32(), n * static_cast<size_t>(V), out.logits.f32() + at * static_cast<size_t>(V));
  }
  const float* last = out.logits.f32() + (ids.size() - 1) * static_cast<size_t>(V);
  int32_t next = ArgMax(last, V);
  ForwardOptions o;
  o.all_logits = false;
  for (int i = 0; i < kRankGreedyTokens; ++i) {
    out.greedy.push_back(next);
    auto step = m.Forward(&st, std::vector<int32_t>{next}, o);
    if (!step.ok()) {
      out.error = step.status().ToString();
      return out;
    }
    next = ArgMax(step->f32(), V);
  }
  return out;
}

// `fn` on every rank of `fixture` loaded at TP `tp` with `lo`, each rank on its own CPU backend.
// Returns the ranks' load errors (empty strings: loaded).
inline std::vector<std::string> OnThreadRanks(const std::string& fixture, int tp, const LoadOptions& lo,
                                              const std::function<void(Model&, Communicator&)>& fn) {
  std::vector<std::string> errors(static_cast<size_t>(tp));
  auto body = [&](Communicator& comm) {
    auto backend = MakeCpuBackend();
    auto m = Model::Load(FixtureDir(fixture), *backend, comm, lo);
    // Every rank loads the same checkpoint at the same degrees: all fail or none.
    if (!m.ok()) {
      errors[static_cast<size_t>(comm.rank())] = m.status().ToString();
      return;
    }
    fn(**m, comm);
  };
  if (tp == 1) {
    auto comm = MakeSingleRankCommunicator();
    body(*comm);
  } else {
    RunOnThreadRanks(tp, body);
  }
  return errors;
}

}  // namespace kimirt::testing
