// OutputProcessor (output_processor.h): events, text and stop conditions of one request.
#include "kimirt/engine/output_processor.h"

#include <algorithm>

#include "kimirt/tokenizer/detokenizer.h"

namespace kimirt {

OutputProcessor::OutputProcessor(const OutputContext& context, std::string request_id, const SamplingParams& params,
                                 int64_t prompt_len, std::function<void(const RequestOutput&)> on_output)
    : context_(context), id_(std::move(request_id)), params_(params), prompt_len_(prompt_len),
      on_output_(std::move(on_output)) {
  if (context_.tokenizer != nullptr) {
    // skip_special_tokens defaults to true as in vLLM; K3's XTML markers are "special": false,
    // so they stay in the text for the output parser (spec §10.4).
    detok_ = std::make_unique<IncrementalDetokenizer>(*context_.tokenizer, params_.skip_special_tokens);
    stops_ = std::make_unique<StopMatcher>(params_.stop);
  }
}

OutputProcessor::~OutputProcessor() = default;

FinishReason OutputProcessor::EmitToken(const SampleResult& r, int64_t generated) {
  RequestOutput out;
  out.request_id = id_;
  out.token_ids.push_back(r.token);
  if (params_.logprobs >= 0) out.logprobs.push_back(r);
  if (wants_prompt_logprobs()) {
    out.prompt_logprobs = std::move(prompt_logprobs_);
    prompt_logprobs_.clear();
    prompt_logprobs_sent_ = true;
  }
  const std::vector<int64_t>& eos = context_.eos_token_ids;
  const std::vector<int32_t>& stop_ids = params_.stop_token_ids;
  FinishReason finish = FinishReason::kNone;
  const bool is_eos = !params_.ignore_eos && std::find(eos.begin(), eos.end(), r.token) != eos.end();
  const bool is_stop_token = std::find(stop_ids.begin(), stop_ids.end(), r.token) != stop_ids.end();
  if (is_eos || is_stop_token) {
    finish = FinishReason::kStop;
    out.stop_token = r.token;
  }
  // Text: a stop token's own text is not part of the completion (OpenAI / vLLM).
  if (detok_ && finish == FinishReason::kNone) {
    StopMatcher::Output t = stops_->Push(detok_->Push(r.token));
    out.text = std::move(t.text);
    if (t.stopped) {
      finish = FinishReason::kStop;
      out.stop_string = params_.stop[t.stop_index];
    }
  }
  if (finish == FinishReason::kNone &&
      (generated >= params_.max_tokens || prompt_len_ + generated >= context_.max_model_len)) {
    finish = FinishReason::kLength;
  }
  // Ending for any reason but a stop string releases the text held back at a UTF-8 or
  // possible-stop-string edge.
  if (finish != FinishReason::kNone && out.stop_string.empty() && detok_) {
    out.text += stops_->Push(detok_->Flush()).text;
    out.text += stops_->Flush();
  }
  out.prompt_tokens = prompt_len_;
  out.completion_tokens = generated;
  out.finish = finish;
  on_output_(out);
  return finish;
}

void OutputProcessor::EmitFinish(FinishReason reason, Status error, int64_t generated) {
  RequestOutput out;
  out.request_id = id_;
  out.finish = reason;
  out.error = std::move(error);
  out.prompt_tokens = prompt_len_;
  out.completion_tokens = generated;
  on_output_(out);
}

}  // namespace kimirt
