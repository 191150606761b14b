// What the OpenAI endpoint handlers share: the engine, the tokenizer, limits, metrics and the
// shutdown flag, plus the small helpers every handler uses (error/JSON responses, per-choice
// sampling params, the context-length check, finish reasons).
#pragma once

#include <atomic>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/engine/engine.h"
#include "kimirt/server/chat_format.h"
#include "kimirt/server/errors.h"
#include "kimirt/server/generation_job.h"
#include "kimirt/server/http_server.h"
#include "kimirt/server/metrics.h"
#include "kimirt/server/openai_schema.h"

namespace kimirt {

class Tokenizer;

// Seeds for requests that set none. vLLM semantics: every such request samples afresh (two
// unseeded n = 2 requests differ), yet a server started with --seed replays the same sequence of
// seeds, request after request, so a run is reproducible. Without a base the OS's entropy picks one.
class RequestSeeds {
 public:
  explicit RequestSeeds(std::optional<uint64_t> base);
  uint64_t Next();

 private:
  uint64_t base_;
  std::atomic<uint64_t> drawn_{0};
};

struct ServingContext {
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ChatFormat format = ChatFormat::kK3;
  RequestSeeds* seeds = nullptr;
  Json default_chat_template_kwargs = Json::object();  // --default-chat-template-kwargs; requests override
  ServerMetrics* metrics = nullptr;
  JobRegistry* jobs = nullptr;
  SchemaLimits limits;
  int64_t max_model_len = 0;  // prompt + completion; 0: unknown (the engine still enforces its own)
  const std::atomic<bool>* shutting_down = nullptr;

  bool stopping() const { return shutting_down != nullptr && shutting_down->load(); }
};

HttpResponse ErrorResponse(const ApiError& error);
HttpResponse JsonResponse(const Json& body, int status = 200);

// "cmpl-3f9a…", unique per process (a random start and a counter); engine request ids append
// "-<choice>".
std::string NewRequestId(std::string_view prefix);
int64_t UnixSeconds();

// The engine requests for one prompt's n choices: n = 1 each. Choice i samples with seed + i
// (the request's seed, else `unseeded`, a fresh RequestSeeds draw), as vLLM seeds a request's
// children, so the choices differ and each stays reproducible.
std::vector<SamplingParams> ChoiceParams(const SamplingParams& request, uint64_t unseeded);

// prompt + max_tokens must fit the context (OpenAI's code "context_length_exceeded").
std::optional<ApiError> CheckContextLength(int64_t prompt_tokens, int64_t max_tokens, int64_t max_model_len,
                                           std::string_view prompt_param);

// "stop" / "length"; kAbort and kError are failures, see FailureOf.
std::string_view OpenAiFinishReason(FinishReason reason);
// The error a final event stands for, or nullopt for a normal finish (kStop, kLength).
std::optional<ApiError> FailureOf(const RequestOutput& final_event, bool shutting_down);
// What a non-streamed request whose client hung up is answered with (for the log and metrics).
ApiError ClientClosed();

}  // namespace kimirt
