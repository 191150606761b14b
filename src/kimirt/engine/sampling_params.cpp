#include "kimirt/engine/sampling_params.h"

#include <cmath>
#include <cstdio>

namespace kimirt {
namespace {

// "%g": 1.5 prints as 1.5 (std::to_string would give 1.500000), NaN as nan.
std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

// Comparisons are written so that NaN fails them.
bool InClosed(float v, float lo, float hi) { return v >= lo && v <= hi; }

}  // namespace

Status SamplingParams::Validate(int32_t vocab_size) const {
  if (vocab_size <= 0) return InvalidArgument("vocab_size must be > 0, got " + std::to_string(vocab_size));
  const std::string vocab_range = "[0, " + std::to_string(vocab_size) + ")";
  if (!(std::isfinite(temperature) && temperature >= 0.0f)) {
    return InvalidArgument("temperature must be finite and >= 0, got " + Num(temperature));
  }
  if (!(top_p > 0.0f && top_p <= 1.0f)) return InvalidArgument("top_p must be in (0, 1], got " + Num(top_p));
  if (top_k < -1) return InvalidArgument("top_k must be >= -1 (-1 or 0: off), got " + std::to_string(top_k));
  if (!InClosed(min_p, 0.0f, 1.0f)) return InvalidArgument("min_p must be in [0, 1], got " + Num(min_p));
  if (!InClosed(presence_penalty, -2.0f, 2.0f)) {
    return InvalidArgument("presence_penalty must be in [-2, 2], got " + Num(presence_penalty));
  }
  if (!InClosed(frequency_penalty, -2.0f, 2.0f)) {
    return InvalidArgument("frequency_penalty must be in [-2, 2], got " + Num(frequency_penalty));
  }
  if (!(std::isfinite(repetition_penalty) && repetition_penalty > 0.0f)) {
    return InvalidArgument("repetition_penalty must be finite and > 0, got " + Num(repetition_penalty));
  }
  if (logprobs < -1 || logprobs > 20) {
    return InvalidArgument("logprobs must be in [-1, 20], got " + std::to_string(logprobs));
  }
  if (prompt_logprobs < -1 || prompt_logprobs > 20) {
    return InvalidArgument("prompt_logprobs must be in [-1, 20], got " + std::to_string(prompt_logprobs));
  }
  if (max_tokens < 1) return InvalidArgument("max_tokens must be >= 1, got " + std::to_string(max_tokens));
  if (n < 1 || n > 128) return InvalidArgument("n must be in [1, 128], got " + std::to_string(n));
  for (const auto& [id, bias] : logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return InvalidArgument("logit_bias token id " + std::to_string(id) + " is out of range " + vocab_range);
    }
    if (!InClosed(bias, -100.0f, 100.0f)) {
      return InvalidArgument("logit_bias value for token " + std::to_string(id) + " must be in [-100, 100], got " +
                             Num(bias));
    }
  }
  for (size_t i = 0; i < stop_token_ids.size(); ++i) {
    const int32_t id = stop_token_ids[i];
    if (id < 0 || id >= vocab_size) {
      return InvalidArgument("stop_token_ids[" + std::to_string(i) + "] = " + std::to_string(id) +
                             " is out of range " + vocab_range);
    }
  }
  if (min_tokens < 0 || min_tokens > max_tokens) {
    return InvalidArgument("min_tokens must be in [0, max_tokens = " + std::to_string(max_tokens) + "], got " +
                           std::to_string(min_tokens));
  }
  if (stop.size() > kMaxStopStrings) {
    return InvalidArgument("stop has " + std::to_string(stop.size()) + " strings; at most " +
                           std::to_string(kMaxStopStrings) + " are allowed");
  }
  for (size_t i = 0; i < stop.size(); ++i) {
    if (stop[i].empty()) return InvalidArgument("stop[" + std::to_string(i) + "] is empty");
    if (stop[i].size() > kMaxStopBytes) {
      return InvalidArgument("stop[" + std::to_string(i) + "] is " + std::to_string(stop[i].size()) +
                             " bytes; at most " + std::to_string(kMaxStopBytes) + " are allowed");
    }
  }
  return Status::Ok();
}

}  // namespace kimirt
