// Parsing and validation of OpenAI completion and chat requests (openai_schema.h); the chat
// messages, tools and options are in chat_schema.cpp, the typed field readers in json_fields.cpp.
#include "kimirt/server/openai_schema.h"

#include <charconv>
#include <cmath>
#include <limits>
#include <utility>

#include <nlohmann/json.hpp>

#include "kimirt/server/chat_schema.h"
#include "kimirt/server/json_fields.h"
#include "kimirt/core/json_depth.h"

namespace kimirt {

using namespace json_fields;  // NOLINT: the readers are this file's vocabulary

namespace {

MaybeError ReadStop(const Json& body, std::vector<std::string>* out) {
  const Json* v = Member(body, "stop");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    if (v->get_ref<const std::string&>().size() > SamplingParams::kMaxStopBytes) {
      return InvalidRequest("`stop` is longer than " + std::to_string(SamplingParams::kMaxStopBytes) + " bytes",
                            "stop");
    }
    if (!v->get_ref<const std::string&>().empty()) out->push_back(v->get<std::string>());
    return std::nullopt;
  }
  if (!v->is_array()) return TypeError("stop", "a string or an array of strings", *v);
  if (v->size() > SamplingParams::kMaxStopStrings) {
    return InvalidRequest("`stop` has " + std::to_string(v->size()) + " strings; at most " +
                              std::to_string(SamplingParams::kMaxStopStrings) + " are allowed",
                          "stop");
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& s = (*v)[i];
    const std::string param = Indexed("stop", i);
    if (!s.is_string()) return TypeError(param, "a string", s);
    if (s.get_ref<const std::string&>().size() > SamplingParams::kMaxStopBytes) {
      return InvalidRequest("`" + param + "` is longer than " + std::to_string(SamplingParams::kMaxStopBytes) +
                                " bytes",
                            param);
    }
    // An empty stop string would match before every token; OpenAI ignores it too.
    if (!s.get_ref<const std::string&>().empty()) out->push_back(s.get<std::string>());
  }
  return std::nullopt;
}

MaybeError ReadLogitBias(const Json& body, int32_t vocab, std::vector<std::pair<int32_t, float>>* out) {
  const Json* v = Member(body, "logit_bias");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return TypeError("logit_bias", "an object mapping token ids to numbers", *v);
  for (const auto& [key, bias] : v->items()) {
    const std::string param = "logit_bias";
    int64_t id = -1;
    auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id >= vocab) {
      return InvalidRequest("`logit_bias` key \"" + key + "\" is not a token id in [0, " + std::to_string(vocab) + ")",
                            param);
    }
    if (!bias.is_number()) return TypeError("logit_bias." + key, "a number", bias);
    const double b = bias.get<double>();
    if (!(b >= -100.0 && b <= 100.0)) {
      return InvalidRequest("`logit_bias` values must be in [-100, 100], got " + FormatNumber(b) + " for token " + key,
                            param);
    }
    out->emplace_back(static_cast<int32_t>(id), static_cast<float>(b));
  }
  return std::nullopt;
}

// Sampling, stopping and streaming fields shared by both endpoints.
MaybeError ParseGeneration(const Json& body, const SchemaLimits& limits, bool chat, GenerationOptions* gen) {
  SamplingParams& p = gen->sampling;
  constexpr double kMax = std::numeric_limits<double>::max();
  KIMIRT_RETURN_IF_API_ERROR(ReadFloat(body, "temperature", {0.0, kMax, false, "non-negative"}, &p.temperature));
  KIMIRT_RETURN_IF_API_ERROR(ReadFloat(body, "top_p", {0.0, 1.0, true, "in (0, 1]"}, &p.top_p));
  KIMIRT_RETURN_IF_API_ERROR(ReadInt32(body, "top_k", -1, std::numeric_limits<int32_t>::max(), &p.top_k));
  if (p.top_k < 0) p.top_k = 0;  // -1 and 0 both mean "off" (vLLM)
  KIMIRT_RETURN_IF_API_ERROR(ReadFloat(body, "min_p", {0.0, 1.0, false, "in [0, 1]"}, &p.min_p));
  KIMIRT_RETURN_IF_API_ERROR(
      ReadFloat(body, "presence_penalty", {-2.0, 2.0, false, "in [-2, 2]"}, &p.presence_penalty));
  KIMIRT_RETURN_IF_API_ERROR(
      ReadFloat(body, "frequency_penalty", {-2.0, 2.0, false, "in [-2, 2]"}, &p.frequency_penalty));
  KIMIRT_RETURN_IF_API_ERROR(
      ReadFloat(body, "repetition_penalty", {0.0, kMax, true, "positive"}, &p.repetition_penalty));
  if (const Json* seed = Member(body, "seed")) {
    // OpenAI's seed is any 64-bit integer; negative ones wrap to the same uint64 bits.
    if (seed->is_number_unsigned()) {
      p.seed = seed->get<uint64_t>();
    } else {
      int64_t s = 0;
      KIMIRT_RETURN_IF_API_ERROR(AsInt(*seed, "seed", std::numeric_limits<int64_t>::min(),
                                       std::numeric_limits<int64_t>::max(), &s));
      p.seed = static_cast<uint64_t>(s);
    }
  }
  KIMIRT_RETURN_IF_API_ERROR(ReadLogitBias(body, limits.vocab_size, &p.logit_bias));
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "ignore_eos", &p.ignore_eos));
  KIMIRT_RETURN_IF_API_ERROR(ReadStop(body, &p.stop));
  if (const Json* ids = Member(body, "stop_token_ids")) {
    if (!ids->is_array()) return TypeError("stop_token_ids", "an array of token ids", *ids);
    for (size_t i = 0; i < ids->size(); ++i) {
      int32_t id = 0;
      KIMIRT_RETURN_IF_API_ERROR(TokenId((*ids)[i], "stop_token_ids", limits.vocab_size, &id));
      p.stop_token_ids.push_back(id);
    }
  }

  KIMIRT_RETURN_IF_API_ERROR(ReadInt32(body, "n", 1, limits.max_n, &p.n));
  if (const Json* best_of = Member(body, "best_of")) {
    int64_t b = 0;
    KIMIRT_RETURN_IF_API_ERROR(AsInt(*best_of, "best_of", 1, limits.max_n, &b));
    if (b != p.n) return InvalidRequest("`best_of` other than `n` is not supported", "best_of");
  }
  constexpr int64_t kMaxTokens = std::numeric_limits<int32_t>::max();
  KIMIRT_RETURN_IF_API_ERROR(ReadInt32(body, "max_tokens", 1, kMaxTokens, &p.max_tokens, &gen->max_tokens_set));
  if (chat) {
    // The newer OpenAI name; it wins when both are sent, as in OpenAI's API.
    KIMIRT_RETURN_IF_API_ERROR(
        ReadInt32(body, "max_completion_tokens", 1, kMaxTokens, &p.max_tokens, &gen->max_tokens_set));
  }

  KIMIRT_RETURN_IF_API_ERROR(ReadInt32(body, "min_tokens", 0, kMaxTokens, &p.min_tokens));
  // Completions default max_tokens to 16 here; chat's default (the rest of the context) is
  // checked by the chat handler once the prompt is known.
  if ((gen->max_tokens_set || !chat) && p.min_tokens > p.max_tokens) {
    return InvalidRequest("`min_tokens` (" + std::to_string(p.min_tokens) + ") must not exceed `max_tokens` (" +
                              std::to_string(p.max_tokens) + ")",
                          "min_tokens");
  }
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "skip_special_tokens", &p.skip_special_tokens));
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "include_stop_str_in_output", &gen->include_stop_str_in_output));

  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "stream", &gen->stream));
  if (const Json* so = Member(body, "stream_options")) {
    if (!so->is_object()) return TypeError("stream_options", "an object", *so);
    if (!gen->stream) return InvalidRequest("`stream_options` is only allowed with `stream: true`", "stream_options");
    KIMIRT_RETURN_IF_API_ERROR(ReadBool(*so, "include_usage", &gen->include_usage, "stream_options."));
    KIMIRT_RETURN_IF_API_ERROR(
        ReadBool(*so, "continuous_usage_stats", &gen->continuous_usage, "stream_options."));
  }
  return std::nullopt;
}


MaybeError ParsePrompts(const Json& body, int32_t vocab, std::vector<PromptInput>* out) {
  const Json* v = Member(body, "prompt");
  if (v == nullptr) return InvalidRequest("`prompt` is required", "prompt");
  if (v->is_string()) {
    out->push_back({true, v->get<std::string>(), {}});
    return std::nullopt;
  }
  constexpr std::string_view kShapes =
      "a string, an array of strings, an array of token ids or an array of token id arrays";
  if (!v->is_array()) return TypeError("prompt", kShapes, *v);
  if (v->empty()) return InvalidRequest("`prompt` must not be empty", "prompt");
  const Json& first = v->front();
  if (first.is_number()) {  // one prompt as token ids
    PromptInput p{false, {}, {}};
    for (size_t i = 0; i < v->size(); ++i) {
      int32_t id = 0;
      KIMIRT_RETURN_IF_API_ERROR(TokenId((*v)[i], Indexed("prompt", i), vocab, &id));
      p.ids.push_back(id);
    }
    out->push_back(std::move(p));
    return std::nullopt;
  }
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& item = (*v)[i];
    const std::string param = Indexed("prompt", i);
    if (first.is_string()) {
      if (!item.is_string()) return TypeError(param, "a string (like prompt[0])", item);
      out->push_back({true, item.get<std::string>(), {}});
    } else if (first.is_array()) {
      if (!item.is_array()) return TypeError(param, "an array of token ids (like prompt[0])", item);
      PromptInput p{false, {}, {}};
      for (size_t j = 0; j < item.size(); ++j) {
        int32_t id = 0;
        KIMIRT_RETURN_IF_API_ERROR(TokenId(item[j], Indexed(param, j), vocab, &id));
        p.ids.push_back(id);
      }
      out->push_back(std::move(p));
    } else {
      return TypeError(param, kShapes, item);
    }
  }
  return std::nullopt;
}

// Features kimirt does not have. Each is a 400 naming its field: a client that asked for JSON
// output or beam search must not silently get free text or sampling.
MaybeError RefuseUnsupported(const Json& body) {
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "guided_whitespace_pattern", "guided_decoding_backend", "structured_outputs"}) {
    if (Member(body, name) != nullptr) {
      return InvalidRequest(std::string("`") + name + "` is not supported: kimirt has no constrained (guided) decoding",
                            name);
    }
  }
  bool beam = false;
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "use_beam_search", &beam));
  if (beam) return InvalidRequest("`use_beam_search` is not supported: kimirt samples", "use_beam_search");
  if (const Json* rf = Member(body, "response_format")) {
    if (!rf->is_object()) return TypeError("response_format", "an object", *rf);
    std::string type = "text";
    KIMIRT_RETURN_IF_API_ERROR(ReadString(*rf, "type", &type, "response_format."));
    if (type == "json_object" || type == "json_schema") {
      return InvalidRequest("`response_format` \"" + type +
                                "\" is not supported: kimirt has no constrained decoding to enforce it; use \"text\"",
                            "response_format");
    }
    if (type != "text") {
      return InvalidRequest("`response_format.type` must be text, json_object or json_schema, got \"" + type + "\"",
                            "response_format.type");
    }
  }
  return std::nullopt;
}

// Deeper than any real request; refused before parsing because dumping (tools, arguments) and
// the chat renderers recurse, and a hostile 8 MiB body of '[' must not exhaust the stack.
constexpr int kMaxJsonDepth = 128;

bool NestingWithinLimit(std::string_view text) { return JsonNestingWithin(text, kMaxJsonDepth); }

}  // namespace

std::optional<ApiError> ParseModelName(const Json& body, const SchemaLimits& limits, std::string* model) {
  *model = limits.served_model_name;
  const Json* v = Member(body, "model");
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return TypeError("model", "a string", *v);
  const std::string name = v->get<std::string>();
  if (name != limits.served_model_name) {
    return ApiError{ApiErrorKind::kModelNotFound,
                    "The model `" + name + "` does not exist. This server serves `" +
                        limits.served_model_name + "` (GET /v1/models).",
                    "model", {}};
  }
  return std::nullopt;
}

std::optional<ApiError> ParseJsonBody(std::string_view body, Json* out) {
  if (!NestingWithinLimit(body)) {
    return InvalidRequest("The request body nests JSON deeper than " + std::to_string(kMaxJsonDepth) + " levels");
  }
  *out = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return InvalidRequest("The request body is not valid JSON");
  if (!out->is_object()) return InvalidRequest(std::string("The request body must be a JSON object, got ") + out->type_name());
  return std::nullopt;
}

std::optional<ApiError> ParseCompletionRequest(const Json& body, const SchemaLimits& limits, CompletionRequest* out) {
  KIMIRT_RETURN_IF_API_ERROR(ParseModelName(body, limits, &out->model));
  KIMIRT_RETURN_IF_API_ERROR(ParsePrompts(body, limits.vocab_size, &out->prompts));
  KIMIRT_RETURN_IF_API_ERROR(RefuseUnsupported(body));
  KIMIRT_RETURN_IF_API_ERROR(ParseGeneration(body, limits, /*chat=*/false, &out->gen));
  KIMIRT_RETURN_IF_API_ERROR(ReadInt32(body, "logprobs", 0, limits.max_logprobs, &out->gen.sampling.logprobs));
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "echo", &out->echo));
  if (const Json* suffix = Member(body, "suffix")) {
    if (!suffix->is_string()) return TypeError("suffix", "a string", *suffix);
    if (!suffix->get_ref<const std::string&>().empty()) return InvalidRequest("`suffix` is not supported", "suffix");
  }
  const int64_t choices = static_cast<int64_t>(out->prompts.size()) * out->gen.sampling.n;
  if (choices > limits.max_choices) {
    return InvalidRequest("prompts × n = " + std::to_string(choices) + " choices; at most " +
                              std::to_string(limits.max_choices) + " per request",
                          "n");
  }
  return std::nullopt;
}

std::optional<ApiError> ParseChatRequest(const Json& body, const SchemaLimits& limits, ChatRequest* out) {
  KIMIRT_RETURN_IF_API_ERROR(ParseModelName(body, limits, &out->model));
  KIMIRT_RETURN_IF_API_ERROR(ParseChatMessages(body, &out->messages));
  KIMIRT_RETURN_IF_API_ERROR(ParseChatTools(body, &out->tools));
  KIMIRT_RETURN_IF_API_ERROR(RefuseUnsupported(body));
  KIMIRT_RETURN_IF_API_ERROR(ParseChatOptions(body, &out->chat));
  KIMIRT_RETURN_IF_API_ERROR(ParseGeneration(body, limits, /*chat=*/true, &out->gen));
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "logprobs", &out->logprobs));
  bool top_set = false;
  KIMIRT_RETURN_IF_API_ERROR(ReadInt32(body, "top_logprobs", 0, limits.max_logprobs, &out->top_logprobs, &top_set));
  if (top_set && !out->logprobs && out->top_logprobs > 0) {
    return InvalidRequest("`top_logprobs` needs `logprobs: true`", "top_logprobs");
  }
  out->gen.sampling.logprobs = out->logprobs ? out->top_logprobs : -1;
  return std::nullopt;
}

}  // namespace kimirt
