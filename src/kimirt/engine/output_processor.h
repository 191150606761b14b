// OutputProcessor: one request's output side (vLLM v1's OutputProcessor and its per-request
// state). Turns each sampled token into a RequestOutput event and sends it through the
// request's callback: the token's text from the incremental detokenizer, held back at UTF-8 and
// possible stop-string edges; the stop token, stop string, max_tokens or max_model_len that ends
// the request; the prompt logprobs, on the first event. The step loop samples; this decides what
// the client sees.
//
// Thread safety: none; the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kimirt/engine/engine.h"

namespace kimirt {

class IncrementalDetokenizer;
class StopMatcher;

// What every request's output processing shares; must outlive the processors.
struct OutputContext {
  const Tokenizer* tokenizer = nullptr;  // null: no text, no stop strings
  std::vector<int64_t> eos_token_ids;    // end a request unless params.ignore_eos
  int64_t max_model_len = 0;             // prompt + output
};

class OutputProcessor {
 public:
  OutputProcessor(const OutputContext& context, std::string request_id, const SamplingParams& params,
                  int64_t prompt_len, std::function<void(const RequestOutput&)> on_output);
  ~OutputProcessor();

  // Prompt logprobs are scored while the prompt is prefilled and sent on the first token's event.
  // True while they are asked for and not sent yet.
  bool wants_prompt_logprobs() const { return params_.prompt_logprobs >= 0 && !prompt_logprobs_sent_; }
  void AddPromptLogprob(SampleResult r) { prompt_logprobs_.push_back(std::move(r)); }
  // The sequence was preempted: its re-prefill scores the prompt again.
  void DiscardPromptLogprobs() {
    if (!prompt_logprobs_sent_) prompt_logprobs_.clear();
  }

  // Sends the event of one sampled token; `generated` counts the output tokens including it.
  // Returns why the request ended, or kNone while it goes on.
  FinishReason EmitToken(const SampleResult& r, int64_t generated);
  // Sends a final event without a token (abort, error).
  void EmitFinish(FinishReason reason, Status error, int64_t generated);

 private:
  const OutputContext& context_;
  std::string id_;
  SamplingParams params_;
  int64_t prompt_len_;
  std::function<void(const RequestOutput&)> on_output_;
  std::unique_ptr<IncrementalDetokenizer> detok_;  // with a tokenizer only
  std::unique_ptr<StopMatcher> stops_;             // with a tokenizer only
  std::vector<SampleResult> prompt_logprobs_;      // scored so far, until sent
  bool prompt_logprobs_sent_ = false;
};

}  // namespace kimirt
