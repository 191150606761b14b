// POST /v1/chat/completions (chat_handler.h).
#include "kimirt/server/chat_handler.h"

#include <algorithm>
#include <cctype>
#include <climits>
#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "kimirt/server/job_stream.h"
#include "kimirt/server/logprobs_format.h"
#include "kimirt/server/sse.h"
#include "kimirt/tokenizer/chat_renderer.h"
#include "kimirt/tokenizer/kimi_linear_chat.h"
#include "kimirt/tokenizer/output_parser.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

// Used only when the context length is unknown (a library caller that set none).
constexpr int32_t kDefaultChatMaxTokens = 4096;

// Splits one choice's generated text into channels: K3's parser, or plain content.
class AssistantParser {
 public:
  // `tools_allowed` false (tool_choice "none"): calls the model makes anyway are dropped, so
  // the client never receives a call it ruled out.
  AssistantParser(ChatFormat format, K3ParseStart start, std::string call_id_prefix, bool tools_allowed)
      : tools_allowed_(tools_allowed) {
    if (format == ChatFormat::kK3) k3_.emplace(start, std::move(call_id_prefix));
  }
  K3ParseDelta Feed(std::string_view text) {
    if (k3_) return Filter(k3_->Feed(text));
    K3ParseDelta d;
    d.content = std::string(text);
    return d;
  }
  K3ParseDelta Finish() { return k3_ ? Filter(k3_->Finish()) : K3ParseDelta{}; }

 private:
  K3ParseDelta Filter(K3ParseDelta d) const {
    if (!tools_allowed_) d.tool_calls.clear();
    return d;
  }

  std::optional<K3CompletionParser> k3_;
  bool tools_allowed_ = true;
};

void Append(K3ParseDelta* into, K3ParseDelta more) {
  into->reasoning += more.reasoning;
  into->content += more.content;
  for (K3ParsedToolCall& c : more.tool_calls) into->tool_calls.push_back(std::move(c));
}

Json ToolCallJson(const K3ParsedToolCall& call) {
  return {{"id", call.id},
          {"type", "function"},
          {"function", {{"name", call.name}, {"arguments", call.arguments}}}};
}

struct Choice {
  explicit Choice(AssistantParser p) : parser(std::move(p)) {}
  AssistantParser parser;
  K3ParseDelta message;  // everything parsed so far (non-streaming)
  std::vector<SampleResult> samples;
  size_t tool_calls = 0;
  FinishReason finish = FinishReason::kNone;
  int64_t completion_tokens = 0;
};

struct Chat {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool logprobs = false;
  int32_t top_logprobs = 0;
  bool include_usage = false;
  bool continuous_usage = false;
  int64_t prompt_tokens = 0;
  std::vector<Choice> choices;

  Json Header(std::string_view object) const {
    Json j = Json::object();
    j["id"] = id;
    j["object"] = object;
    j["created"] = created;
    j["model"] = model;
    return j;
  }
  Json Usage() const {
    int64_t completion = 0;
    for (const Choice& c : choices) completion += c.completion_tokens;
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion},
            {"total_tokens", prompt_tokens + completion}};
  }
  std::string_view FinishReasonOf(const Choice& c) const {
    if (c.finish == FinishReason::kStop && c.tool_calls > 0) return "tool_calls";
    return OpenAiFinishReason(c.finish);
  }
  std::string Chunk(size_t index, Json delta, Json logprobs_json, std::optional<std::string_view> finish) const {
    Json choice = Json::object();
    choice["index"] = index;
    choice["delta"] = std::move(delta);
    choice["logprobs"] = std::move(logprobs_json);
    choice["finish_reason"] = finish ? Json(*finish) : Json(nullptr);
    Json chunk = Header("chat.completion.chunk");
    chunk["choices"] = Json::array({std::move(choice)});
    if (continuous_usage) {
      chunk["usage"] = Usage();
    } else if (include_usage) {
      chunk["usage"] = nullptr;
    }
    return SseEvent(chunk.dump(-1, ' ', false, Json::error_handler_t::replace));
  }
};

class ChatStream : public JobStream {
 public:
  ChatStream(Chat chat, std::unique_ptr<GenerationJob> job, const ServingContext& ctx)
      : JobStream(std::move(job)), c_(std::move(chat)), ctx_(ctx) {}

 private:
  void Preamble(std::string* out) override {
    for (size_t i = 0; i < c_.choices.size(); ++i) {
      *out += c_.Chunk(i, {{"role", "assistant"}, {"content", ""}}, nullptr, std::nullopt);
    }
  }

  void Tail(std::string* out) override {
    if (c_.include_usage) *out += UsageEvent(c_.Header("chat.completion.chunk"), c_.Usage());
  }

  void OnEvent(const JobEvent& ev, std::string* out) override {
    Choice& ch = c_.choices[ev.choice];
    const RequestOutput& o = ev.output;
    ch.completion_tokens = o.completion_tokens;
    if (std::optional<ApiError> failure = FailureOf(o, ctx_.stopping())) {
      ch.finish = o.finish;
      *out += SseEvent(RenderError(*failure).body);
      return;
    }
    K3ParseDelta d = ch.parser.Feed(o.text);
    if (o.finish != FinishReason::kNone) Append(&d, ch.parser.Finish());
    Json delta = Json::object();
    if (!d.reasoning.empty()) delta["reasoning_content"] = d.reasoning;
    if (!d.content.empty()) delta["content"] = d.content;
    if (!d.tool_calls.empty()) {
      Json calls = Json::array();
      for (const K3ParsedToolCall& call : d.tool_calls) {
        Json j = ToolCallJson(call);
        j["index"] = ch.tool_calls++;
        calls.push_back(std::move(j));
      }
      delta["tool_calls"] = std::move(calls);
    }
    Json lp = nullptr;
    if (c_.logprobs && !o.logprobs.empty()) {
      lp = {{"content", ChatLogprobsContent(*ctx_.tokenizer, o.logprobs, c_.top_logprobs)}};
    }
    const bool new_tokens = c_.continuous_usage && !o.token_ids.empty();
    if (!delta.empty() || !lp.is_null() || new_tokens) {
      *out += c_.Chunk(ev.choice, std::move(delta), std::move(lp), std::nullopt);
    }
    if (o.finish != FinishReason::kNone) {
      ch.finish = o.finish;
      *out += c_.Chunk(ev.choice, Json::object(), nullptr, c_.FinishReasonOf(ch));
    }
  }

  Chat c_;
  const ServingContext& ctx_;
};

HttpResponse RespondWhenDone(Chat& c, GenerationJob& job, const ServingContext& ctx, const HttpRequest& request) {
  std::optional<ApiError> failure;
  const bool answered = CollectUnlessClientGone(job, request.client_gone, [&](JobEvent& ev) {
    Choice& ch = c.choices[ev.choice];
    RequestOutput& o = ev.output;
    ch.completion_tokens = o.completion_tokens;
    Append(&ch.message, ch.parser.Feed(o.text));
    for (SampleResult& s : o.logprobs) ch.samples.push_back(std::move(s));
    if (o.finish != FinishReason::kNone) {
      ch.finish = o.finish;
      Append(&ch.message, ch.parser.Finish());
      ch.tool_calls = ch.message.tool_calls.size();
    }
    if (!failure) failure = FailureOf(o, ctx.stopping());
  });
  if (!answered) return ErrorResponse(ClientClosed());
  if (failure) return ErrorResponse(*failure);
  Json body = c.Header("chat.completion");
  Json choices = Json::array();
  for (size_t i = 0; i < c.choices.size(); ++i) {
    const Choice& ch = c.choices[i];
    Json message = Json::object();
    message["role"] = "assistant";
    // OpenAI sends null content when the turn is only tool calls.
    message["content"] = ch.message.content.empty() && !ch.message.tool_calls.empty() ? Json(nullptr)
                                                                                      : Json(ch.message.content);
    message["reasoning_content"] = ch.message.reasoning.empty() ? Json(nullptr) : Json(ch.message.reasoning);
    if (!ch.message.tool_calls.empty()) {
      Json calls = Json::array();
      for (const K3ParsedToolCall& call : ch.message.tool_calls) calls.push_back(ToolCallJson(call));
      message["tool_calls"] = std::move(calls);
    }
    Json choice = Json::object();
    choice["index"] = i;
    choice["message"] = std::move(message);
    choice["logprobs"] = c.logprobs ? Json{{"content", ChatLogprobsContent(*ctx.tokenizer, ch.samples, c.top_logprobs)}}
                                    : Json(nullptr);
    choice["finish_reason"] = c.FinishReasonOf(ch);
    choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(choices);
  body["usage"] = c.Usage();
  return JsonResponse(body);
}

// A renderer error names the field first ("messages[3].tool_calls[0].arguments: …"); that
// field is the OpenAI `param`.
std::string ParamOf(const std::string& message) {
  const size_t colon = message.find(": ");
  if (colon == std::string::npos || colon == 0) return "messages";
  for (size_t i = 0; i < colon; ++i) {
    const char ch = message[i];
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '.' || ch == '[' || ch == ']')) {
      return "messages";
    }
  }
  return message.substr(0, colon);
}

}  // namespace

std::optional<ApiError> ParseChatBody(const ServingContext& ctx, std::string_view text, ChatRequest* req) {
  Json body;
  if (auto e = ParseJsonBody(text, &body)) return e;
  if (!ctx.default_chat_template_kwargs.empty()) {
    // --default-chat-template-kwargs, then the request's own keys on top (vLLM).
    const auto it = body.find("chat_template_kwargs");
    if (it == body.end() || it->is_null() || it->is_object()) {
      Json kwargs = ctx.default_chat_template_kwargs;
      if (it != body.end() && it->is_object()) {
        for (const auto& [key, value] : it->items()) kwargs[key] = value;
      }
      body["chat_template_kwargs"] = std::move(kwargs);
    }
  }
  return ParseChatRequest(body, ctx.limits, req);
}

std::optional<ApiError> EncodeChatPrompt(const ServingContext& ctx, const ChatRequest& req, std::vector<int32_t>* ids) {
  Result<std::vector<ChatSegment>> segments =
      ctx.format == ChatFormat::kK3 ? RenderK3Chat(req.messages, req.tools, req.chat)
                                    : RenderKimiLinearChat(req.messages, req.tools, req.chat);
  if (!segments.ok()) return ApiErrorFromStatus(segments.status(), false, ParamOf(segments.status().message()));
  Result<std::vector<int32_t>> encoded = EncodeSegments(*ctx.tokenizer, *segments);
  if (!encoded.ok()) {
    // The prompt is valid; the served tokenizer lacks a marker of its chat format.
    return ApiError{ApiErrorKind::kInternal, encoded.status().message(), {}, {}};
  }
  *ids = std::move(*encoded);
  return std::nullopt;
}

HttpResponse HandleChatCompletions(const ServingContext& ctx, const HttpRequest& request) {
  if (ctx.stopping()) return ErrorResponse({ApiErrorKind::kShuttingDown, "The server is shutting down", {}, {}});
  ChatRequest req;
  if (auto e = ParseChatBody(ctx, request.body, &req)) return ErrorResponse(*e);
  std::vector<int32_t> prompt;
  if (auto e = EncodeChatPrompt(ctx, req, &prompt)) return ErrorResponse(*e);
  const int64_t prompt_tokens = static_cast<int64_t>(prompt.size());

  SamplingParams& sp = req.gen.sampling;
  if (!req.gen.max_tokens_set) {
    const int64_t room = ctx.max_model_len - prompt_tokens;
    sp.max_tokens = ctx.max_model_len <= 0 ? kDefaultChatMaxTokens
                                           : static_cast<int32_t>(std::clamp<int64_t>(room, 1, INT32_MAX));
  }
  if (auto e = CheckContextLength(prompt_tokens, sp.max_tokens, ctx.max_model_len, "messages")) {
    return ErrorResponse(*e);
  }
  if (sp.min_tokens > sp.max_tokens) {
    return ErrorResponse(InvalidRequest("`min_tokens` (" + std::to_string(sp.min_tokens) +
                                            ") exceeds the room left for the completion (" +
                                            std::to_string(sp.max_tokens) + " tokens)",
                                        "min_tokens"));
  }

  Chat c;
  c.id = NewRequestId("chatcmpl");
  c.created = UnixSeconds();
  c.model = req.model;
  c.logprobs = req.logprobs;
  c.top_logprobs = req.top_logprobs;
  c.include_usage = req.gen.include_usage;
  c.continuous_usage = req.gen.continuous_usage;
  c.prompt_tokens = prompt_tokens;
  // Call ids must not repeat across turns of a conversation: the K3 renderer pairs tool results
  // with their calls by id. The request id's random tail makes them unique enough.
  const std::string call_prefix = "call_" + c.id.substr(c.id.size() - 8) + "_";
  const K3ParseStart start = K3ParseStartFor(req.chat);
  std::vector<JobChoice> job_choices;
  const bool tools_allowed = req.chat.tool_choice != ToolChoice::kNone;
  for (const SamplingParams& p : ChoiceParams(sp, ctx.seeds->Next())) {
    c.choices.emplace_back(
        AssistantParser(ctx.format, start, call_prefix + std::to_string(c.choices.size()) + "_", tools_allowed));
    job_choices.push_back({prompt, p, req.gen.include_stop_str_in_output});
  }

  auto job = std::make_unique<GenerationJob>(*ctx.engine, c.id, ctx.metrics, ctx.jobs);
  if (Status s = job->Submit(std::move(job_choices)); !s.ok()) {
    return ErrorResponse(ApiErrorFromStatus(s, ctx.stopping()));
  }
  if (!req.gen.stream) return RespondWhenDone(c, *job, ctx, request);
  HttpResponse r;
  r.content_type = std::string(kSseContentType);
  r.stream = std::make_shared<ChatStream>(std::move(c), std::move(job), ctx);
  return r;
}

}  // namespace kimirt
