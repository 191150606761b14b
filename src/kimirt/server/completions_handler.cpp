// POST /v1/completions (completions_handler.h).
#include "kimirt/server/completions_handler.h"

#include <optional>
#include <utility>

#include <nlohmann/json.hpp>

#include "kimirt/server/job_stream.h"
#include "kimirt/server/logprobs_format.h"
#include "kimirt/server/sse.h"
#include "kimirt/tokenizer/detokenizer.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

struct Prompt {
  std::vector<int32_t> ids;
  std::string text;  // as sent, or the decoded ids
};

struct Choice {
  size_t prompt = 0;
  std::string text;                       // generated so far (non-streaming)
  std::optional<LegacyLogprobs> logprobs;
  bool echoed = false;  // the choice's first event was seen: prompt logprobs listed, echo sent
  FinishReason finish = FinishReason::kNone;
  int64_t completion_tokens = 0;
};

// Everything one completions request needs after validation.
struct Completion {
  std::string id;
  int64_t created = 0;
  std::string model;
  bool echo = false;
  bool logprobs = false;
  bool include_usage = false;
  bool continuous_usage = false;
  std::vector<Prompt> prompts;
  std::vector<Choice> choices;

  Json Chunk(size_t index, std::string text, Json logprobs_json, std::optional<FinishReason> finish) const {
    Json choice = Json::object();
    choice["index"] = index;
    choice["text"] = std::move(text);
    choice["logprobs"] = std::move(logprobs_json);
    choice["finish_reason"] = finish ? Json(OpenAiFinishReason(*finish)) : Json(nullptr);
    Json chunk = Header("text_completion");
    chunk["choices"] = Json::array({std::move(choice)});
    if (continuous_usage) {
      chunk["usage"] = Usage();
    } else if (include_usage) {
      chunk["usage"] = nullptr;  // OpenAI: null on all but the last chunk
    }
    return chunk;
  }

  Json Header(std::string_view object) const {
    Json j = Json::object();
    j["id"] = id;
    j["object"] = object;
    j["created"] = created;
    j["model"] = model;
    return j;
  }

  // Echo with logprobs, on a choice's first event (which carries the engine's prompt
  // logprobs): the prompt's first token has nothing to be scored by; the rest are scored.
  void AddPromptLogprobs(Choice* ch, const RequestOutput& o) const {
    ch->echoed = true;
    if (!echo || !ch->logprobs) return;
    ch->logprobs->AddPromptToken(prompts[ch->prompt].ids.front());
    for (const SampleResult& s : o.prompt_logprobs) ch->logprobs->AddPromptToken(s);
  }

  Json Usage() const {
    int64_t prompt_tokens = 0, completion_tokens = 0;
    for (const Prompt& p : prompts) prompt_tokens += static_cast<int64_t>(p.ids.size());
    for (const Choice& c : choices) completion_tokens += c.completion_tokens;
    return {{"prompt_tokens", prompt_tokens},
            {"completion_tokens", completion_tokens},
            {"total_tokens", prompt_tokens + completion_tokens}};
  }
};

class CompletionStream : public JobStream {
 public:
  CompletionStream(Completion completion, std::unique_ptr<GenerationJob> job, const ServingContext& ctx)
      : JobStream(std::move(job)), c_(std::move(completion)), ctx_(ctx) {}

 private:
  void Tail(std::string* out) override {
    if (c_.include_usage) *out += UsageEvent(c_.Header("text_completion"), c_.Usage());
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
    if (c_.echo && !ch.echoed) {
      // The prompt's own chunk, once its logprobs (which come with the first token) are known.
      c_.AddPromptLogprobs(&ch, o);
      Json lp = ch.logprobs ? ch.logprobs->TakeJson() : Json(nullptr);
      *out += SseEvent(c_.Chunk(ev.choice, c_.prompts[ch.prompt].text, std::move(lp), std::nullopt)
                           .dump(-1, ' ', false, Json::error_handler_t::replace));
    }
    Json lp = nullptr;
    if (ch.logprobs && !o.logprobs.empty()) {
      for (const SampleResult& s : o.logprobs) ch.logprobs->AddSampled(s);
      lp = ch.logprobs->TakeJson();
    }
    const bool new_tokens = c_.continuous_usage && !o.token_ids.empty();
    if (o.text.empty() && lp.is_null() && o.finish == FinishReason::kNone && !new_tokens) return;
    std::optional<FinishReason> finish;
    if (o.finish != FinishReason::kNone) finish = ch.finish = o.finish;
    *out += SseEvent(c_.Chunk(ev.choice, o.text, std::move(lp), finish).dump(-1, ' ', false,
                                                                             Json::error_handler_t::replace));
  }

  Completion c_;
  const ServingContext& ctx_;
};

HttpResponse RespondWhenDone(Completion& c, GenerationJob& job, const ServingContext& ctx,
                             const HttpRequest& request) {
  std::optional<ApiError> failure;
  const bool answered = CollectUnlessClientGone(job, request.client_gone, [&](const JobEvent& ev) {
    Choice& ch = c.choices[ev.choice];
    const RequestOutput& o = ev.output;
    ch.text += o.text;
    ch.completion_tokens = o.completion_tokens;
    if (!ch.echoed) c.AddPromptLogprobs(&ch, o);
    if (ch.logprobs) {
      for (const SampleResult& s : o.logprobs) ch.logprobs->AddSampled(s);
    }
    if (o.finish != FinishReason::kNone) ch.finish = o.finish;
    if (!failure) failure = FailureOf(o, ctx.stopping());
  });
  if (!answered) return ErrorResponse(ClientClosed());
  if (failure) return ErrorResponse(*failure);
  Json body = c.Header("text_completion");
  Json choices = Json::array();
  for (size_t i = 0; i < c.choices.size(); ++i) {
    Choice& ch = c.choices[i];
    Json choice = Json::object();
    choice["index"] = i;
    choice["text"] = c.echo ? c.prompts[ch.prompt].text + ch.text : ch.text;
    choice["logprobs"] = ch.logprobs ? ch.logprobs->TakeJson() : Json(nullptr);
    choice["finish_reason"] = OpenAiFinishReason(ch.finish);
    choices.push_back(std::move(choice));
  }
  body["choices"] = std::move(choices);
  body["usage"] = c.Usage();
  return JsonResponse(body);
}

}  // namespace

HttpResponse HandleCompletions(const ServingContext& ctx, const HttpRequest& request) {
  if (ctx.stopping()) return ErrorResponse({ApiErrorKind::kShuttingDown, "The server is shutting down", {}, {}});
  Json body;
  if (auto e = ParseJsonBody(request.body, &body)) return ErrorResponse(*e);
  CompletionRequest req;
  if (auto e = ParseCompletionRequest(body, ctx.limits, &req)) return ErrorResponse(*e);

  const Tokenizer& tok = *ctx.tokenizer;
  Completion c;
  c.id = NewRequestId("cmpl");
  c.created = UnixSeconds();
  c.model = req.model;
  c.echo = req.echo;
  c.logprobs = req.gen.sampling.logprobs >= 0;
  c.include_usage = req.gen.include_usage;
  c.continuous_usage = req.gen.continuous_usage;
  const bool multi = req.prompts.size() > 1;
  for (size_t p = 0; p < req.prompts.size(); ++p) {
    PromptInput& in = req.prompts[p];
    const std::string param = multi ? "prompt[" + std::to_string(p) + "]" : "prompt";
    Prompt prompt;
    if (in.is_text) {
      prompt.ids = tok.Encode(in.text, /*allow_special=*/true);
      prompt.text = std::move(in.text);
    } else {
      prompt.ids = std::move(in.ids);
      prompt.text = ReplaceInvalidUtf8(tok.Decode(prompt.ids));
    }
    if (prompt.ids.empty()) return ErrorResponse(InvalidRequest("`" + param + "` is empty", param));
    if (auto e = CheckContextLength(static_cast<int64_t>(prompt.ids.size()), req.gen.sampling.max_tokens,
                                    ctx.max_model_len, param)) {
      return ErrorResponse(*e);
    }
    c.prompts.push_back(std::move(prompt));
  }

  std::vector<JobChoice> job_choices;
  const std::vector<SamplingParams> params = ChoiceParams(req.gen.sampling, ctx.seeds->Next());
  for (size_t p = 0; p < c.prompts.size(); ++p) {
    for (const SamplingParams& sp : params) {
      Choice ch;
      ch.prompt = p;
      if (c.logprobs) ch.logprobs.emplace(tok, c.echo ? 0 : CodePoints(c.prompts[p].text));
      c.choices.push_back(std::move(ch));
      SamplingParams with_prompt = sp;
      if (c.echo) with_prompt.prompt_logprobs = sp.logprobs;  // -1 without logprobs
      job_choices.push_back({c.prompts[p].ids, std::move(with_prompt), req.gen.include_stop_str_in_output});
    }
  }

  auto job = std::make_unique<GenerationJob>(*ctx.engine, c.id, ctx.metrics, ctx.jobs);
  if (Status s = job->Submit(std::move(job_choices)); !s.ok()) {
    return ErrorResponse(ApiErrorFromStatus(s, ctx.stopping()));
  }
  if (!req.gen.stream) return RespondWhenDone(c, *job, ctx, request);
  HttpResponse r;
  r.content_type = std::string(kSseContentType);
  r.stream = std::make_shared<CompletionStream>(std::move(c), std::move(job), ctx);
  return r;
}

}  // namespace kimirt
