// The OpenAI request schemas the server accepts (/v1/completions, /v1/chat/completions), parsed
// from JSON and validated into plain structs. Unknown fields are tolerated (clients send vendor
// extras); a known field with the wrong type or out of range is an ApiError that names it in
// `param`, e.g. {"param": "top_p", "message": "`top_p` must be in (0, 1], got 1.5"}. JSON null
// counts as absent, as in OpenAI's SDKs. Checks that need the tokenized prompt (empty prompt,
// prompt + max_tokens beyond the context) happen in the handlers.
//
// Ranges follow vLLM's OpenAI server where it extends OpenAI: temperature >= 0 (no upper bound),
// top_k -1/0 = off, min_p, repetition_penalty, ignore_eos, stop_token_ids, min_tokens,
// skip_special_tokens, include_stop_str_in_output, and
// chat_template_kwargs {"thinking": bool, "thinking_effort": "low|medium|high|max"}.
// What kimirt cannot do is refused with a 400 naming the field, never ignored: constrained
// decoding (guided_*, structured_outputs, response_format json_object / json_schema,
// tool_choice "required" or a named function) and beam search.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "kimirt/engine/sampling_params.h"
#include "kimirt/server/errors.h"
#include "kimirt/tokenizer/chat_message.h"

namespace kimirt {

// Requests and responses keep document order (tool schemas reach the prompt as written).
using Json = nlohmann::ordered_json;

struct SchemaLimits {
  std::string served_model_name;  // `model` must equal it (or be absent)
  int32_t vocab_size = 0;         // token ids, logit_bias and stop_token_ids must be below it
  int32_t max_logprobs = 20;      // completions `logprobs`, chat `top_logprobs` (vLLM's default)
  int32_t max_n = 128;            // OpenAI's limit on `n`
  int32_t max_choices = 1024;     // prompts × n of one completions request
};

struct PromptInput {
  bool is_text = true;
  std::string text;           // is_text
  std::vector<int32_t> ids;   // !is_text
};

// Fields both endpoints share. `sampling.n` is the request's n; the handlers submit one engine
// request per choice with n = 1.
struct GenerationOptions {
  SamplingParams sampling;
  bool max_tokens_set = false;  // else completions use 16 (OpenAI), chat the rest of the context
  bool stream = false;
  bool include_usage = false;   // stream_options.include_usage
  // stream_options.continuous_usage_stats (vLLM's): every chunk carries the usage so far, and a
  // step whose tokens decode to no text yet still sends its (empty) chunk, so a client can time
  // every token (bench serve on a model whose tokenizer does not cover its vocabulary).
  bool continuous_usage = false;
  bool include_stop_str_in_output = false;  // vLLM: the matched stop string ends the text
};

struct CompletionRequest {
  std::string model;
  std::vector<PromptInput> prompts;  // one choice group per prompt
  GenerationOptions gen;             // gen.sampling.logprobs = `logprobs` (-1 when absent)
  bool echo = false;
};

struct ChatRequest {
  std::string model;
  std::vector<ChatMessage> messages;
  std::vector<ToolSpec> tools;
  ChatOptions chat;
  GenerationOptions gen;  // gen.sampling.logprobs = top_logprobs when `logprobs` is true, else -1
  bool logprobs = false;
  int32_t top_logprobs = 0;
};

// The body as a JSON object; anything else is a 400.
std::optional<ApiError> ParseJsonBody(std::string_view body, Json* out);
// `model`: absent, or the served model's name (404 model_not_found otherwise). *model gets the name.
std::optional<ApiError> ParseModelName(const Json& body, const SchemaLimits& limits, std::string* model);
std::optional<ApiError> ParseCompletionRequest(const Json& body, const SchemaLimits& limits,
                                               CompletionRequest* out);
std::optional<ApiError> ParseChatRequest(const Json& body, const SchemaLimits& limits, ChatRequest* out);

}  // namespace kimirt
