// Scheduler: what one engine step runs (DESIGN.md "Data flow of one engine step"), as vLLM v1
// separates its Scheduler from the step that executes its output. Each step it admits waiting
// sequences while a state slot and their first chunk's latent blocks are free, picks the work
// under the token budget (one-token forwards first, then prefill chunks), reserves the latent
// blocks that work writes (preempting the newest running sequence while the pool is short) and
// returns the result as a StepPlan. The step loop executes the plan and advances each
// Sequence's `computed`; it appends sampled tokens; it calls Remove when a sequence ends.
//
// Batch invariance: a prefill chunk ends at the next multiple of `prefill_chunk` in absolute
// positions (or at the prompt's end) and is never shrunk to fit the budget (a chunk that does
// not fit waits), so how a sequence's tokens are chunked never depends on the load. Every
// position past the prompt is a one-token forward, also when a preempted sequence recomputes
// its generated tokens: so preemption never changes a bit either (docs/prefix-caching.md).
//
// Prefix caching (prefix_cache.h): at admission a sequence resumes from the longest cached
// prefix (shared latent blocks and a KDA snapshot); blocks only the cache holds count as free
// for admission and are evicted, least recently used first, before anything is preempted.
//
// Steps in flight: sequences in a step still in flight (Sequence::in_flight) are skipped; when
// only preempting one of them could make room for a reservation, the sequence that needs it
// waits for a later step instead (the newest is always the one preempted, so that no bit
// depends on timing more than it must: preemption itself never changes a bit).
//
// A sequence that can never fit (its next forward needs more blocks than the whole pool holds)
// is not preempted and readmitted forever: it leaves in StepPlan::exhausted, and the step loop
// ends it naming the limit.
//
// Thread safety: none; the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <span>
#include <string>
#include <vector>

#include "kimirt/engine/model_runner.h"
#include "kimirt/engine/prefix_cache.h"

namespace kimirt {

// One request's token stream as the scheduler sees it. Owned by the engine; the scheduler keeps
// pointers from Add until Remove.
struct Sequence {
  std::string id;               // the request id
  std::vector<int32_t> tokens;  // prompt, then sampled tokens (the step loop appends)
  int64_t prompt_len = 0;
  int64_t computed = 0;         // tokens already forwarded into the runner's state (the step loop advances it)

  // Kept by the scheduler.
  bool running = false;             // holds a runner sequence: a state slot and latent blocks
  ModelRunner::Handle handle = -1;  // the runner sequence, while running
  uint64_t arrival = 0;             // admission order; the newest is preempted first
  // Whether admission may resume it from the prefix cache (false when the step loop must see
  // every prompt position, as prompt logprobs do).
  bool use_prefix_cache = true;
  // In a step still in flight (steps in flight: ModelRunner::steps_in_flight): set by the step
  // loop when a step takes the sequence, cleared when that step's outputs are taken. Such a
  // sequence is neither planned nor preempted (a stage may still write its blocks).
  bool in_flight = false;

  int64_t pending() const { return static_cast<int64_t>(tokens.size()) - computed; }
  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

// One step's work. Every sequence in `decodes` and `prefills` appears once, is running, and has
// latent blocks reserved for the positions it forwards.
struct StepPlan {
  // Forwards of exactly one token, tokens[computed]: decodes, prefills whose last chunk is a
  // single token, and a preempted sequence's replay of a generated token (the step loop samples
  // only once a sequence has no token left to forward). One-token forwards compute the same
  // alone or batched where the runner allows (ModelRunner::decode_batch_limit), so the step
  // loop may group them.
  std::vector<Sequence*> decodes;
  // Prefill chunks of more than one token: tokens [begin, end) of `seq`, begin == seq->computed;
  // forwarded one sequence at a time.
  struct Chunk {
    Sequence* seq = nullptr;
    int64_t begin = 0, end = 0;
    int64_t size() const { return end - begin; }
  };
  std::vector<Chunk> prefills;
  // Sequences preempted while reserving this step's blocks: their state and blocks are gone,
  // they wait at the front of the queue and recompute when readmitted (from the prefix cache
  // where it holds their prompt, else from position 0), bit for bit as they first computed it.
  std::vector<Sequence*> preempted;
  // Sequences whose next forward needs more blocks than the pool holds (`exhausted_tokens`
  // positions): released and forgotten by the scheduler; the step loop ends them.
  struct Exhausted {
    Sequence* seq = nullptr;
    int64_t tokens = 0;
  };
  std::vector<Exhausted> exhausted;

  int64_t num_tokens() const;
  bool empty() const { return decodes.empty() && prefills.empty(); }
};

struct SchedulerOptions {
  int32_t max_num_seqs = 64;               // running sequences (= state slots)
  int32_t max_num_batched_tokens = 10240;  // tokens forwarded per step
  int32_t prefill_chunk = 256;             // fixed prefill chunk, aligned to absolute positions
  // Steps the step loop keeps in flight (ModelRunner::steps_in_flight). Above 1 a step takes at
  // most ceil(running / steps_in_flight) one-token forwards, so that a steady decode load falls
  // into that many cohorts, one per step in flight, instead of all riding one step while the
  // next finds nothing to do (docs/distributed.md "Steps in flight").
  int32_t steps_in_flight = 1;
};

class Scheduler {
 public:
  // The runner provides state slots and latent blocks (NewSequence, Reserve, Release) and must
  // outlive the scheduler; so must `cache` (null: no prefix caching).
  Scheduler(ModelRunner& runner, SchedulerOptions options, PrefixCache* cache = nullptr);

  // Queues `s` (not running, nothing computed) behind the waiting sequences.
  void Add(Sequence* s);
  // Forgets `s`, waiting, running or exhausted; a running one's state slot and blocks are
  // released.
  void Remove(Sequence* s);
  // The next step's plan; admits and preempts as it goes.
  StepPlan Schedule();

  // Where `s`'s next forward ends: in the prompt, at the next multiple of prefill_chunk or the
  // prompt's end; past it, one token later (decode steps, and the replay of a preempted
  // sequence's generated tokens).
  int64_t NextChunkEnd(const Sequence& s) const;
  // What admission looks `s` up by in the prefix cache: its prompt (and, with output, one more
  // token, so that it may resume at the prompt's end). Never the generated tokens: the cache
  // holds prefill chunks, and those positions were computed by decode steps.
  static std::span<const int32_t> CacheablePrefix(const Sequence& s);

  const std::vector<Sequence*>& running() const { return running_; }  // in admission order
  const std::deque<Sequence*>& waiting() const { return waiting_; }    // in the order they will be admitted
  int64_t num_preemptions() const { return preemptions_; }

 private:
  void Admit();
  // Makes s's blocks cover `tokens` positions, evicting unreferenced cached blocks, then
  // preempting the newest running sequence while the pool is short. False when s itself was
  // the newest and was preempted, when the newest is in flight (s waits), or when s can never
  // fit (then it is in plan->exhausted).
  bool ReserveOrPreempt(Sequence* s, int64_t tokens, StepPlan* plan);
  void Preempt(Sequence* s);
  void Release(Sequence* s);  // the runner sequence, if any

  ModelRunner& runner_;
  SchedulerOptions opt_;
  PrefixCache* cache_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  uint64_t next_arrival_ = 0;
  int64_t preemptions_ = 0;
};

}  // namespace kimirt
