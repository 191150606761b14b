// Scheduler (scheduler.h): admission, the step's work under the token budget, block
// reservation with recompute preemption.
#include "kimirt/engine/scheduler.h"

#include <algorithm>

namespace kimirt {

int64_t StepPlan::num_tokens() const {
  int64_t n = static_cast<int64_t>(decodes.size());
  for (const Chunk& c : prefills) n += c.size();
  return n;
}

Scheduler::Scheduler(ModelRunner& runner, SchedulerOptions options, PrefixCache* cache)
    : runner_(runner), opt_(options), cache_(cache) {}

void Scheduler::Add(Sequence* s) {
  s->running = false;
  s->computed = 0;
  waiting_.push_back(s);
}

void Scheduler::Remove(Sequence* s) {
  if (s->running) {
    Release(s);
    running_.erase(std::find(running_.begin(), running_.end(), s));
  } else if (auto it = std::find(waiting_.begin(), waiting_.end(), s); it != waiting_.end()) {
    waiting_.erase(it);  // (an exhausted sequence is in neither list)
  }
}

int64_t Scheduler::NextChunkEnd(const Sequence& s) const {
  // Past the prompt every position is a one-token forward, as the decode step that first
  // computed it: the replay of a preempted sequence's generated tokens included.
  if (s.computed >= s.prompt_len) return std::min<int64_t>(s.computed + 1, static_cast<int64_t>(s.tokens.size()));
  const int64_t chunk = opt_.prefill_chunk;
  return std::min<int64_t>((s.computed / chunk + 1) * chunk, s.prompt_len);
}

StepPlan Scheduler::Schedule() {
  Admit();
  // The work, within the token budget: one-token forwards first (they keep running sequences
  // moving), then prefill chunks in admission order. A chunk that does not fit waits for a later
  // step rather than shrinking: its size must not depend on the load.
  int64_t budget = opt_.max_num_batched_tokens;
  const int64_t cohorts = std::max<int32_t>(1, opt_.steps_in_flight);
  int64_t one_token = (static_cast<int64_t>(running_.size()) + cohorts - 1) / cohorts;
  std::vector<StepPlan::Chunk> work;
  for (Sequence* s : running_) {
    if (s->in_flight) continue;
    if (NextChunkEnd(*s) - s->computed == 1 && budget >= 1 && one_token >= 1) {
      work.push_back({s, s->computed, s->computed + 1});
      budget -= 1;
      one_token -= 1;
    }
  }
  for (Sequence* s : running_) {
    if (s->in_flight) continue;
    const StepPlan::Chunk c{s, s->computed, NextChunkEnd(*s)};
    if (c.size() <= 1) continue;
    if (c.size() > budget) continue;
    work.push_back(c);
    budget -= c.size();
  }
  // Reserve everything before anything runs: a reservation may preempt a sequence that an
  // earlier reservation of this step already covered, so only the survivors go in the plan.
  StepPlan plan;
  std::vector<StepPlan::Chunk> reserved;
  for (const StepPlan::Chunk& c : work) {
    if (!c.seq->running) continue;  // preempted by an earlier reservation in this step
    if (ReserveOrPreempt(c.seq, c.end, &plan)) reserved.push_back(c);
  }
  for (const StepPlan::Chunk& c : reserved) {
    if (!c.seq->running) continue;  // preempted by a later reservation
    if (c.size() == 1) {
      plan.decodes.push_back(c.seq);
    } else {
      plan.prefills.push_back(c);
    }
  }
  return plan;
}

void Scheduler::Admit() {
  // Admission by memory: a state slot, and free blocks for the first chunk (later chunks reserve
  // as they come, preempting when the pool is short). The first chunks of sequences admitted
  // earlier in this step are reserved only later in Schedule, so they are counted here
  // (`promised`); blocks only the prefix cache holds count as free, except those the sequence
  // resumes from.
  int64_t promised = 0;
  const int64_t evictable = cache_ != nullptr ? cache_->evictable_blocks() : 0;
  int64_t claimed = 0;  // evictable blocks that admitted sequences resumed from
  while (!waiting_.empty() && static_cast<int64_t>(running_.size()) < opt_.max_num_seqs) {
    Sequence* s = waiting_.front();
    PrefixCache::Match hit;
    if (cache_ != nullptr && s->use_prefix_cache) hit = cache_->Lookup(CacheablePrefix(*s));
    s->computed = hit.tokens;
    const int64_t need = runner_.kv_blocks_for(NextChunkEnd(*s)) - static_cast<int64_t>(hit.blocks.size());
    const int64_t taken = cache_ != nullptr ? cache_->EvictableAmong(hit.blocks) : 0;
    if (need + promised > runner_.kv_blocks_free() + evictable - claimed - taken) {
      s->computed = 0;
      break;
    }
    promised += need;
    claimed += taken;
    s->handle = runner_.NewSequence();
    if (cache_ != nullptr && s->use_prefix_cache) {
      cache_->Apply(s->handle, hit, s->prompt_len);
    }
    s->running = true;
    s->arrival = next_arrival_++;
    running_.push_back(s);
    waiting_.pop_front();
  }
}

bool Scheduler::ReserveOrPreempt(Sequence* s, int64_t tokens, StepPlan* plan) {
  if (runner_.kv_blocks_for(tokens) > runner_.kv_blocks_total()) {
    // Preempting would only readmit it to fail again, forever.
    Release(s);
    running_.erase(std::find(running_.begin(), running_.end(), s));
    plan->exhausted.push_back({s, tokens});
    return false;
  }
  for (;;) {
    if (runner_.Reserve(s->handle, tokens).ok()) return true;
    if (cache_ != nullptr) {
      const int64_t short_by = runner_.kv_blocks_for(tokens) -
                               static_cast<int64_t>(runner_.BlockTable(s->handle).size()) - runner_.kv_blocks_free();
      if (short_by > 0 && cache_->Evict(short_by) == short_by) continue;
    }
    Sequence* victim = *std::max_element(running_.begin(), running_.end(),
                                         [](const Sequence* a, const Sequence* b) { return a->arrival < b->arrival; });
    if (victim->in_flight) return false;  // s waits until the newest is out of flight
    Preempt(victim);
    plan->preempted.push_back(victim);
    if (victim == s) return false;
  }
}

std::span<const int32_t> Scheduler::CacheablePrefix(const Sequence& s) {
  // The prompt, and one token more once there is one: PrefixCache::Lookup resumes below the
  // span's last token, so a sequence with output may resume at the prompt's end (its first
  // token is sampled; the replay needs no logits there), a fresh one only below it.
  return std::span<const int32_t>(s.tokens).first(
      static_cast<size_t>(std::min<int64_t>(s.prompt_len + 1, static_cast<int64_t>(s.tokens.size()))));
}

void Scheduler::Preempt(Sequence* s) {
  // Recompute preemption (vLLM), made bit-neutral: drop the state and blocks, keep the tokens;
  // the sequence goes to the front of the queue. Readmitted, it resumes from the prefix cache
  // where it can, prefills the rest of its prompt in the chunks of the grid, as the first time,
  // and replays its generated tokens one per step as the decode steps computed them
  // (NextChunkEnd), sampling only after the last: its state is then the one it had here, bit
  // for bit (docs/prefix-caching.md "Preemption").
  Release(s);
  running_.erase(std::find(running_.begin(), running_.end(), s));
  waiting_.push_front(s);
  ++preemptions_;
}

void Scheduler::Release(Sequence* s) {
  runner_.Release(s->handle);
  s->running = false;
  s->handle = -1;
  s->computed = 0;
}

}  // namespace kimirt
