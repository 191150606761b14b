// The engine's step loop (engine.h). One thread owns the model, the latent cache and every
// request's state; other threads only touch the inbox, the abort list and the stats snapshot,
// under `mu_`.
//
// A step: the Scheduler plans it (admission, the work under the token budget, block
// reservation and preemption: scheduler.h); the loop forwards the plan (one-token forwards
// batched where the runner allows, prefill chunks one sequence at a time; on pipeline stages the
// whole step in one call, one flow through the stages, and with steps in flight the next step
// planned and submitted before this one's outputs are taken), scores prompt
// logprobs, samples where a sequence has caught up, and hands each token to the request's
// OutputProcessor (text, stop conditions, events: output_processor.h).
#include "kimirt/engine/engine.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <unordered_map>

#include "kimirt/core/parallel_for.h"
#include "kimirt/core/random.h"
#include "kimirt/engine/output_processor.h"
#include "kimirt/engine/scheduler.h"
#include "kimirt/model/model.h"

namespace kimirt {

std::string_view FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "";
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
  }
  return "";
}

EngineTestHooks EngineTestHooks::ForcedCompletion(std::vector<int32_t> tokens, const ModelConfig& config) {
  const int32_t eos = config.eos_token_ids.empty() ? 0 : static_cast<int32_t>(config.eos_token_ids[0]);
  EngineTestHooks hooks;
  hooks.override_token = [tokens = std::move(tokens), eos](int64_t generated) {
    const size_t k = static_cast<size_t>(generated);
    return k < tokens.size() ? tokens[k] : eos;
  };
  return hooks;
}

namespace {

// One request in the step loop: its tokens as scheduled, its sampler, its output side.
struct Request {
  Request(EngineRequest r, uint64_t seed, const OutputContext& out_context)
      : sampler(r.params, seed), output(out_context, r.id, r.params, static_cast<int64_t>(r.prompt.size()),
                                        std::move(r.on_output)) {
    seq.id = std::move(r.id);
    seq.prompt_len = static_cast<int64_t>(r.prompt.size());
    seq.tokens = std::move(r.prompt);
  }
  Sequence seq;
  Sampler sampler;
  OutputProcessor output;
  int64_t prompt_counted = 0;  // prompt tokens counted in the stats (a preempted prompt is not counted twice)
};

std::unique_ptr<PrefixCache> MakePrefixCache(ModelRunner& runner, const EngineOptions& o) {
  if (!o.enable_prefix_caching || runner.kda_snapshot_capacity() <= 0) return nullptr;
  PrefixCacheOptions p;
  p.prefill_chunk = o.prefill_chunk;
  p.seed = PrefixCacheSeed(runner.config(), runner.kv_cache_dtype(), runner.kv_block_size(), o.prefill_chunk);
  return std::make_unique<PrefixCache>(runner, p);
}

class EngineImpl final : public Engine {
 public:
  EngineImpl(ModelRunner& runner, const Tokenizer* tokenizer, EngineOptions o, EngineTestHooks hooks)
      : runner_(runner), opt_(o), hooks_(std::move(hooks)),
        cache_(MakePrefixCache(runner, o)),
        scheduler_(runner,
                   SchedulerOptions{o.max_num_seqs, o.max_num_batched_tokens, o.prefill_chunk, runner.steps_in_flight()},
                   cache_.get()) {
    out_context_.tokenizer = tokenizer;
    out_context_.eos_token_ids = runner_.config().eos_token_ids;
    out_context_.max_model_len = opt_.max_model_len;
    stats_.kv_blocks_total = runner_.kv_blocks_total();
    stats_.state_slots_total = opt_.max_num_seqs;
    stats_.prefix_caching = cache_ != nullptr;
    loop_ = std::thread([this] { Loop(); });
  }
  ~EngineImpl() override { Shutdown(false); }

  const EngineOptions& options() const override { return opt_; }
  Status Health() const override { return runner_.health(); }

  Status Submit(EngineRequest r) override {
    const int32_t V = static_cast<int32_t>(runner_.config().vocab_size);
    if (r.id.empty()) return InvalidArgument("request id is empty");
    if (r.prompt.empty()) return InvalidArgument("prompt is empty");
    for (int32_t id : r.prompt) {
      if (id < 0 || id >= V) {
        return InvalidArgument("prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                               std::to_string(V) + ")");
      }
    }
    KIMIRT_RETURN_IF_ERROR(r.params.Validate(V));
    if (static_cast<int64_t>(r.prompt.size()) >= opt_.max_model_len) {
      return InvalidArgument("prompt of " + std::to_string(r.prompt.size()) +
                             " tokens leaves no room to generate within max_model_len " +
                             std::to_string(opt_.max_model_len));
    }
    if (!r.on_output) return InvalidArgument("request has no output callback");
    if (Status h = runner_.health(); !h.ok()) return Internal("the model cannot run: " + h.message());
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return ResourceExhausted("engine is shutting down");
    if (static_cast<int64_t>(inbox_.size()) + stats_.waiting >= opt_.max_waiting) {
      return ResourceExhausted("waiting queue is full (" + std::to_string(opt_.max_waiting) + " requests)");
    }
    if (!ids_.insert(r.id).second) return InvalidArgument("duplicate request id " + r.id);
    inbox_.push_back(std::move(r));
    cv_.notify_one();
    return Status::Ok();
  }

  void Abort(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborts_.push_back(id);
    cv_.notify_one();
  }

  EngineStats Stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

  void Shutdown(bool drain) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!loop_.joinable()) return;
      stopping_ = true;
      drain_ = drain;
      cv_.notify_one();
    }
    loop_.join();
  }

 private:
  void Loop() {
    for (;;) {
      std::vector<EngineRequest> incoming;
      std::vector<std::string> aborts;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] {
          return !inbox_.empty() || !aborts_.empty() || stopping_ || !requests_.empty();
        });
        incoming.swap(inbox_);
        aborts.swap(aborts_);
        if (stopping_ && (!drain_ || (requests_.empty() && incoming.empty()))) {
          lock.unlock();
          for (EngineRequest& r : incoming) Enqueue(std::move(r));
          while (!in_flight_.empty()) CollectStep();  // their requests end after their outputs
          AbortAll();
          return;
        }
      }
      for (EngineRequest& r : incoming) Enqueue(std::move(r));
      for (const std::string& id : aborts) AbortById(id);
      Step();
      PublishStats();
    }
  }

  void Enqueue(EngineRequest r) {
    // Unseeded requests get their own stream (the engine seed mixed with the request id), so two
    // identical unseeded prompts do not sample identically.
    const uint64_t seed = opt_.default_seed ^ HashName(r.id);
    const std::string id = r.id;
    auto req = std::make_unique<Request>(std::move(r), seed, out_context_);
    // Prompt logprobs need every prompt position forwarded; a cached prefix skips them.
    req->seq.use_prefix_cache = !req->output.wants_prompt_logprobs();
    scheduler_.Add(&req->seq);
    requests_.emplace(id, std::move(req));
  }

  // --- Executing the scheduler's plan ---

  void Step() {
    if (runner_.steps_in_flight() > 1) {
      OverlappedStep();
      return;
    }
    const StepPlan plan = scheduler_.Schedule();
    TakeDeparted(plan);
    // Where the runner overlaps a step's work (pipeline stages: ModelRunner::step_in_flight), the
    // decodes and the prefill chunks go in one call, one flow through the stages (a lone forward
    // stays a plain one). Otherwise one-token forwards together where the runner can batch them
    // without changing a bit (ModelRunner::decode_batch_limit), then each chunk alone.
    const size_t calls = plan.prefills.size() + (plan.decodes.empty() ? 0 : 1);
    if (runner_.step_in_flight() && calls > 1) {
      ForwardStep(plan.decodes, plan.prefills);
    } else {
      const size_t limit = static_cast<size_t>(std::max<int64_t>(1, runner_.decode_batch_limit()));
      for (size_t at = 0; at < plan.decodes.size(); at += limit) {
        ForwardDecodes(std::span<Sequence* const>(plan.decodes).subspan(at, std::min(limit, plan.decodes.size() - at)));
      }
      for (const StepPlan::Chunk& c : plan.prefills) Forward(*requests_.at(c.seq->id), c.size());
    }
    ++stats_steps_;
  }

  // The plan's preempted and exhausted sequences.
  void TakeDeparted(const StepPlan& plan) {
    for (Sequence* s : plan.preempted) {
      // Unsent prompt logprobs are scored again by the recomputation; once sent, the
      // recomputation may resume from the prefix cache like any other.
      OutputProcessor& out = requests_.at(s->id)->output;
      out.DiscardPromptLogprobs();
      s->use_prefix_cache = !out.wants_prompt_logprobs();
    }
    for (const StepPlan::Exhausted& e : plan.exhausted) FinishExhausted(*requests_.at(e.seq->id), e.tokens);
  }

  // r's next forward of n tokens as a runner chunk (its argmax request in `argmax`).
  ModelRunner::Chunk ChunkOf(const Request& r, int64_t n, ArgmaxRequest* argmax) const {
    const Sequence& s = r.seq;
    const bool last_only = !ScoresPrompt(r);
    if (last_only) argmax->only = {ArgmaxOnly(r, n) ? uint8_t{1} : uint8_t{0}};
    return ModelRunner::Chunk{s.handle, std::span<const int32_t>(s.tokens.data() + s.computed, static_cast<size_t>(n)),
                              last_only, argmax};
  }

  void Forward(Request& r, int64_t n) {
    ArgmaxRequest argmax;
    const ModelRunner::Chunk c = ChunkOf(r, n, &argmax);
    Result<Tensor> logits = runner_.Forward(c.h, c.ids, c.last_only, &argmax);
    if (!logits.ok()) {
      Finish(r, FinishReason::kError, logits.status());
      return;
    }
    Forwarded(r, n, *logits, argmax);
  }

  // A step's one-token forwards as one decode batch: the requests, and the runner's arguments.
  struct DecodeBatch {
    std::vector<Request*> reqs;
    std::vector<ModelRunner::Handle> handles;
    std::vector<int32_t> ids;
    ArgmaxRequest argmax;
  };
  DecodeBatch DecodeBatchOf(std::span<Sequence* const> seqs) {
    DecodeBatch d;
    for (Sequence* s : seqs) {
      d.reqs.push_back(requests_.at(s->id).get());
      d.handles.push_back(s->handle);
      d.ids.push_back(s->tokens[static_cast<size_t>(s->computed)]);
      d.argmax.only.push_back(ArgmaxOnly(*d.reqs.back(), 1) ? 1 : 0);
    }
    return d;
  }

  // A step's decodes and prefill chunks in one runner call (ModelRunner::ForwardStep: on pipeline
  // stages one flow). Each computes exactly as alone: the sequences are distinct, so each one's
  // state after its forward is the same whatever ran beside it.
  void ForwardStep(std::span<Sequence* const> decodes, std::span<const StepPlan::Chunk> plan) {
    const std::unique_ptr<RunnerStep> step = RunnerStepOf(decodes, plan);
    StepForwarded(*step, runner_.ForwardStep(step->decodes(), step->chunks));
  }

  // A step as the runner takes it: the decode batch and the chunks (pointing into `argmax` and
  // the sequences' tokens), and the requests they belong to.
  struct RunnerStep {
    DecodeBatch d;
    std::vector<Request*> reqs;         // the chunks'
    std::vector<int64_t> sizes;         // the chunks' tokens
    std::vector<ArgmaxRequest> argmax;  // the chunks'
    std::vector<ModelRunner::Chunk> chunks;
    ModelRunner::Decodes decodes() { return ModelRunner::Decodes{d.handles, d.ids, &d.argmax}; }
    void set_in_flight(bool on) {
      for (Request* r : d.reqs) r->seq.in_flight = on;
      for (Request* r : reqs) r->seq.in_flight = on;
    }
  };
  std::unique_ptr<RunnerStep> RunnerStepOf(std::span<Sequence* const> decodes, std::span<const StepPlan::Chunk> plan) {
    auto step = std::make_unique<RunnerStep>();
    step->d = DecodeBatchOf(decodes);
    step->argmax.resize(plan.size());  // sized once: the chunks point into it
    for (size_t i = 0; i < plan.size(); ++i) {
      step->reqs.push_back(requests_.at(plan[i].seq->id).get());
      step->sizes.push_back(plan[i].size());
      step->chunks.push_back(ChunkOf(*step->reqs.back(), step->sizes.back(), &step->argmax[i]));
    }
    return step;
  }
  // A step's results, taken in the order separate calls gave them: the decodes' samples, then
  // each chunk's prefix-cache entry and outputs, in plan order. A failed step ends every request
  // it covered with its error (nothing ran: the runner's step is all or nothing), as a failing
  // decode batch or chunk did alone.
  void StepForwarded(RunnerStep& step, const Result<ModelRunner::StepLogits>& logits) {
    if (!logits.ok()) {
      for (Request* r : step.d.reqs) Finish(*r, FinishReason::kError, logits.status());
      for (Request* r : step.reqs) Finish(*r, FinishReason::kError, logits.status());
      return;
    }
    if (!step.d.reqs.empty()) DecodesForwarded(step.d, logits->decode);
    for (size_t i = 0; i < step.reqs.size(); ++i) {
      Forwarded(*step.reqs[i], step.sizes[i], logits->chunks[i], step.argmax[i]);
    }
  }

  // --- Steps in flight (ModelRunner::steps_in_flight; docs/distributed.md "Steps in flight") ---
  //
  // Up to steps_in_flight() steps are submitted before the oldest is collected: while the later
  // pipeline stages run step n, the loop plans step n + 1 from the sequences not in flight and
  // its first stage runs it. A sequence is in one step in flight at most (Sequence::in_flight),
  // so each of its forwards still follows its previous one's outputs, and every call computes
  // exactly as alone: which sequences share a step depends on timing, no bit does.

  void OverlappedStep() {
    if (in_flight_.size() < static_cast<size_t>(runner_.steps_in_flight())) {
      const StepPlan plan = scheduler_.Schedule();
      TakeDeparted(plan);
      if (!plan.empty()) {
        SubmitStep(plan);
        ++stats_steps_;
        return;
      }
    }
    if (!in_flight_.empty()) CollectStep();
  }

  // The runner reads a submitted step's arguments until it is collected: it stays in in_flight_.
  void SubmitStep(const StepPlan& plan) {
    std::unique_ptr<RunnerStep> step = RunnerStepOf(plan.decodes, plan.prefills);
    const Status s = runner_.SubmitStep(step->decodes(), step->chunks);
    if (!s.ok()) {
      StepForwarded(*step, s);
      return;
    }
    step->set_in_flight(true);
    in_flight_.push_back(std::move(step));
  }

  // The oldest step's outputs, as ForwardStep takes them; then the aborts that waited for it.
  void CollectStep() {
    const std::unique_ptr<RunnerStep> step = std::move(in_flight_.front());
    in_flight_.pop_front();
    step->set_in_flight(false);
    StepForwarded(*step, runner_.CollectStep());
    std::vector<std::string> aborts;
    aborts.swap(deferred_aborts_);
    for (const std::string& id : aborts) AbortById(id);
  }

  // After r's forward of n tokens: the prefix cache's entry, then the tokens' outputs.
  void Forwarded(Request& r, int64_t n, const Tensor& logits, const ArgmaxRequest& argmax) {
    const Sequence& s = r.seq;
    // A full chunk of the grid: its blocks and the KDA state after it are what any run of these
    // tokens computes here (prefix_cache.h).
    if (cache_ != nullptr && cache_->Qualifies(s.computed, s.computed + n)) {
      cache_->Insert(s.handle, s.tokens, s.computed + n);
    }
    Advance(r, n, logits, argmax.taken ? std::optional<int32_t>(argmax.argmax[0]) : std::nullopt);
  }

  // Whether all r needs of the last row of its next forward of n tokens is the row's argmax: no
  // prompt logprobs to score, and the row is not sampled (prefill goes on, or a preempted
  // sequence replays) or its sample is plain greedy (Sampler::ArgmaxOnly) with no stop tokens
  // to mask. Such rows stay on the device.
  bool ArgmaxOnly(const Request& r, int64_t n) const {
    const Sequence& s = r.seq;
    if (ScoresPrompt(r)) return false;  // prompt logprobs read the row
    if (s.pending() > n) return true;
    return r.sampler.ArgmaxOnly() && s.generated() >= r.sampler.params().min_tokens;
  }

  // r's next forward needs `tokens` positions, more than the whole latent cache holds: it can
  // never run (preempting it would readmit it to fail again). With output already sent it ends
  // as `length` (as at max_model_len); a prompt that alone does not fit is an error.
  void FinishExhausted(Request& r, int64_t tokens) {
    const int64_t blocks = runner_.kv_blocks_total();
    Status why = ResourceExhausted("request " + r.seq.id + " needs " + std::to_string(runner_.kv_blocks_for(tokens)) +
                                   " latent cache blocks for " + std::to_string(tokens) + " tokens; the cache holds " +
                                   std::to_string(blocks) + " blocks of " + std::to_string(runner_.kv_block_size()) +
                                   " tokens (" + std::to_string(blocks * runner_.kv_block_size()) +
                                   " tokens): lower max_model_len or give the cache more memory");
    Finish(r, r.seq.generated() > 0 ? FinishReason::kLength : FinishReason::kError, std::move(why));
  }

  // One token for each of `seqs` in one runner call.
  void ForwardDecodes(std::span<Sequence* const> seqs) {
    if (seqs.size() == 1) {
      Forward(*requests_.at(seqs[0]->id), 1);
      return;
    }
    DecodeBatch d = DecodeBatchOf(seqs);
    Result<Tensor> logits = runner_.ForwardDecode(d.handles, d.ids, &d.argmax);
    if (!logits.ok()) {
      for (Request* r : d.reqs) Finish(*r, FinishReason::kError, logits.status());
      return;
    }
    DecodesForwarded(d, *logits);
  }

  // After a decode batch's forward: each request's token from its row of `logits` (only the rows
  // not reduced to an argmax come back) or its argmax.
  void DecodesForwarded(const DecodeBatch& d, const Tensor& logits) {
    const std::vector<Request*>& reqs = d.reqs;
    const ArgmaxRequest& argmax = d.argmax;
    std::vector<Tensor> rows(reqs.size());
    int64_t next = 0;
    for (size_t b = 0; b < reqs.size(); ++b) {
      if (argmax.taken && argmax.only[b] != 0) continue;
      rows[b] = logits.Rows(argmax.taken ? next++ : static_cast<int64_t>(b), 1);
    }
    // The rows' samples, on the pool's threads: each is a pass or more over the whole vocabulary
    // (softmax, top-k/top-p), and one row after another they add up beside a batched GPU step. Each sample
    // reads its own row and changes only its own request's sampler, so the results do not
    // depend on the threads (core/parallel_for.h).
    std::vector<size_t> sampling;
    for (size_t b = 0; b < reqs.size(); ++b) {
      if (rows[b].defined() && reqs[b]->seq.pending() == 1) sampling.push_back(b);
    }
    std::vector<std::optional<SampleResult>> sampled(reqs.size());
    ParallelFor(static_cast<int64_t>(sampling.size()), [&](int64_t i) {
      const size_t b = sampling[static_cast<size_t>(i)];
      sampled[b] = SampleLastRow(*reqs[b], rows[b]);
    });
    for (size_t b = 0; b < reqs.size(); ++b) {
      if (!rows[b].defined()) {
        Advance(*reqs[b], 1, Tensor(), argmax.argmax[b]);
      } else {
        Advance(*reqs[b], 1, rows[b], std::nullopt, std::move(sampled[b]));
      }
    }
  }

  bool ScoresPrompt(const Request& r) const {
    return r.output.wants_prompt_logprobs() && r.seq.computed < r.seq.prompt_len;
  }

  // min_tokens (vLLM): the row with EOS (unless ignore_eos) and stop_token_ids at -inf, in `scratch`.
  std::span<const float> MaskStopTokens(std::span<const float> row, const SamplingParams& p,
                                        std::vector<float>* scratch) const {
    scratch->assign(row.begin(), row.end());
    auto mask = [&](int64_t id) {
      if (id >= 0 && id < static_cast<int64_t>(scratch->size())) {
        (*scratch)[static_cast<size_t>(id)] = -std::numeric_limits<float>::infinity();
      }
    };
    if (!p.ignore_eos) for (int64_t id : out_context_.eos_token_ids) mask(id);
    for (int32_t id : p.stop_token_ids) mask(id);
    return *scratch;
  }

  // r's next token from the last row of `logits` (min_tokens' stop-token mask, then the
  // sampler). Reads r, changes only r's sampler: safe beside other requests' samples.
  SampleResult SampleLastRow(Request& r, const Tensor& logits) const {
    const Sequence& s = r.seq;
    const size_t V = static_cast<size_t>(logits.dim(1));
    std::span<const float> row(logits.f32() + static_cast<size_t>(logits.dim(0) - 1) * V, V);
    std::vector<float> masked;
    if (s.generated() < r.sampler.params().min_tokens) row = MaskStopTokens(row, r.sampler.params(), &masked);
    const std::span<const int32_t> prompt(s.tokens.data(), static_cast<size_t>(s.prompt_len));
    const std::span<const int32_t> output(s.tokens.data() + s.prompt_len, static_cast<size_t>(s.generated()));
    return r.sampler.Sample(row, prompt, output);
  }

  // After a forward of r's next n tokens: score prompt tokens, then sample if r caught up.
  // `logits` holds the rows of those n positions ([n, V]), or just the last ([1, V]); or, when
  // the device reduced the last row to its argmax (ArgmaxOnly), nothing, and `argmax` is it.
  // `presampled`: the sample of the last row, already taken (SampleLastRow).
  void Advance(Request& r, int64_t n, const Tensor& logits, std::optional<int32_t> argmax = std::nullopt,
               std::optional<SampleResult> presampled = std::nullopt) {
    Sequence& s = r.seq;
    if (ScoresPrompt(r)) {
      KIMIRT_CHECK(!argmax.has_value());
      const size_t V = static_cast<size_t>(logits.dim(1));
      // Row i holds the distribution of the token after position computed + i.
      const int32_t top = r.sampler.params().prompt_logprobs;
      for (int64_t i = 0; i < n && s.computed + i + 1 < s.prompt_len; ++i) {
        const std::span<const float> at(logits.f32() + static_cast<size_t>(i) * V, V);
        r.output.AddPromptLogprob(ScoreToken(at, s.tokens[static_cast<size_t>(s.computed + i + 1)], top));
      }
    }
    const int64_t prompt_done = std::min<int64_t>(s.computed + n, s.prompt_len);
    if (prompt_done > r.prompt_counted) {
      stats_prompt_tokens_ += prompt_done - r.prompt_counted;
      r.prompt_counted = prompt_done;
    }
    s.computed += n;
    // Prefill continues, or a preempted sequence replays its generated tokens: their logits
    // were sampled (and their logprobs sent) the first time, so they are never sampled again.
    if (s.pending() > 0) return;
    SampleResult sampled;
    if (argmax.has_value()) {
      sampled.token = Sampler::FromArgmax(*argmax);  // what Sample gives (ArgmaxOnly)
    } else if (presampled.has_value()) {
      sampled = std::move(*presampled);
    } else {
      sampled = SampleLastRow(r, logits);
    }
    if (hooks_.override_token) sampled.token = hooks_.override_token(s.generated());
    s.tokens.push_back(sampled.token);
    ++stats_generation_tokens_;
    if (r.output.EmitToken(sampled, s.generated()) != FinishReason::kNone) Release(r);
  }

  // --- Ending requests ---

  // Sends r's final event without a token and forgets r.
  void Finish(Request& r, FinishReason reason, Status error = Status::Ok()) {
    r.output.EmitFinish(reason, std::move(error), r.seq.generated());
    Release(r);
  }

  // Frees r's slot and blocks and forgets it; its id may be used again.
  void Release(Request& r) {
    scheduler_.Remove(&r.seq);
    const std::string id = r.seq.id;
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.erase(id);
    }
    requests_.erase(id);  // destroys r
  }

  void AbortById(const std::string& id) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    if (it->second->seq.in_flight) {
      deferred_aborts_.push_back(id);  // a stage may still write its blocks: once its step is collected
      return;
    }
    Finish(*it->second, FinishReason::kAbort);
  }

  void AbortAll() {
    // Running ones newest first, then the queue in order.
    std::vector<Sequence*> order(scheduler_.running().rbegin(), scheduler_.running().rend());
    order.insert(order.end(), scheduler_.waiting().begin(), scheduler_.waiting().end());
    for (Sequence* s : order) Finish(*requests_.at(s->id), FinishReason::kAbort);
    PublishStats();
  }

  void PublishStats() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int64_t>(scheduler_.running().size());
    stats_.waiting = static_cast<int64_t>(scheduler_.waiting().size());
    stats_.kv_blocks_used = runner_.kv_blocks_total() - runner_.kv_blocks_free();
    if (cache_ != nullptr) {
      const PrefixCacheStats c = cache_->stats();
      stats_.kv_blocks_evictable = c.evictable_blocks;
      stats_.kv_blocks_used -= c.evictable_blocks;
      stats_.prefix_cache_queries = c.queries;
      stats_.prefix_cache_hits = c.hits;
      stats_.prefix_cache_evicted_blocks = c.evicted_blocks;
      stats_.kda_snapshots = c.snapshots;
      stats_.kda_snapshot_bytes = c.snapshot_bytes;
    }
    stats_.state_slots_used = stats_.running;
    stats_.preemptions = scheduler_.num_preemptions();
    stats_.steps = stats_steps_;
    stats_.prompt_tokens = stats_prompt_tokens_;
    stats_.generation_tokens = stats_generation_tokens_;
  }

  ModelRunner& runner_;
  EngineOptions opt_;
  EngineTestHooks hooks_;
  OutputContext out_context_;

  // Step-loop state (loop thread only). The cache outlives the scheduler that points at it.
  std::unique_ptr<PrefixCache> cache_;
  Scheduler scheduler_;
  std::unordered_map<std::string, std::unique_ptr<Request>> requests_;  // queued and running, by id
  int64_t stats_steps_ = 0, stats_prompt_tokens_ = 0, stats_generation_tokens_ = 0;
  std::deque<std::unique_ptr<RunnerStep>> in_flight_;  // submitted, not collected; oldest first
  std::vector<std::string> deferred_aborts_;            // of requests in flight when aborted

  // Shared with other threads, under mu_.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<EngineRequest> inbox_;
  std::vector<std::string> aborts_;
  std::set<std::string> ids_;  // live request ids (duplicates are refused)
  EngineStats stats_;
  bool stopping_ = false;
  bool drain_ = false;
  std::thread loop_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::Create(ModelRunner& runner, const Tokenizer* tokenizer, EngineOptions o,
                                               EngineTestHooks hooks) {
  const ModelConfig& c = runner.config();
  if (o.max_num_seqs < 1) return InvalidArgument("max_num_seqs must be >= 1");
  if (o.max_num_batched_tokens < 1) return InvalidArgument("max_num_batched_tokens must be >= 1");
  if (o.prefill_chunk < 1) return InvalidArgument("prefill_chunk must be >= 1");
  if (o.prefill_chunk > o.max_num_batched_tokens) {
    return InvalidArgument("prefill chunk " + std::to_string(o.prefill_chunk) + " exceeds max_num_batched_tokens " +
                           std::to_string(o.max_num_batched_tokens));
  }
  const int64_t model_max = c.max_position_embeddings > 0 ? c.max_position_embeddings : (int64_t{1} << 20);
  if (o.max_model_len <= 0) o.max_model_len = model_max;
  if (o.max_model_len > model_max) {
    return InvalidArgument("max_model_len " + std::to_string(o.max_model_len) + " exceeds the model's " +
                           std::to_string(model_max));
  }
  if (runner.kv_blocks_total() < runner.kv_blocks_for(o.prefill_chunk)) {
    return ResourceExhausted("the latent cache holds " + std::to_string(runner.kv_blocks_total()) +
                             " blocks, fewer than one prefill chunk of " + std::to_string(o.prefill_chunk) +
                             " tokens needs");
  }
  return std::unique_ptr<Engine>(new EngineImpl(runner, tokenizer, o, std::move(hooks)));
}

}  // namespace kimirt
