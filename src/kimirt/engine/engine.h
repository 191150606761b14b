// Engine: continuous batching over one Model (DESIGN.md "Data flow of one engine step").
// Requests are token ids + SamplingParams in; a stream of RequestOutput events (new tokens,
// their text, logprobs, the finish reason) out. The engine knows nothing about HTTP.
//
// One step-loop thread owns the model, the caches and the scheduler. Submit/Abort/Stats are
// thread-safe and never block on a step. Callbacks run on the step-loop thread: they must be
// quick and must not call back into the engine except Abort.
//
// Batch invariance: prompts are prefilled one sequence at a time in chunks of a fixed size
// (`prefill_chunk`, aligned to absolute positions: scheduler.h) that does not depend on the
// load; decode steps are forwarded one sequence at a time too, or together in one forward where
// the runner's backend computes every row exactly as alone (ModelRunner::decode_batch_limit:
// CUDA). So a request's tokens are bit-identical alone or among many (issue "Engine": batch
// invariance), and whether or not it was preempted: a preempted sequence recomputes its prompt
// in the same chunks and replays its generated tokens through one-token forwards, as the decode
// steps computed them (scheduler.h, docs/prefix-caching.md).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/engine/sampler.h"
#include "kimirt/engine/sampling_params.h"
#include "kimirt/engine/model_runner.h"

namespace kimirt {

class Tokenizer;

enum class FinishReason : uint8_t { kNone, kStop, kLength, kAbort, kError };
std::string_view FinishReasonName(FinishReason r);  // "stop", "length", "abort", "error"

struct RequestOutput {
  std::string request_id;
  std::vector<int32_t> token_ids;      // tokens sampled since the last event
  std::string text;                    // their text (held back at UTF-8 or stop-string edges)
  std::vector<SampleResult> logprobs;  // one per token when params.logprobs >= 0
  // With params.prompt_logprobs >= 0, on the first event that carries a token: one entry per
  // prompt token after the first, in order (a request aborted before its first token gets none). They come from the
  // same chunked prefill that produces the first token, which reads the last position's logits
  // exactly as a request without prompt logprobs would (Model::Forward), so asking for them
  // never changes the tokens.
  std::vector<SampleResult> prompt_logprobs;
  FinishReason finish = FinishReason::kNone;
  std::string stop_string;             // the stop string that ended it, if any
  int32_t stop_token = -1;             // the stop token id that ended it, if any
  Status error;                        // set when finish == kError
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;       // total so far
};

struct EngineRequest {
  std::string id;
  std::vector<int32_t> prompt;
  SamplingParams params;
  std::function<void(const RequestOutput&)> on_output;
};

// The latent cache's size, block and dtype belong to the ModelRunner (RunnerOptions).
struct EngineOptions {
  int32_t max_num_seqs = 64;              // running sequences (= KDA state slots)
  int32_t max_num_batched_tokens = 10240; // tokens forwarded per step
  int64_t max_model_len = 0;              // prompt + output; 0: the model's maximum
  int32_t prefill_chunk = 256;            // fixed prefill chunk (batch invariance)
  int32_t max_waiting = 1024;             // queued requests before Submit refuses
  uint64_t default_seed = 0;              // mixed with the request id for requests without a seed
  // Resume prompts from cached prefixes (docs/prefix-caching.md): bit-identical to no caching.
  // Needs KDA snapshot room in the runner (RunnerOptions::max_kda_snapshots or
  // kda_snapshot_fraction); a runner without it caches nothing.
  bool enable_prefix_caching = true;
};

// Test-only hooks into the step loop; production code passes none (Engine::Create's default).
struct EngineTestHooks {
  // When set, replaces each sampled token with what it returns, given the request's count of
  // tokens generated before this one. The model still runs and the logprobs stay the sampled
  // token's; stop conditions and text follow the replacement.
  std::function<int32_t(int64_t generated)> override_token;

  // Every request generates exactly `tokens`, then the model's first EOS id. Lets end-to-end
  // tests drive output paths, such as K3 tool calls, that a random-weight model never produces.
  static EngineTestHooks ForcedCompletion(std::vector<int32_t> tokens, const ModelConfig& config);
};

struct EngineStats {
  int64_t running = 0, waiting = 0;
  // used: held by running sequences; evictable: held only by the prefix cache (free for the
  // taking); total - used - evictable are free.
  int64_t kv_blocks_total = 0, kv_blocks_used = 0, kv_blocks_evictable = 0;
  int64_t state_slots_total = 0, state_slots_used = 0;
  int64_t preemptions = 0;  // total (vllm:num_preemptions_total)
  int64_t steps = 0;
  int64_t prompt_tokens = 0, generation_tokens = 0;  // totals
  bool prefix_caching = false;                       // whether a prefix cache runs
  int64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // prompt tokens looked up, found (totals)
  int64_t prefix_cache_evicted_blocks = 0;                  // total
  int64_t kda_snapshots = 0;
  uint64_t kda_snapshot_bytes = 0;  // per rank
};

class Engine {
 public:
  // Starts the step loop. `tokenizer` may be null (no text, no stop strings). The runner and
  // the tokenizer must outlive the engine.
  static Result<std::unique_ptr<Engine>> Create(ModelRunner& runner, const Tokenizer* tokenizer,
                                                EngineOptions options, EngineTestHooks hooks = {});
  virtual ~Engine() = default;

  // Queues a request. Errors: InvalidArgument (bad params, empty or too long prompt, duplicate
  // id), ResourceExhausted (waiting queue full), Unavailable-like kResourceExhausted after
  // Shutdown. On success the callback will be called until an event with finish != kNone.
  virtual Status Submit(EngineRequest request) = 0;
  // Cancels a queued or running request; its callback gets a final kAbort event. Unknown ids
  // are ignored (the request may have finished meanwhile).
  virtual void Abort(const std::string& request_id) = 0;
  virtual EngineStats Stats() const = 0;
  // Stops accepting; with drain, finishes running and queued requests first, else aborts them.
  // Returns when the step loop has exited.
  virtual void Shutdown(bool drain) = 0;
  virtual const EngineOptions& options() const = 0;
  // OK while the model can run; once its runner failed for good (a process rank died:
  // ModelRunner::health), the error naming the rank. Any thread.
  virtual Status Health() const { return Status::Ok(); }
};

}  // namespace kimirt
