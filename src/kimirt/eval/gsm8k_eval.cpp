#include "kimirt/eval/gsm8k_eval.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <mutex>
#include <thread>

#include "kimirt/eval/progress_bar.h"

namespace kimirt::eval {
namespace {

using Json = nlohmann::json;

Json NumberOrNull(double v) { return std::isfinite(v) ? Json(v) : Json(nullptr); }

// Transport failures and server errors (5xx) are worth another try; a 4xx will not change.
bool Retryable(const Status& s) { return s.code() != ErrorCode::kInvalidArgument || s.message().find("HTTP 5") != std::string::npos; }

Gsm8kFilterSummary Summarize(const std::vector<Gsm8kSample>& samples, bool strict) {
  Gsm8kFilterSummary s;
  std::vector<double> v;
  v.reserve(samples.size());
  for (const Gsm8kSample& x : samples) {
    const bool ok = strict ? x.score.strict_match.correct : x.score.flexible_extract.correct;
    v.push_back(ok ? 1.0 : 0.0);
    s.correct += ok ? 1 : 0;
  }
  s.exact_match = v.empty() ? 0.0 : static_cast<double>(s.correct) / static_cast<double>(v.size());
  s.stderr_ = MeanStderr(v);
  return s;
}

}  // namespace

Json Gsm8kRequestBody(const Gsm8kEvalOptions& o, const Gsm8kPrompt& p) {
  Json body;
  if (o.endpoint == "chat") {
    Json messages = Json::array();
    for (const ChatTurn& t : p.messages) messages.push_back({{"role", t.role}, {"content", t.content}});
    body["messages"] = std::move(messages);
  } else {
    body["prompt"] = p.text;
  }
  body["model"] = o.model;
  body["max_tokens"] = o.max_tokens;
  body["temperature"] = 0.0;
  body["stop"] = Gsm8kStopSequences();
  body["seed"] = o.request_seed;
  return body;
}

Result<std::string> ResolveModelName(OpenAiClient& client, const std::string& requested) {
  if (!requested.empty()) return requested;
  KIMIRT_ASSIGN_OR_RETURN(std::vector<std::string> ids, client.ListModels());
  if (ids.empty()) return NotFound("GET " + client.url().ApiUrl("models") + " lists no model; give --model");
  return ids.front();
}

Result<Gsm8kReport> RunGsm8kEval(const Gsm8kEvalOptions& options, const Gsm8kData& data) {
  if (options.endpoint != "completions" && options.endpoint != "chat") {
    return InvalidArgument("--endpoint: expected completions or chat, got \"" + options.endpoint + "\"");
  }
  if (options.concurrency < 1) return InvalidArgument("--concurrency must be >= 1");
  if (options.max_tokens < 1) return InvalidArgument("--max-tokens must be >= 1");
  if (options.max_retries < 1) return InvalidArgument("--max-retries must be >= 1");
  KIMIRT_ASSIGN_OR_RETURN(ServerUrl url, ParseServerUrl(options.url));

  Gsm8kReport report;
  report.options = options;
  report.created_utc = UtcNowIso8601();
  report.data_dir = data.dir;
  report.num_test_docs = data.test.size();
  report.api_url = url.ApiUrl(EndpointPathFor(options.endpoint));
  {
    OpenAiClient probe(url, options.http);
    KIMIRT_ASSIGN_OR_RETURN(report.options.model, ResolveModelName(probe, options.model));
  }

  KIMIRT_ASSIGN_OR_RETURN(std::vector<Gsm8kPrompt> prompts,
                          BuildGsm8kPrompts(data.train, data.test, options.limit, options.num_fewshot,
                                            options.fewshot_seed, options.fewshot_as_multiturn));
  report.samples.resize(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    Gsm8kSample& s = report.samples[i];
    s.question = data.test[prompts[i].doc_id].question;
    s.target = data.test[prompts[i].doc_id].answer;
    s.prompt = std::move(prompts[i]);
  }

  const Gsm8kEvalOptions& o = report.options;
  const std::string endpoint = EndpointPathFor(o.endpoint);
  ProgressBar bar("gsm8k", report.samples.size(), o.progress ? stderr : nullptr);
  std::mutex mu;
  size_t done = 0, strict_ok = 0, flexible_ok = 0, failed = 0;
  std::atomic<size_t> next{0};
  const double t0 = SteadyNowSeconds();

  auto worker = [&]() {
    OpenAiClient client(url, o.http);
    for (size_t i = next++; i < report.samples.size(); i = next++) {
      Gsm8kSample& s = report.samples[i];
      const Json body = Gsm8kRequestBody(o, s.prompt);
      const double start = SteadyNowSeconds();
      Status last;
      for (int attempt = 1; attempt <= o.max_retries; ++attempt) {
        s.attempts = attempt;
        Result<Completion> c = client.Complete(endpoint, body);
        if (c.ok()) {
          s.output = c->text;
          s.finish_reason = c->finish_reason;
          s.usage = c->usage;
          last = Status::Ok();
          break;
        }
        last = c.status();
        if (!Retryable(last) || attempt == o.max_retries) break;
        // lm-eval: tenacity wait_exponential(multiplier=0.5, min=1, max=10).
        std::this_thread::sleep_for(std::chrono::duration<double>(std::min(10.0, std::max(1.0, 0.5 * std::pow(2.0, attempt)))));
      }
      s.latency_s = SteadyNowSeconds() - start;
      if (!last.ok()) s.error = last.message();
      s.score = ScoreGsm8k(s.output, s.target);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      strict_ok += s.score.strict_match.correct ? 1 : 0;
      flexible_ok += s.score.flexible_extract.correct ? 1 : 0;
      failed += s.error.empty() ? 0 : 1;
      char status[128];
      std::snprintf(status, sizeof(status), "strict %.3f flexible %.3f%s", static_cast<double>(strict_ok) / static_cast<double>(done),
                    static_cast<double>(flexible_ok) / static_cast<double>(done),
                    failed > 0 ? (" failed " + std::to_string(failed)).c_str() : "");
      bar.Update(done, status);
    }
  };
  const size_t n_workers = std::min<size_t>(static_cast<size_t>(o.concurrency), std::max<size_t>(1, report.samples.size()));
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n_workers; ++i) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  report.wall_s = SteadyNowSeconds() - t0;

  report.strict_match = Summarize(report.samples, true);
  report.flexible_extract = Summarize(report.samples, false);
  report.failed_requests = static_cast<int64_t>(failed);
  char status[128];
  std::snprintf(status, sizeof(status), "strict %.3f flexible %.3f", report.strict_match.exact_match,
                report.flexible_extract.exact_match);
  bar.Finish(status);
  return report;
}

Json Gsm8kReportToJson(const Gsm8kReport& r) {
  const Gsm8kEvalOptions& o = r.options;
  Json j;
  j["schema"] = "kimirt.eval.gsm8k.v1";
  j["task"] = "gsm8k";
  j["task_version"] = 3.0;  // gsm8k.yaml metadata.version
  j["created"] = r.created_utc;
  Json c;
  c["url"] = o.url;
  c["api_url"] = r.api_url;
  c["model"] = o.model;
  c["endpoint"] = o.endpoint;
  c["num_fewshot"] = o.num_fewshot;
  c["fewshot_seed"] = o.fewshot_seed;
  c["fewshot_as_multiturn"] = o.fewshot_as_multiturn;
  c["limit"] = o.limit < 0 ? Json(nullptr) : Json(o.limit);
  c["max_tokens"] = o.max_tokens;
  c["temperature"] = 0.0;
  c["stop"] = Gsm8kStopSequences();
  c["seed"] = o.request_seed;
  c["concurrency"] = o.concurrency;
  c["data_dir"] = r.data_dir;
  c["num_test_docs"] = r.num_test_docs;
  j["config"] = std::move(c);
  auto summary = [](const Gsm8kFilterSummary& s) {
    return Json{{"exact_match", s.exact_match}, {"exact_match_stderr", NumberOrNull(s.stderr_)}, {"correct", s.correct}};
  };
  j["results"] = {{"strict-match", summary(r.strict_match)}, {"flexible-extract", summary(r.flexible_extract)}};
  j["n_samples"] = r.samples.size();
  j["failed_requests"] = r.failed_requests;
  j["wall_seconds"] = r.wall_s;
  int64_t prompt_tokens = 0, completion_tokens = 0;
  Json samples = Json::array();
  for (const Gsm8kSample& s : r.samples) {
    if (s.usage.prompt_tokens > 0) prompt_tokens += s.usage.prompt_tokens;
    if (s.usage.completion_tokens > 0) completion_tokens += s.usage.completion_tokens;
    Json x;
    x["doc_id"] = s.prompt.doc_id;
    x["fewshot_ids"] = s.prompt.fewshot_ids;
    x["question"] = s.question;
    x["target"] = s.target;
    x["gold"] = NormalizeForExactMatch(s.target);
    x["prompt"] = s.prompt.text;
    if (o.endpoint == "chat") {
      Json m = Json::array();
      for (const ChatTurn& t : s.prompt.messages) m.push_back({{"role", t.role}, {"content", t.content}});
      x["messages"] = std::move(m);
    } else {
      x["messages"] = nullptr;
    }
    x["output"] = s.output;
    x["finish_reason"] = s.finish_reason.empty() ? Json(nullptr) : Json(s.finish_reason);
    x["usage"] = s.usage.prompt_tokens < 0 && s.usage.completion_tokens < 0
                     ? Json(nullptr)
                     : Json{{"prompt_tokens", s.usage.prompt_tokens}, {"completion_tokens", s.usage.completion_tokens}};
    x["error"] = s.error.empty() ? Json(nullptr) : Json(s.error);
    x["attempts"] = s.attempts;
    x["latency_s"] = s.latency_s;
    x["filters"] = {
        {"strict-match", {{"extracted", s.score.strict_match.extracted}, {"exact_match", s.score.strict_match.correct ? 1 : 0}}},
        {"flexible-extract",
         {{"extracted", s.score.flexible_extract.extracted}, {"exact_match", s.score.flexible_extract.correct ? 1 : 0}}}};
    samples.push_back(std::move(x));
  }
  j["usage"] = {{"prompt_tokens", prompt_tokens}, {"completion_tokens", completion_tokens}};
  j["samples"] = std::move(samples);
  return j;
}

std::string FormatGsm8kTable(const Gsm8kReport& r) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line), "%s (%s), gsm8k: limit %s, num_fewshot %d, %zu samples, %lld failed, %.1f s\n",
                r.options.model.c_str(), r.api_url.c_str(),
                r.options.limit < 0 ? "None" : std::to_string(r.options.limit).c_str(), r.options.num_fewshot,
                r.samples.size(), static_cast<long long>(r.failed_requests), r.wall_s);
  out += line;
  out += "|Tasks|Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|\n";
  out += "|-----|------:|----------------|-----:|-----------|---|-----:|---|-----:|\n";
  auto row = [&](const char* task, const char* version, const char* filter, const Gsm8kFilterSummary& s) {
    char se[32];
    if (std::isfinite(s.stderr_)) {
      std::snprintf(se, sizeof(se), "%.4f", s.stderr_);
    } else {
      std::snprintf(se, sizeof(se), "   N/A");
    }
    std::snprintf(line, sizeof(line), "|%-5s|%7s|%-16s|%6d|exact_match|↑  |%.4f|±  |%6s|\n", task, version, filter,
                  r.options.num_fewshot, s.exact_match, se);
    out += line;
  };
  row("gsm8k", "3", "flexible-extract", r.flexible_extract);
  row("", "", "strict-match", r.strict_match);
  return out;
}

}  // namespace kimirt::eval
