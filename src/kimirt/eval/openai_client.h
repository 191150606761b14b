// A minimal client for OpenAI-compatible servers: POST /v1/completions and
// /v1/chat/completions (whole or streamed), GET /v1/models and GET /metrics. One client is one
// keep-alive connection, used by one thread at a time (each worker makes its own).
//
// Streaming records when each SSE chunk carrying text arrives, on the steady clock, which is
// what TTFT/ITL are measured from (as vllm-project/vllm:vllm/benchmarks/lib/
// endpoint_request_func.py does). cpp-httplib stays inside openai_client.cpp.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/core/status.h"
#include "kimirt/eval/clock.h"
#include "kimirt/eval/server_url.h"

namespace kimirt::eval {

struct HttpOptions {
  double connect_timeout_s = 10;
  // Longest silence while reading a response (per read, not per request); lm-eval's API models
  // default to 300 s (EleutherAI/lm-evaluation-harness:lm_eval/models/api_models.py).
  double read_timeout_s = 300;
};

// Token counts from the response's `usage` (-1: the server sent none).
struct Usage {
  int64_t prompt_tokens = -1;
  int64_t completion_tokens = -1;
};

struct Completion {
  std::string text;             // choices[0].text, or choices[0].message.content for chat
  bool content_null = false;    // chat content was null (lm-eval substitutes a placeholder)
  std::string finish_reason;
  Usage usage;
};

struct StreamedCompletion {
  std::string text;
  std::string finish_reason;
  Usage usage;
  double start_s = 0;                  // steady-clock seconds when the request was sent
  std::vector<double> token_times_s;   // arrival of each chunk with non-empty text
  double end_s = 0;                    // when the stream ended
  int64_t events = 0;                  // SSE events received, [DONE] included
};

class OpenAiClient {
 public:
  OpenAiClient(ServerUrl url, HttpOptions options);
  ~OpenAiClient();
  OpenAiClient(const OpenAiClient&) = delete;
  OpenAiClient& operator=(const OpenAiClient&) = delete;

  const ServerUrl& url() const { return url_; }

  // POSTs `body` to the API endpoint ("completions" or "chat/completions") and parses the reply.
  Result<Completion> Complete(std::string_view endpoint, const nlohmann::json& body);
  // The same with "stream": true and usage requested (stream_options.include_usage).
  Result<StreamedCompletion> Stream(std::string_view endpoint, nlohmann::json body);
  // GET /v1/models: the model ids the server lists.
  Result<std::vector<std::string>> ListModels();
  // GET of a path beside the API (e.g. "/metrics"): the body of a 200 reply.
  Result<std::string> GetRootText(std::string_view path);

 private:
  struct Impl;
  ServerUrl url_;
  std::unique_ptr<Impl> impl_;
};

// Parsing of one reply body / one stream event, exposed for tests. `chat` picks the
// chat.completion shapes (message / delta) over the text-completion ones.
Result<Completion> ParseCompletionBody(std::string_view body, bool chat);
// Applies one SSE event's data to `out`; sets *done on "[DONE]". `now_s` is its arrival time.
Status ApplyStreamEvent(std::string_view data, bool chat, double now_s, StreamedCompletion* out, bool* done);
// The message of an OpenAI-style error body ({"error": {"message": ...}}), or the body itself
// (shortened) when it is not one.
std::string ErrorBodyMessage(std::string_view body);

}  // namespace kimirt::eval
