// Helpers shared by the OpenAI handlers (serving_context.h).
#include "kimirt/server/serving_context.h"

#include <chrono>
#include <cstdio>
#include <random>

#include <nlohmann/json.hpp>

#include "kimirt/core/random.h"

namespace kimirt {

HttpResponse ErrorResponse(const ApiError& error) {
  ErrorReply reply = RenderError(error);
  HttpResponse r;
  r.status = reply.http_status;
  r.body = std::move(reply.body);
  return r;
}

HttpResponse JsonResponse(const Json& body, int status) {
  HttpResponse r;
  r.status = status;
  // `replace`: generated text is UTF-8 by construction, but a tokenizer bug must cost a U+FFFD,
  // not an exception in the middle of a response.
  r.body = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  return r;
}

std::string NewRequestId(std::string_view prefix) {
  static const uint64_t kStart = [] {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }();
  static std::atomic<uint64_t> counter{0};
  char buf[40];
  std::snprintf(buf, sizeof(buf), "%016llx%08llx", static_cast<unsigned long long>(kStart),
                static_cast<unsigned long long>(counter.fetch_add(1) & 0xffffffffu));
  return std::string(prefix) + "-" + buf;
}

int64_t UnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

RequestSeeds::RequestSeeds(std::optional<uint64_t> base) {
  if (base) {
    base_ = *base;
  } else {
    std::random_device rd;
    base_ = (static_cast<uint64_t>(rd()) << 32) ^ rd();
  }
}

uint64_t RequestSeeds::Next() {
  // SplitMix64 of (base, draw number): consecutive draws are unrelated, and seed + i of a
  // request's choices does not run into the next request's seed.
  return SplitMix64(base_ ^ (0xA0761D6478BD642Full * (drawn_.fetch_add(1) + 1))).Next();
}

std::vector<SamplingParams> ChoiceParams(const SamplingParams& request, uint64_t unseeded) {
  const int32_t n = request.n < 1 ? 1 : request.n;
  std::vector<SamplingParams> out(static_cast<size_t>(n), request);
  for (int32_t i = 0; i < n; ++i) {
    out[i].n = 1;
    out[i].seed = request.seed.value_or(unseeded) + static_cast<uint64_t>(i);
  }
  return out;
}

std::optional<ApiError> CheckContextLength(int64_t prompt_tokens, int64_t max_tokens, int64_t max_model_len,
                                           std::string_view prompt_param) {
  if (max_model_len <= 0 || prompt_tokens + max_tokens <= max_model_len) return std::nullopt;
  ApiError e = InvalidRequest(
      "This model's maximum context length is " + std::to_string(max_model_len) + " tokens. However, you requested " +
          std::to_string(prompt_tokens + max_tokens) + " tokens (" + std::to_string(prompt_tokens) + " in the " +
          std::string(prompt_param) + ", " + std::to_string(max_tokens) +
          " for the completion). Please reduce the length of the " + std::string(prompt_param) + " or max_tokens.",
      prompt_tokens >= max_model_len ? std::string(prompt_param) : std::string("max_tokens"));
  e.code = "context_length_exceeded";
  return e;
}

std::string_view OpenAiFinishReason(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "stop";
}

std::optional<ApiError> FailureOf(const RequestOutput& final_event, bool shutting_down) {
  switch (final_event.finish) {
    case FinishReason::kAbort:
      if (shutting_down) return ApiError{ApiErrorKind::kShuttingDown, "The server is shutting down", {}, {}};
      return ApiError{ApiErrorKind::kInternal, "The request was aborted", {}, {}};
    case FinishReason::kError: {
      const Status& s = final_event.error;
      return ApiErrorFromStatus(s.ok() ? Internal("the engine failed the request") : s, shutting_down);
    }
    default:
      return std::nullopt;
  }
}

ApiError ClientClosed() {
  return {ApiErrorKind::kClientClosed, "The client closed the connection before the answer was ready", {}, {}};
}

}  // namespace kimirt
