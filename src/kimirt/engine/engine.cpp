// The engine's step loop (engine.h). One thread owns the model, the latent cache and every
// Sequence; other threads only touch the inbox, the abort list and the stats snapshot, under
// `mu_`.
//
// A step: admit waiting requests (a state slot and the first chunk's latent blocks), pick work
// under the token budget (decodes first, then prefill chunks of a fixed size), reserve blocks
// (preempting the newest running sequence, to be recomputed later, when the pool runs dry),
// forward (prefill chunks one sequence at a time; decodes batched where the runner allows),
// sample where a sequence has caught up, emit events.
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

#include "kimirt/core/random.h"
#include "kimirt/tokenizer/detokenizer.h"
#include "kimirt/tokenizer/tokenizer.h"

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

namespace {

struct Sequence {
  EngineRequest req;
  std::vector<int32_t> tokens;  // prompt, then sampled tokens
  int64_t prompt_len = 0;
  int64_t computed = 0;         // tokens already forwarded into the runner's state
  ModelRunner::Handle handle = -1;
  bool has_state = false;
  uint64_t arrival = 0;         // admission order; the newest is preempted first
  std::unique_ptr<Sampler> sampler;
  std::unique_ptr<IncrementalDetokenizer> detok;
  std::unique_ptr<StopMatcher> stops;
  std::vector<SampleResult> prompt_logprobs;  // scored so far, until sent
  bool prompt_logprobs_sent = false;

  int64_t generated() const { return static_cast<int64_t>(tokens.size()) - prompt_len; }
};

class EngineImpl final : public Engine {
 public:
  EngineImpl(ModelRunner& runner, const Tokenizer* tokenizer, EngineOptions o)
      : runner_(runner), tokenizer_(tokenizer), opt_(o) {
    eos_ = runner_.config().eos_token_ids;
    stats_.kv_blocks_total = runner_.kv_blocks_total();
    stats_.state_slots_total = opt_.max_num_seqs;
    loop_ = std::thread([this] { Loop(); });
  }
  ~EngineImpl() override { Shutdown(false); }

  const EngineOptions& options() const override { return opt_; }

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
          return !inbox_.empty() || !aborts_.empty() || stopping_ || !running_.empty() || !waiting_.empty();
        });
        incoming.swap(inbox_);
        aborts.swap(aborts_);
        if (stopping_ && (!drain_ || (running_.empty() && waiting_.empty() && incoming.empty()))) {
          lock.unlock();
          for (EngineRequest& r : incoming) AbortRequest(std::move(r));
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
    auto s = std::make_unique<Sequence>();
    s->prompt_len = static_cast<int64_t>(r.prompt.size());
    s->tokens = r.prompt;
    // Unseeded requests get their own stream (the engine seed mixed with the request id), so two
    // identical unseeded prompts do not sample identically.
    s->sampler = std::make_unique<Sampler>(r.params, opt_.default_seed ^ HashName(r.id));
    if (tokenizer_ != nullptr) {
      // skip_special_tokens defaults to true as in vLLM; K3's XTML markers are "special": false,
      // so they stay in the text for the output parser (spec §10.4).
      s->detok = std::make_unique<IncrementalDetokenizer>(*tokenizer_, r.params.skip_special_tokens);
      s->stops = std::make_unique<StopMatcher>(r.params.stop);
    }
    s->req = std::move(r);
    waiting_.push_back(std::move(s));
  }

  // --- Scheduling ---

  void Step() {
    Admit();
    // Decodes first (one token each), then prefill chunks, within the token budget.
    int64_t budget = opt_.max_num_batched_tokens;
    std::vector<std::pair<Sequence*, int64_t>> work;
    for (auto& s : running_) {
      const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
      if (pending == 1 && budget >= 1) {
        work.emplace_back(s.get(), 1);
        budget -= 1;
      }
    }
    for (auto& s : running_) {
      const int64_t pending = static_cast<int64_t>(s->tokens.size()) - s->computed;
      if (pending <= 1) continue;
      // A fixed chunk (never shrunk to fit the budget) keeps a sequence's numerics independent
      // of the load; a chunk that does not fit waits for the next step.
      const int64_t chunk = std::min<int64_t>(opt_.prefill_chunk, pending);
      if (chunk > budget) continue;
      work.emplace_back(s.get(), chunk);
      budget -= chunk;
    }
    // Reserve everything first (a reservation may preempt a sequence planned for this step),
    // then forward: decodes together when the runner can batch them without changing a bit
    // (ModelRunner::decode_batch_limit), prefill chunks one sequence at a time.
    std::vector<std::pair<Sequence*, int64_t>> ready;
    for (auto& [seq, n] : work) {
      if (!IsRunning(seq)) continue;  // preempted by an earlier reservation in this step
      if (!ReserveOrPreempt(seq, seq->computed + n)) continue;
      ready.emplace_back(seq, n);
    }
    std::vector<Sequence*> decodes;
    const int64_t limit = runner_.decode_batch_limit();
    for (auto& [seq, n] : ready) {
      if (!IsRunning(seq)) continue;  // preempted by a later reservation
      if (n == 1 && limit > 1) {
        decodes.push_back(seq);
        if (static_cast<int64_t>(decodes.size()) == limit) ForwardDecodes(&decodes);
      } else {
        Forward(seq, n);
      }
    }
    ForwardDecodes(&decodes);
    // Drop finished sequences.
    running_.erase(std::remove_if(running_.begin(), running_.end(), [](const auto& s) { return s == nullptr; }),
                   running_.end());
    ++stats_steps_;
  }

  void Admit() {
    while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < opt_.max_num_seqs) {
      Sequence* s = waiting_.front().get();
      const int64_t first = std::min<int64_t>(opt_.prefill_chunk, static_cast<int64_t>(s->tokens.size()));
      if (runner_.kv_blocks_for(first) > runner_.kv_blocks_free()) break;  // admission by memory
      s->handle = runner_.NewSequence();
      s->has_state = true;
      s->computed = 0;
      s->arrival = next_arrival_++;
      running_.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
    }
  }

  bool IsRunning(const Sequence* s) const {
    return std::any_of(running_.begin(), running_.end(), [&](const auto& r) { return r.get() == s; });
  }

  // Reserves latent blocks for `tokens` positions of `s`, preempting the newest other running
  // sequence (recompute later) while the pool is short. False if `s` itself had to yield.
  bool ReserveOrPreempt(Sequence* s, int64_t tokens) {
    for (;;) {
      if (runner_.Reserve(s->handle, tokens).ok()) return true;
      Sequence* victim = nullptr;
      for (auto& r : running_) {
        if (r && (victim == nullptr || r->arrival > victim->arrival)) victim = r.get();
      }
      Preempt(victim);
      if (victim == s) return false;
    }
  }

  void Preempt(Sequence* s) {
    // Recompute preemption (vLLM): drop the state and blocks, keep the tokens; the sequence
    // goes to the front of the queue and re-prefills prompt + output when readmitted.
    runner_.Release(s->handle);
    s->has_state = false;
    s->computed = 0;
    if (!s->prompt_logprobs_sent) s->prompt_logprobs.clear();  // the re-prefill scores again
    ++preemptions_;
    for (auto& r : running_) {
      if (r.get() == s) {
        waiting_.push_front(std::move(r));
        break;
      }
    }
    running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
  }

  void Forward(Sequence* s, int64_t n) {
    std::span<const int32_t> ids(s->tokens.data() + s->computed, static_cast<size_t>(n));
    Result<Tensor> logits = runner_.Forward(s->handle, ids, /*last_only=*/!ScoresPrompt(s));
    if (!logits.ok()) {
      Finish(s, FinishReason::kError, logits.status());
      return;
    }
    Advance(s, n, *logits);
  }

  // One token for each of `seqs` in one runner call; empties the list.
  void ForwardDecodes(std::vector<Sequence*>* seqs) {
    if (seqs->empty()) return;
    if (seqs->size() == 1) {
      Forward(seqs->front(), 1);
      seqs->clear();
      return;
    }
    std::vector<ModelRunner::Handle> handles;
    std::vector<int32_t> ids;
    for (Sequence* s : *seqs) {
      handles.push_back(s->handle);
      ids.push_back(s->tokens[static_cast<size_t>(s->computed)]);
    }
    Result<Tensor> logits = runner_.ForwardDecode(handles, ids);
    for (size_t b = 0; b < seqs->size(); ++b) {
      if (!logits.ok()) {
        Finish((*seqs)[b], FinishReason::kError, logits.status());
      } else {
        Advance((*seqs)[b], 1, logits->Rows(static_cast<int64_t>(b), 1));
      }
    }
    seqs->clear();
  }

  bool ScoresPrompt(const Sequence* s) const {
    return s->req.params.prompt_logprobs >= 0 && !s->prompt_logprobs_sent && s->computed < s->prompt_len;
  }

  // After a forward of s's next n tokens: score prompt tokens, then sample if s caught up.
  // `logits` holds the rows of those n positions ([n, V]), or just the last ([1, V]).
  void Advance(Sequence* s, int64_t n, const Tensor& logits) {
    const int32_t prompt_top = s->req.params.prompt_logprobs;
    const size_t V = static_cast<size_t>(logits.dim(1));
    if (ScoresPrompt(s)) {
      // Row i holds the distribution of the token after position computed + i.
      for (int64_t i = 0; i < n && s->computed + i + 1 < s->prompt_len; ++i) {
        const std::span<const float> at(logits.f32() + static_cast<size_t>(i) * V, V);
        s->prompt_logprobs.push_back(ScoreToken(at, s->tokens[static_cast<size_t>(s->computed + i + 1)], prompt_top));
      }
    }
    if (s->computed == 0) stats_prompt_tokens_ += std::min<int64_t>(n, s->prompt_len);
    s->computed += n;
    if (s->computed < static_cast<int64_t>(s->tokens.size())) return;  // prefill continues
    std::span<const float> row(logits.f32() + static_cast<size_t>(logits.dim(0) - 1) * V, V);
    std::vector<float> masked;
    if (s->generated() < s->req.params.min_tokens) row = MaskStopTokens(row, s->req.params, &masked);
    const std::span<const int32_t> prompt(s->tokens.data(), static_cast<size_t>(s->prompt_len));
    const std::span<const int32_t> output(s->tokens.data() + s->prompt_len, static_cast<size_t>(s->generated()));
    SampleResult r = s->sampler->Sample(row, prompt, output);
    if (!opt_.test_forced_completion.empty()) {
      const size_t k = static_cast<size_t>(s->generated());
      r.token = k < opt_.test_forced_completion.size() ? opt_.test_forced_completion[k]
                                                       : static_cast<int32_t>(eos_.empty() ? 0 : eos_[0]);
    }
    s->tokens.push_back(r.token);
    ++stats_generation_tokens_;
    Emit(s, r);
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
    if (!p.ignore_eos) for (int64_t id : eos_) mask(id);
    for (int32_t id : p.stop_token_ids) mask(id);
    return *scratch;
  }

  // --- Output and stop conditions ---

  void Emit(Sequence* s, const SampleResult& r) {
    const SamplingParams& p = s->req.params;
    RequestOutput out;
    out.request_id = s->req.id;
    out.token_ids.push_back(r.token);
    if (p.logprobs >= 0) out.logprobs.push_back(r);
    TakePromptLogprobs(s, &out);
    FinishReason finish = FinishReason::kNone;
    const bool is_eos = !p.ignore_eos && std::find(eos_.begin(), eos_.end(), r.token) != eos_.end();
    const bool is_stop_token = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), r.token) != p.stop_token_ids.end();
    if (is_eos || is_stop_token) {
      finish = FinishReason::kStop;
      out.stop_token = r.token;
    }
    // Text: a stop token's own text is not part of the completion (OpenAI / vLLM).
    if (s->detok && finish == FinishReason::kNone) {
      StopMatcher::Output t = s->stops->Push(s->detok->Push(r.token));
      out.text = std::move(t.text);
      if (t.stopped) {
        finish = FinishReason::kStop;
        out.stop_string = p.stop[t.stop_index];
      }
    }
    if (finish == FinishReason::kNone &&
        (s->generated() >= p.max_tokens || static_cast<int64_t>(s->tokens.size()) >= opt_.max_model_len)) {
      finish = FinishReason::kLength;
    }
    // Ending for any reason but a stop string releases the text held back at a UTF-8 or
    // possible-stop-string edge.
    if (finish != FinishReason::kNone && out.stop_string.empty() && s->detok) {
      out.text += s->stops->Push(s->detok->Flush()).text;
      out.text += s->stops->Flush();
    }
    out.prompt_tokens = s->prompt_len;
    out.completion_tokens = s->generated();
    out.finish = finish;
    s->req.on_output(out);
    if (finish != FinishReason::kNone) Release(s);
  }

  void TakePromptLogprobs(Sequence* s, RequestOutput* out) {
    if (s->req.params.prompt_logprobs < 0 || s->prompt_logprobs_sent) return;
    out->prompt_logprobs = std::move(s->prompt_logprobs);
    s->prompt_logprobs.clear();
    s->prompt_logprobs_sent = true;
  }

  void Finish(Sequence* s, FinishReason reason, Status error = Status::Ok()) {
    RequestOutput out;
    out.request_id = s->req.id;
    out.finish = reason;
    out.error = std::move(error);
    out.prompt_tokens = s->prompt_len;
    out.completion_tokens = std::max<int64_t>(0, s->generated());
    s->req.on_output(out);
    Release(s);
  }

  // Frees the sequence's slot and blocks and forgets it.
  void Release(Sequence* s) {
    if (s->has_state) {
      runner_.Release(s->handle);
      s->has_state = false;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.erase(s->req.id);
    }
    for (auto& r : running_) {
      if (r.get() == s) {
        r.reset();  // the null is erased after the step
        return;
      }
    }
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->get() == s) {
        waiting_.erase(it);
        return;
      }
    }
  }

  void AbortById(const std::string& id) {
    auto match = [&](const std::unique_ptr<Sequence>& s) { return s && s->req.id == id; };
    auto r = std::find_if(running_.begin(), running_.end(), match);
    if (r != running_.end()) {
      Finish(r->get(), FinishReason::kAbort);
      running_.erase(std::remove(running_.begin(), running_.end(), nullptr), running_.end());
      return;
    }
    auto w = std::find_if(waiting_.begin(), waiting_.end(), match);
    if (w != waiting_.end()) Finish(w->get(), FinishReason::kAbort);
  }

  void AbortRequest(EngineRequest r) {
    RequestOutput out;
    out.request_id = r.id;
    out.finish = FinishReason::kAbort;
    out.prompt_tokens = static_cast<int64_t>(r.prompt.size());
    {
      std::lock_guard<std::mutex> lock(mu_);
      ids_.erase(r.id);
    }
    r.on_output(out);
  }

  void AbortAll() {
    while (!running_.empty()) {
      if (running_.back()) Finish(running_.back().get(), FinishReason::kAbort);
      running_.pop_back();
    }
    while (!waiting_.empty()) Finish(waiting_.front().get(), FinishReason::kAbort);
    PublishStats();
  }

  void PublishStats() {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.running = static_cast<int64_t>(running_.size());
    stats_.waiting = static_cast<int64_t>(waiting_.size());
    stats_.kv_blocks_used = runner_.kv_blocks_total() - runner_.kv_blocks_free();
    stats_.state_slots_used = stats_.running;
    stats_.preemptions = preemptions_;
    stats_.steps = stats_steps_;
    stats_.prompt_tokens = stats_prompt_tokens_;
    stats_.generation_tokens = stats_generation_tokens_;
  }

  ModelRunner& runner_;
  const Tokenizer* tokenizer_;
  EngineOptions opt_;
  std::vector<int64_t> eos_;

  // Step-loop state (loop thread only).
  std::deque<std::unique_ptr<Sequence>> waiting_;
  std::vector<std::unique_ptr<Sequence>> running_;
  uint64_t next_arrival_ = 0;
  int64_t preemptions_ = 0, stats_steps_ = 0, stats_prompt_tokens_ = 0, stats_generation_tokens_ = 0;

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

Result<std::unique_ptr<Engine>> Engine::Create(ModelRunner& runner, const Tokenizer* tokenizer, EngineOptions o) {
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
  return std::unique_ptr<Engine>(new EngineImpl(runner, tokenizer, o));
}

}  // namespace kimirt
