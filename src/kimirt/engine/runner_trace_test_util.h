// Test helpers shared by the process-ranks tests (CPU and CUDA): every logits tensor a runner
// returns over a fixed sequence of calls, so that two runners can be compared call by call; the
// follower processes of the test.
#pragma once

#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "kimirt/engine/model_runner.h"
#include "kimirt/testing/run_command.h"

namespace kimirt::testing {

// The runner options of the trace tests: `tp` ranks (threads, or processes of KIMIRT_BINARY), a
// small cache with room for a few KDA snapshots; on CUDA, BF16 matrices.
inline RunnerOptions TraceRunnerOptions(bool processes, int tp = 2, bool ep = false, const std::string& device = "cpu") {
  RunnerOptions o;
  o.device = device;
  o.matrix_dtype = device == "cpu" ? DType::kF32 : DType::kBF16;
  o.tp = tp;
  o.ep = ep ? tp : 1;
  o.block_size = 8;
  o.num_kv_blocks = 64;
  o.max_kda_snapshots = 4;
  o.process_ranks = processes;
  o.rank_worker_binary = KIMIRT_BINARY;
  o.rank_timeout_ms = 20000;
  return o;
}

// Batched decode through a runner (ForwardDecode: the step's handles and tokens go to every
// rank, which runs the same batched step in lockstep; pipeline stages run it as micro-batches in
// flight): `batch` sequences of different lengths (prompts of 1 to 7 tokens), each row bit for bit
// its sequence decoded alone (Forward on a runner made with `alone`, by default `o`; same history).
// The cache gets room for every sequence.
inline void ExpectBatchedDecodeIsEachAlone(const std::string& dir, RunnerOptions o, int batch = 3,
                                           std::optional<RunnerOptions> alone = std::nullopt) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<int32_t> next;
  for (int i = 0; i < batch; ++i) {
    prompts.emplace_back();
    for (int k = 0; k < 1 + (i * 5) % 7; ++k) prompts.back().push_back((i * 7 + k * 13 + 1) % 500);
    next.push_back((i * 11 + 5) % 500);
  }
  o.num_kv_blocks = std::max<int64_t>(o.num_kv_blocks, 2 * (16 / o.block_size + 1) * batch);
  RunnerOptions ref = alone.value_or(o);
  ref.num_kv_blocks = o.num_kv_blocks;
  std::vector<Tensor> rows;
  {
    auto r = ModelRunner::Create(dir, ref);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    for (size_t i = 0; i < prompts.size(); ++i) {
      const ModelRunner::Handle h = (*r)->NewSequence();
      ASSERT_TRUE((*r)->Reserve(h, 16).ok());
      ASSERT_TRUE((*r)->Forward(h, prompts[i], true).ok());
      auto l = (*r)->Forward(h, std::vector<int32_t>{next[i]}, true);
      ASSERT_TRUE(l.ok()) << l.status().ToString();
      rows.push_back(*std::move(l));
    }
  }
  auto r = ModelRunner::Create(dir, o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::vector<ModelRunner::Handle> hs;
  for (const auto& p : prompts) {
    hs.push_back((*r)->NewSequence());
    ASSERT_TRUE((*r)->Reserve(hs.back(), 16).ok());
    ASSERT_TRUE((*r)->Forward(hs.back(), p, true).ok());
  }
  auto step = (*r)->ForwardDecode(hs, next);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_EQ(step->dim(0), static_cast<int64_t>(prompts.size()));
  const int64_t V = step->dim(1);
  for (size_t i = 0; i < prompts.size(); ++i) {
    ASSERT_EQ(rows[i].numel(), V);
    EXPECT_EQ(0, std::memcmp(step->f32() + i * V, rows[i].f32(), static_cast<size_t>(V) * sizeof(float)))
        << "row " << i << " of " << batch;
  }
  EXPECT_TRUE((*r)->health().ok());
}

inline std::vector<float> Host(const Tensor& t) { return std::vector<float>(t.f32(), t.f32() + t.numel()); }

inline int32_t Argmax(const std::vector<float>& row) {
  return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin());
}

// Every logits tensor rank 0 returns, in call order: a 13-token prefill (all positions), five
// greedy decode steps, then a second sequence sharing the first block of the prompt, restored
// from a snapshot of the first sequence taken after its first block, prefilling the rest.
inline std::vector<std::vector<float>> Trace(ModelRunner& r) {
  std::vector<std::vector<float>> out;
  std::vector<int32_t> prompt;
  for (int k = 0; k < 13; ++k) prompt.push_back((k * 37 + 5) % 500);
  const ModelRunner::Handle a = r.NewSequence();
  EXPECT_TRUE(r.Reserve(a, 32).ok());
  auto first = r.Forward(a, std::span<const int32_t>(prompt).first(8), false);
  EXPECT_TRUE(first.ok()) << first.status().ToString();
  out.push_back(Host(*first));
  const ModelRunner::SnapshotId snap = r.SnapshotKda(a);
  auto rest = r.Forward(a, std::span<const int32_t>(prompt).subspan(8), false);
  EXPECT_TRUE(rest.ok()) << rest.status().ToString();
  out.push_back(Host(*rest));
  int32_t next = Argmax(std::vector<float>(out.back().end() - r.config().vocab_size, out.back().end()));
  for (int step = 0; step < 5; ++step) {
    auto l = r.Forward(a, std::vector<int32_t>{next}, true);
    EXPECT_TRUE(l.ok()) << l.status().ToString();
    out.push_back(Host(*l));
    next = Argmax(out.back());
  }
  const ModelRunner::Handle b = r.NewSequence();
  const std::vector<int32_t> table = r.BlockTable(a);
  r.SharePrefix(b, std::span<const int32_t>(table).first(1), 8);
  r.RestoreKda(b, snap);
  EXPECT_TRUE(r.Reserve(b, 16).ok());
  auto l = r.Forward(b, std::span<const int32_t>(prompt).subspan(8), true);
  EXPECT_TRUE(l.ok()) << l.status().ToString();
  out.push_back(Host(*l));
  r.DropKdaSnapshot(snap);
  r.Release(a);
  r.Release(b);
  EXPECT_EQ(r.kv_blocks_free(), r.kv_blocks_total());
  return out;
}

// Every call's logits, bit for bit.
inline void ExpectSameBits(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  ASSERT_EQ(got.size(), want.size());
  ASSERT_FALSE(want.empty());
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size()) << "call " << i;
    EXPECT_EQ(std::memcmp(got[i].data(), want[i].data(), want[i].size() * sizeof(float)), 0) << "call " << i;
  }
}

// A step's work in one call (ForwardStep: on pipeline stages its decode micro-batches and
// prefill chunks flow through the stages as one): `seqs` sequences prefill prompts of 3 to 21
// tokens in chunks of 8, each step one chunk of every sequence with tokens left (the second of
// each sequence with every position's logits, the others the last only), beside a decode row of
// each of `decoders` other sequences (prompts of 1 to 5 tokens prefilled first, then a fixed token
// a step); then one decode step each. Every decode row's and chunk's logits bit for bit what it
// gives forwarded alone (Forward), decodes first, sequence after sequence, on a runner made with
// `alone` (one stage; or the same stages, where one stage's bits are not asserted: GPUs).
inline void ExpectStepsInFlightAreEachAlone(const std::string& dir, RunnerOptions o, int seqs,
                                            const RunnerOptions& alone, int decoders = 0) {
  std::vector<std::vector<int32_t>> prompts, decoder_prompts;
  for (int i = 0; i < seqs; ++i) {
    prompts.emplace_back();
    for (int k = 0; k < 3 + (i * 7) % 19; ++k) prompts.back().push_back((i * 31 + k * 17 + 2) % 500);
  }
  for (int i = 0; i < decoders; ++i) {
    decoder_prompts.emplace_back();
    for (int k = 0; k < 1 + (i * 3) % 5; ++k) decoder_prompts.back().push_back((i * 41 + k * 23 + 9) % 500);
  }
  constexpr size_t kChunk = 8;
  auto run = [&](const RunnerOptions& ro, bool in_flight) {
    std::vector<std::vector<float>> out;  // per step: each decode row, then each chunk
    auto r = ModelRunner::Create(dir, ro);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    if (!r.ok()) return out;
    EXPECT_EQ((*r)->step_in_flight(), ro.pp > 1);
    std::vector<ModelRunner::Handle> hs, decoding;
    for (size_t i = 0; i < prompts.size(); ++i) {
      hs.push_back((*r)->NewSequence());
      EXPECT_TRUE((*r)->Reserve(hs.back(), 32).ok());
    }
    for (const std::vector<int32_t>& p : decoder_prompts) {
      decoding.push_back((*r)->NewSequence());
      EXPECT_TRUE((*r)->Reserve(decoding.back(), 16).ok());
      EXPECT_TRUE((*r)->Forward(decoding.back(), p, true).ok());
    }
    for (size_t at = 0, step = 0;; at += kChunk, ++step) {
      std::vector<ModelRunner::Chunk> chunks;
      for (size_t i = 0; i < prompts.size(); ++i) {
        if (at >= prompts[i].size()) continue;
        const size_t n = std::min(kChunk, prompts[i].size() - at);
        chunks.push_back({hs[i], std::span<const int32_t>(prompts[i]).subspan(at, n), at != kChunk, nullptr});
      }
      if (chunks.empty()) break;
      std::vector<int32_t> next;
      for (size_t i = 0; i < decoding.size(); ++i) next.push_back(static_cast<int32_t>((step * 7 + i * 3 + 1) % 500));
      if (in_flight) {
        auto l = (*r)->ForwardStep({decoding, next, nullptr}, chunks);
        EXPECT_TRUE(l.ok()) << l.status().ToString();
        if (!l.ok()) return out;
        EXPECT_EQ(l->decode.defined(), !decoding.empty());
        const int64_t V = (*r)->config().vocab_size;
        for (size_t i = 0; i < decoding.size(); ++i) {
          out.emplace_back(l->decode.f32() + i * V, l->decode.f32() + (i + 1) * V);
        }
        for (const Tensor& t : l->chunks) out.push_back(Host(t));
        continue;
      }
      for (size_t i = 0; i < decoding.size(); ++i) {
        auto l = (*r)->Forward(decoding[i], std::span<const int32_t>(&next[i], 1), true);
        EXPECT_TRUE(l.ok()) << l.status().ToString();
        if (!l.ok()) return out;
        out.push_back(Host(*l));
      }
      for (const ModelRunner::Chunk& c : chunks) {
        auto l = (*r)->Forward(c.h, c.ids, c.last_only);
        EXPECT_TRUE(l.ok()) << l.status().ToString();
        if (!l.ok()) return out;
        out.push_back(Host(*l));
      }
    }
    for (size_t i = 0; i < prompts.size(); ++i) {
      auto l = (*r)->Forward(hs[i], std::vector<int32_t>{static_cast<int32_t>(i + 1)}, true);
      EXPECT_TRUE(l.ok()) << l.status().ToString();
      if (l.ok()) out.push_back(Host(*l));
    }
    EXPECT_TRUE((*r)->health().ok());
    return out;
  };
  ExpectSameBits(run(o, true), run(alone, false));
}

// The pids of this test process's `kimirt rank-worker` children.
inline std::vector<int> FollowerPids() {
  auto r = RunCommand("pgrep -P " + std::to_string(getpid()) + " -x kimirt");  // -x: not the shell running pgrep
  std::vector<int> pids;
  for (size_t at = 0; at < r.output.size();) {
    const size_t nl = r.output.find('\n', at);
    const std::string line = r.output.substr(at, nl == std::string::npos ? std::string::npos : nl - at);
    if (!line.empty()) pids.push_back(std::stoi(line));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  return pids;
}


// A follower dies inside a step (docs/distributed.md "Faults inside a step"):
// KIMIRT_FAULT_RANK_DIES_IN_STEP makes rank `victim` kill itself on receiving its second step,
// after rank 0 has sent the step and while rank 0 runs its own part — on GPUs waiting for the dead
// rank inside an NCCL collective, which only an abort ends before the collective's timeout. The
// step fails within seconds (the options keep serve's 5-minute rank timeout), naming the rank; the
// runner stays failed and no follower outlives it. `dir`: a model directory.
inline void ExpectFollowerDyingInAStepNamed(const std::string& dir, RunnerOptions o, int victim) {
  o.rank_timeout_ms = 5 * 60 * 1000;
  // The followers are spawned inside Create and inherit the variable; nothing else reads it.
  setenv("KIMIRT_FAULT_RANK_DIES_IN_STEP", (std::to_string(victim) + ":2").c_str(), 1);
  auto r = ModelRunner::Create(dir, o);
  unsetenv("KIMIRT_FAULT_RANK_DIES_IN_STEP");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const ModelRunner::Handle h = (*r)->NewSequence();
  ASSERT_TRUE((*r)->Reserve(h, 16).ok());
  ASSERT_TRUE((*r)->Forward(h, std::vector<int32_t>{1, 2, 3}, true).ok());  // step 1: every rank alive
  const auto t0 = std::chrono::steady_clock::now();
  Result<Tensor> l = (*r)->Forward(h, std::vector<int32_t>{4}, true);  // step 2: the victim dies in it
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_FALSE(l.ok()) << "the step a rank died in returned logits";
  EXPECT_LT(s, 10.0) << l.status().message();
  const std::string named = "rank " + std::to_string(victim);
  EXPECT_NE(l.status().message().find(named), std::string::npos) << l.status().message();
  EXPECT_NE((*r)->health().message().find(named), std::string::npos) << (*r)->health().ToString();
  EXPECT_FALSE((*r)->Forward(h, std::vector<int32_t>{5}, true).ok());
  r->reset();
  EXPECT_TRUE(FollowerPids().empty());
}

}  // namespace kimirt::testing
