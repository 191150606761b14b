// The Scheduler on its own, without a model: a runner that only keeps latent blocks (the real
// LatentKvCache allocator, one tiny layer) stands in for the model, and the tests play the step
// loop's part (advance `computed`, append a sampled token once a sequence caught up). They check
// admission by blocks and state slots, prefill chunks ending at multiples of the chunk size, the
// token budget, preemption of the newest running sequence when the pool runs dry, and how a
// preempted sequence recomputes (its prompt in chunks, its output one token at a time).
#include "kimirt/engine/scheduler.h"

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kimirt/backend/cpu/cpu_backend.h"

namespace kimirt {
namespace {

// Block accounting only: sequences own block tables in a real LatentKvCache; nothing forwards.
class BlocksOnlyRunner final : public ModelRunner {
 public:
  BlocksOnlyRunner(int64_t num_blocks, int block_size)
      : backend_(MakeCpuBackend()),
        kv_(*backend_, /*num_layers=*/1, num_blocks, block_size, /*latent_dim=*/1, /*rope_dim=*/1, KvCacheDType::kF32,
            /*growable=*/false) {}

  const ModelConfig& config() const override { return config_; }
  int64_t kv_blocks_total() const override { return kv_.num_blocks(); }
  int64_t kv_blocks_free() const override { return kv_.free_blocks(); }
  int64_t kv_blocks_for(int64_t tokens) const override { return kv_.BlocksFor(tokens); }
  Handle NewSequence() override {
    tables_[next_];
    return next_++;
  }
  Status Reserve(Handle h, int64_t tokens) override { return kv_.Reserve(&tables_.at(h), tokens); }
  Result<Tensor> Forward(Handle, std::span<const int32_t>, bool, ArgmaxRequest*) override {
    return Unsupported("the scheduler tests forward nothing");
  }
  void Release(Handle h) override {
    kv_.FreeBlocks(tables_.at(h));
    tables_.erase(h);
  }
  int kv_block_size() const override { return kv_.block_size(); }
  KvCacheDType kv_cache_dtype() const override { return kv_.dtype(); }
  std::vector<int32_t> BlockTable(Handle h) const override { return tables_.at(h); }
  int32_t kv_block_refs(int32_t b) const override { return kv_.refs(b); }
  void RetainBlocks(std::span<const int32_t> blocks) override { kv_.Share(blocks); }
  void ReleaseBlocks(std::span<const int32_t> blocks) override { kv_.FreeBlocks(blocks); }
  void SharePrefix(Handle h, std::span<const int32_t> blocks, int64_t) override {
    kv_.Share(blocks);
    tables_.at(h).assign(blocks.begin(), blocks.end());
  }
  // Snapshots hold nothing here: the scheduler only passes their ids around.
  SnapshotId SnapshotKda(Handle) override {
    ++snapshots_;
    return next_snapshot_++;
  }
  void RestoreKda(Handle, SnapshotId) override {}
  void DropKdaSnapshot(SnapshotId) override { --snapshots_; }
  uint64_t kda_snapshot_bytes() const override { return 0; }
  int64_t kda_snapshot_capacity() const override { return snapshot_capacity_; }
  void set_snapshot_capacity(int64_t n) { snapshot_capacity_ = n; }
  int64_t snapshots() const { return snapshots_; }

  int64_t blocks_of(const Sequence& s) const { return static_cast<int64_t>(tables_.at(s.handle).size()); }
  int64_t live_sequences() const { return static_cast<int64_t>(tables_.size()); }

 private:
  std::unique_ptr<Backend> backend_;
  LatentKvCache kv_;
  ModelConfig config_;
  std::map<Handle, std::vector<int32_t>> tables_;
  Handle next_ = 0;
  SnapshotId next_snapshot_ = 0;
  int64_t snapshots_ = 0, snapshot_capacity_ = 0;
};

class SchedulerTest : public ::testing::Test {
 protected:
  // Block size 4 throughout, so position counts convert to blocks by ceil(n / 4).
  // snapshots > 0: with a prefix cache holding that many KDA snapshots.
  void Make(int64_t num_blocks, SchedulerOptions o, int64_t snapshots = 0) {
    scheduler_.reset();
    cache_.reset();
    runner_ = std::make_unique<BlocksOnlyRunner>(num_blocks, 4);
    if (snapshots > 0) {
      runner_->set_snapshot_capacity(snapshots);
      cache_ = std::make_unique<PrefixCache>(*runner_, PrefixCacheOptions{o.prefill_chunk, /*seed=*/1});
    }
    scheduler_ = std::make_unique<Scheduler>(*runner_, o, cache_.get());
  }
  static SchedulerOptions Options(int32_t chunk, int32_t budget, int32_t max_seqs = 64) {
    SchedulerOptions o;
    o.prefill_chunk = chunk;
    o.max_num_batched_tokens = budget;
    o.max_num_seqs = max_seqs;
    return o;
  }
  Sequence* Add(const std::string& id, int64_t prompt_len, int32_t token = 7) {
    auto s = std::make_unique<Sequence>();
    s->id = id;
    s->prompt_len = prompt_len;
    s->tokens.assign(static_cast<size_t>(prompt_len), token);
    seqs_.push_back(std::move(s));
    scheduler_->Add(seqs_.back().get());
    return seqs_.back().get();
  }
  // The step loop's part: every planned forward completes; a sequence that caught up samples.
  void Execute(const StepPlan& plan) {
    auto advance = [this](Sequence* s, int64_t end) {
      // The step loop caches after a full chunk of the grid (engine.cpp Forward).
      if (cache_ && cache_->Qualifies(s->computed, end)) cache_->Insert(s->handle, s->tokens, end);
      s->computed = end;
      if (s->pending() == 0) s->tokens.push_back(9);
    };
    for (Sequence* s : plan.decodes) advance(s, s->computed + 1);
    for (const StepPlan::Chunk& c : plan.prefills) {
      ASSERT_EQ(c.begin, c.seq->computed) << c.seq->id;
      advance(c.seq, c.end);
    }
  }
  // The plan as "id[begin,end)" strings: decodes, then prefills.
  static std::vector<std::string> Describe(const StepPlan& plan) {
    std::vector<std::string> out;
    for (const Sequence* s : plan.decodes) {
      out.push_back(s->id + "[" + std::to_string(s->computed) + "," + std::to_string(s->computed + 1) + ")");
    }
    for (const StepPlan::Chunk& c : plan.prefills) {
      out.push_back(c.seq->id + "[" + std::to_string(c.begin) + "," + std::to_string(c.end) + ")");
    }
    return out;
  }
  static std::vector<std::string> Ids(const auto& seqs) {
    std::vector<std::string> out;
    for (const Sequence* s : seqs) out.push_back(s->id);
    return out;
  }

  std::unique_ptr<BlocksOnlyRunner> runner_;
  std::unique_ptr<PrefixCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  std::vector<std::unique_ptr<Sequence>> seqs_;
};

using V = std::vector<std::string>;

TEST_F(SchedulerTest, PrefillChunksEndAtMultiplesOfTheChunkSizeThenDecode) {
  Make(64, Options(/*chunk=*/8, /*budget=*/64));
  Sequence* a = Add("a", 21);
  std::vector<V> steps;
  for (int i = 0; i < 5; ++i) {
    const StepPlan plan = scheduler_->Schedule();
    steps.push_back(Describe(plan));
    Execute(plan);
  }
  EXPECT_EQ(steps, (std::vector<V>{{"a[0,8)"}, {"a[8,16)"}, {"a[16,21)"}, {"a[21,22)"}, {"a[22,23)"}}));
  EXPECT_EQ(a->generated(), 3);
  EXPECT_EQ(runner_->blocks_of(*a), 6);  // ceil(23 / 4): blocks cover exactly what was forwarded
}

TEST_F(SchedulerTest, NextChunkEndIsTheNextMultipleOfTheChunkInAbsolutePositions) {
  Make(64, Options(/*chunk=*/8, /*budget=*/64));
  Sequence s;
  s.tokens.assign(30, 1);
  s.prompt_len = 30;
  const std::vector<std::pair<int64_t, int64_t>> cases = {{0, 8}, {5, 8}, {7, 8}, {8, 16}, {13, 16}, {24, 30}, {29, 30}};
  for (auto [computed, end] : cases) {
    s.computed = computed;
    EXPECT_EQ(scheduler_->NextChunkEnd(s), end) << "computed " << computed;
  }
  // A 21-token prompt and 9 generated tokens (a preempted sequence recomputing): the prompt's
  // chunks end at its end, every later position is a forward of its own.
  s.prompt_len = 21;
  const std::vector<std::pair<int64_t, int64_t>> after = {{16, 21}, {17, 21}, {21, 22}, {25, 26}, {29, 30}};
  for (auto [computed, end] : after) {
    s.computed = computed;
    EXPECT_EQ(scheduler_->NextChunkEnd(s), end) << "computed " << computed;
  }
}

TEST_F(SchedulerTest, AOneTokenPrefillTailIsForwardedWithTheDecodes) {
  Make(64, Options(/*chunk=*/8, /*budget=*/64));
  Add("a", 17);
  Execute(scheduler_->Schedule());
  Execute(scheduler_->Schedule());
  const StepPlan tail = scheduler_->Schedule();
  EXPECT_EQ(Ids(tail.decodes), V{"a"});
  EXPECT_TRUE(tail.prefills.empty());
  EXPECT_EQ(tail.decodes[0]->computed, 16);
}

TEST_F(SchedulerTest, TheTokenBudgetTakesDecodesFirstAndNeverShrinksAChunk) {
  Make(256, Options(/*chunk=*/8, /*budget=*/12));
  // Four sequences whose one-token prompts make them decoders after their first step.
  for (int i = 0; i < 4; ++i) Add("d" + std::to_string(i), 1);
  StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"d0[0,1)", "d1[0,1)", "d2[0,1)", "d3[0,1)"}));
  Execute(plan);  // all four now decode
  Add("x", 20);  // wants [0,8): fits the 8 left after four decodes
  Add("y", 20);  // wants [0,8): nothing left; waits rather than forwarding fewer tokens
  Add("z", 20);
  plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"d0[1,2)", "d1[1,2)", "d2[1,2)", "d3[1,2)", "x[0,8)"}));
  EXPECT_EQ(plan.num_tokens(), 12);
  Execute(plan);
  // Without the decodes: x's next 8, then y's chunk (8) does not fit the 4 left and is skipped
  // whole, while a later, smaller chunk that fits (w: 3 tokens) still runs.
  for (Sequence* s : std::vector<Sequence*>(scheduler_->running())) {
    if (s->id[0] == 'd') scheduler_->Remove(s);
  }
  Add("w", 3);
  plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"x[8,16)", "w[0,3)"}));
  EXPECT_EQ(plan.num_tokens(), 11);
}

TEST_F(SchedulerTest, AdmissionNeedsAStateSlot) {
  Make(64, Options(/*chunk=*/8, /*budget=*/64, /*max_seqs=*/2));
  Add("a", 4);
  Add("b", 4);
  Add("c", 4);
  scheduler_->Schedule();
  EXPECT_EQ(Ids(scheduler_->running()), (V{"a", "b"}));
  EXPECT_EQ(Ids(scheduler_->waiting()), V{"c"});
  scheduler_->Remove(scheduler_->running()[0]);
  scheduler_->Schedule();
  EXPECT_EQ(Ids(scheduler_->running()), (V{"b", "c"}));
}

TEST_F(SchedulerTest, AdmissionNeedsFreeBlocksForTheFirstChunk) {
  // 5 blocks of 4 positions. a's 16-token prompt holds 4 after two chunks, leaving 1.
  Make(5, Options(/*chunk=*/8, /*budget=*/64));
  Sequence* a = Add("a", 16);
  Execute(scheduler_->Schedule());
  Execute(scheduler_->Schedule());
  EXPECT_EQ(runner_->kv_blocks_free(), 1);
  Add("b", 8);  // its first chunk needs 2 blocks: not admitted, and it holds the queue
  Add("c", 2);  // would fit, but admission is in order
  StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), V{"a[16,17)"});
  EXPECT_EQ(Ids(scheduler_->waiting()), (V{"b", "c"}));
  EXPECT_EQ(runner_->live_sequences(), 1);
  // a finishes: its blocks come back and both are admitted.
  scheduler_->Remove(a);
  EXPECT_EQ(runner_->kv_blocks_free(), 5);
  plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"b[0,8)", "c[0,2)"}));
  EXPECT_TRUE(scheduler_->waiting().empty());
}

TEST_F(SchedulerTest, WhenBlocksRunOutTheNewestRunningSequenceIsPreempted) {
  // 6 blocks of 4 = 24 positions; three 8-token prompts take 2 blocks each.
  Make(6, Options(/*chunk=*/8, /*budget=*/64));
  Sequence* a = Add("a", 8);
  Sequence* b = Add("b", 8);
  Sequence* c = Add("c", 8);
  Execute(scheduler_->Schedule());
  EXPECT_EQ(runner_->kv_blocks_free(), 0);
  // Each decode at position 8 needs a third block: c, the newest, gives its two up.
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"a[8,9)", "b[8,9)"}));
  EXPECT_EQ(Ids(plan.preempted), V{"c"});
  EXPECT_EQ(scheduler_->num_preemptions(), 1);
  EXPECT_FALSE(c->running);
  EXPECT_EQ(c->computed, 0);            // recomputes from position 0 ...
  EXPECT_EQ(c->tokens.size(), 9u);      // ... with the token it already sampled
  EXPECT_EQ(Ids(scheduler_->waiting()), V{"c"});
  EXPECT_EQ(runner_->live_sequences(), 2);
  EXPECT_EQ(runner_->blocks_of(*a), 3);
  EXPECT_EQ(runner_->blocks_of(*b), 3);
  Execute(plan);
  // When a finishes, c is readmitted and re-prefills its prompt in aligned chunks (then decodes
  // at position 8 the token it had sampled).
  scheduler_->Remove(a);
  StepPlan next = scheduler_->Schedule();
  EXPECT_EQ(Describe(next), (V{"b[9,10)", "c[0,8)"}));
  EXPECT_GT(c->arrival, b->arrival);  // readmitted: now the newest
}

TEST_F(SchedulerTest, AReservationPreemptsANewerSequenceAlreadyPlannedThisStep) {
  // a (older) prefills 24 tokens; b (newer) decodes. Its decode is reserved first (one-token
  // forwards go first), then a's last chunk finds the pool empty: b, the newest, yields, and the
  // plan no longer holds it.
  Make(6, Options(/*chunk=*/8, /*budget=*/64));
  Sequence* a = Add("a", 24);
  Sequence* b = Add("b", 4);
  Execute(scheduler_->Schedule());  // a[0,8) b[0,4)
  Execute(scheduler_->Schedule());  // b[4,5) a[8,16)
  EXPECT_EQ(runner_->kv_blocks_free(), 0);
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), V{"a[16,24)"});
  EXPECT_EQ(Ids(plan.preempted), V{"b"});
  EXPECT_EQ(runner_->blocks_of(*a), 6);
  EXPECT_FALSE(b->running);
  EXPECT_EQ(b->tokens.size(), 6u);
}

TEST_F(SchedulerTest, ASequenceThatIsItselfTheNewestYieldsItsOwnPlace) {
  // 5 blocks: a and b take 2 each; a's decode takes the last, and b, the newest, needs one for
  // its own decode: it is preempted, not planned, and waits.
  Make(5, Options(/*chunk=*/8, /*budget=*/64));
  Add("a", 8);
  Sequence* b = Add("b", 8);
  Execute(scheduler_->Schedule());
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), V{"a[8,9)"});
  EXPECT_EQ(Ids(plan.preempted), V{"b"});
  EXPECT_EQ(Ids(scheduler_->waiting()), V{"b"});
  EXPECT_TRUE(plan.exhausted.empty());
  EXPECT_FALSE(b->running);
}

TEST_F(SchedulerTest, ASequenceThatOutgrowsTheWholePoolLeavesInsteadOfLooping) {
  // Review defect (a): 2 blocks hold 8 positions; a's decode at position 8 needs a third. It
  // used to preempt itself, be readmitted, re-prefill and preempt itself again forever.
  Make(2, Options(/*chunk=*/8, /*budget=*/64));
  Sequence* a = Add("a", 8);
  Execute(scheduler_->Schedule());
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_TRUE(plan.empty());
  EXPECT_TRUE(plan.preempted.empty());
  ASSERT_EQ(plan.exhausted.size(), 1u);
  EXPECT_EQ(plan.exhausted[0].seq, a);
  EXPECT_EQ(plan.exhausted[0].tokens, 9);
  EXPECT_TRUE(scheduler_->waiting().empty());
  EXPECT_TRUE(scheduler_->running().empty());
  EXPECT_EQ(runner_->kv_blocks_free(), 2);
  EXPECT_FALSE(a->running);
  scheduler_->Remove(a);  // the step loop forgets it
  EXPECT_TRUE(scheduler_->Schedule().empty());
}

TEST_F(SchedulerTest, AdmissionCountsTheBlocksOfSequencesAdmittedEarlierInTheStep) {
  // Review defect (b): 4 blocks; three 8-token prompts need 2 each. Each saw 4 free blocks and
  // all three were admitted, then c was preempted at once by the reservations. Now c waits.
  Make(4, Options(/*chunk=*/8, /*budget=*/64));
  Add("a", 8);
  Add("b", 8);
  Add("c", 8);
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"a[0,8)", "b[0,8)"}));
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(Ids(scheduler_->waiting()), V{"c"});
  EXPECT_EQ(scheduler_->num_preemptions(), 0);
  EXPECT_EQ(runner_->live_sequences(), 2);
}

TEST_F(SchedulerTest, ACachedPrefixResumesAtTheLastSharedChunkBoundaryBelowTheLastToken) {
  // Chunk 8, blocks of 4. a's 17-token prompt caches [0,8) and [0,16) after its full chunks.
  Make(64, Options(/*chunk=*/8, /*budget=*/64), /*snapshots=*/8);
  Sequence* a = Add("a", 17);
  Execute(scheduler_->Schedule());
  Execute(scheduler_->Schedule());
  EXPECT_EQ(runner_->snapshots(), 2);
  EXPECT_EQ(cache_->stats().cached_blocks, 4);
  // b shares all 17 tokens: it resumes at 16 (its last token is recomputed) on a's 4 blocks.
  Sequence* b = Add("b", 17);
  // c shares exactly 16: resuming at 16 would leave no token to forward, so it resumes at 8.
  Sequence* c = Add("c", 16);
  // d differs in its first token: no hit.
  Sequence* d = Add("d", 17);
  d->tokens[0] = 1;
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), (V{"a[16,17)", "b[16,17)", "c[8,16)", "d[0,8)"}));
  EXPECT_EQ(runner_->BlockTable(b->handle)[0], runner_->BlockTable(a->handle)[0]);
  EXPECT_EQ(runner_->BlockTable(c->handle)[1], runner_->BlockTable(a->handle)[1]);
  EXPECT_NE(runner_->BlockTable(d->handle)[0], runner_->BlockTable(a->handle)[0]);
  EXPECT_EQ(runner_->kv_block_refs(runner_->BlockTable(a->handle)[0]), 4);  // a, b, c and the cache
  const PrefixCacheStats st = cache_->stats();
  EXPECT_EQ(st.queries, 17 + 17 + 16 + 17);  // a, b, c, d at admission
  EXPECT_EQ(st.hits, 16 + 8);
}

TEST_F(SchedulerTest, ARecomputedSequenceResumesWithinItsPromptThenReplaysOneTokenAtATime) {
  // Chunk 8, blocks of 4. x's 19-token prompt caches [0,8) and [0,16) with snapshots.
  Make(64, Options(/*chunk=*/8, /*budget=*/64), /*snapshots=*/8);
  Sequence* x = Add("x", 19);
  for (int i = 0; i < 3; ++i) Execute(scheduler_->Schedule());
  ASSERT_EQ(runner_->snapshots(), 2);
  scheduler_->Remove(x);
  // p: a 10-token prompt and 8 tokens sampled before it was preempted, all equal to x's first
  // 18. Queued as a preempted sequence waits (nothing computed, not running).
  auto owned = std::make_unique<Sequence>();
  Sequence* p = owned.get();
  p->id = "p";
  p->prompt_len = 10;
  p->tokens.assign(18, 7);
  seqs_.push_back(std::move(owned));
  scheduler_->Add(p);
  // It resumes at 8, inside its prompt; never at 16: positions 10..15 were computed by its
  // decode steps, the cached ones by x's prefill chunk. Then the rest of the prompt as the
  // chunk [8,10), and its output token by token, the forward of 17 last (the one that samples).
  std::vector<V> steps;
  for (int i = 0; i < 9; ++i) {
    const StepPlan plan = scheduler_->Schedule();
    steps.push_back(Describe(plan));
    Execute(plan);
    if (i < 8) EXPECT_EQ(p->tokens.size(), 18u) << "step " << i;  // replays sample nothing
  }
  EXPECT_EQ(steps, (std::vector<V>{{"p[8,10)"}, {"p[10,11)"}, {"p[11,12)"}, {"p[12,13)"}, {"p[13,14)"},
                                   {"p[14,15)"}, {"p[15,16)"}, {"p[16,17)"}, {"p[17,18)"}}));
  EXPECT_EQ(p->tokens.size(), 19u);
  EXPECT_EQ(cache_->stats().hits, 8);
  EXPECT_EQ(cache_->stats().queries, 19 + 10);  // x's prompt, then p's
}

TEST_F(SchedulerTest, UnreferencedCachedBlocksAreEvictedBeforeAnyoneIsPreempted) {
  // 6 blocks. a caches its 2 prompt blocks and ends; they stay cached, held by none.
  Make(6, Options(/*chunk=*/8, /*budget=*/64), /*snapshots=*/4);
  Sequence* a = Add("a", 9, /*token=*/3);
  Execute(scheduler_->Schedule());
  scheduler_->Remove(a);
  EXPECT_EQ(cache_->evictable_blocks(), 2);
  EXPECT_EQ(runner_->kv_blocks_free(), 4);
  // b (another prompt) needs 6 blocks over its life: admission counts the cached 2 as free and
  // its second chunk evicts them instead of waiting or preempting.
  Sequence* b = Add("b", 24, /*token=*/5);
  Execute(scheduler_->Schedule());
  Execute(scheduler_->Schedule());
  const StepPlan plan = scheduler_->Schedule();
  EXPECT_EQ(Describe(plan), V{"b[16,24)"});
  EXPECT_TRUE(plan.preempted.empty());
  EXPECT_EQ(runner_->blocks_of(*b), 6);
  EXPECT_EQ(cache_->stats().cached_blocks, 4);  // b's own first 4 (held by b)
  EXPECT_EQ(runner_->snapshots(), 2);           // a's was dropped with its blocks
  EXPECT_EQ(scheduler_->num_preemptions(), 0);
}

TEST_F(SchedulerTest, RemoveReturnsEverySlotAndBlock) {
  Make(16, Options(/*chunk=*/8, /*budget=*/64, /*max_seqs=*/2));
  Sequence* a = Add("a", 10);
  Sequence* b = Add("b", 10);
  Sequence* c = Add("c", 10);
  Execute(scheduler_->Schedule());
  EXPECT_EQ(runner_->kv_blocks_free(), 12);
  scheduler_->Remove(c);  // waiting
  scheduler_->Remove(b);  // running
  scheduler_->Remove(a);
  EXPECT_TRUE(scheduler_->running().empty());
  EXPECT_TRUE(scheduler_->waiting().empty());
  EXPECT_EQ(runner_->kv_blocks_free(), 16);
  EXPECT_EQ(runner_->live_sequences(), 0);
  EXPECT_TRUE(scheduler_->Schedule().empty());
}

// Steps in flight (docs/distributed.md "Steps in flight"): a sequence in a step still in flight
// is not planned again until the step loop takes its outputs; a step takes at most
// ceil(running / steps_in_flight) one-token forwards, so a steady decode load splits into that
// many cohorts; and a reservation that could be met only by preempting an in-flight sequence
// waits instead (nothing is preempted; the sequence comes back in a later step).
namespace steps_in_flight {

void Fly(const StepPlan& plan, bool on) {
  for (Sequence* s : plan.decodes) s->in_flight = on;
  for (const StepPlan::Chunk& c : plan.prefills) c.seq->in_flight = on;
}

}  // namespace steps_in_flight

TEST_F(SchedulerTest, StepsInFlightSplitTheDecodesIntoCohortsAndNeverPlanASequenceTwice) {
  SchedulerOptions o = Options(/*chunk=*/4, /*budget=*/64);
  o.steps_in_flight = 2;
  Make(64, o);
  for (const char* id : {"a", "b", "c", "d", "e"}) Add(id, 4);
  const StepPlan prefill = scheduler_->Schedule();
  ASSERT_EQ(prefill.prefills.size(), 5u);  // chunks are not capped, only one-token forwards
  Execute(prefill);
  // Five decoding: ceil(5 / 2) = 3 in the first step, while it flies the other two.
  const StepPlan first = scheduler_->Schedule();
  EXPECT_EQ(Describe(first), (V{"a[4,5)", "b[4,5)", "c[4,5)"}));
  steps_in_flight::Fly(first, true);
  const StepPlan second = scheduler_->Schedule();
  EXPECT_EQ(Describe(second), (V{"d[4,5)", "e[4,5)"}));
  steps_in_flight::Fly(second, true);
  EXPECT_TRUE(scheduler_->Schedule().empty()) << "every sequence is in flight";
  // The first step's outputs taken: its cohort goes again, the second still flying.
  steps_in_flight::Fly(first, false);
  Execute(first);
  EXPECT_EQ(Describe(scheduler_->Schedule()), (V{"a[5,6)", "b[5,6)", "c[5,6)"}));
}

TEST_F(SchedulerTest, AReservationThatOnlyAnInFlightSequenceCouldMeetWaits) {
  // 6 blocks of 4: three 8-token prompts take 2 each and the pool is empty. With c, the newest,
  // in flight, a's and b's decodes (each needing a third block) wait and nothing is preempted;
  // once c's step is taken, c is preempted for them as without steps in flight.
  Make(6, Options(/*chunk=*/8, /*budget=*/64));
  Sequence* a = Add("a", 8);
  Add("b", 8);
  Sequence* c = Add("c", 8);
  Execute(scheduler_->Schedule());
  ASSERT_EQ(runner_->kv_blocks_free(), 0);
  c->in_flight = true;  // as if c's next step were still running
  const StepPlan waits = scheduler_->Schedule();
  EXPECT_TRUE(waits.empty()) << Describe(waits).front();
  EXPECT_TRUE(waits.preempted.empty());
  EXPECT_EQ(scheduler_->num_preemptions(), 0);
  EXPECT_TRUE(a->running);
  EXPECT_TRUE(c->running);
  c->in_flight = false;
  const StepPlan after = scheduler_->Schedule();
  EXPECT_EQ(Describe(after), (V{"a[8,9)", "b[8,9)"}));
  EXPECT_EQ(Ids(after.preempted), V{"c"});
}

}  // namespace
}  // namespace kimirt
