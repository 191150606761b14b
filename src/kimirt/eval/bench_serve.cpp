#include "kimirt/eval/bench_serve.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "kimirt/eval/gsm8k_eval.h"
#include "kimirt/eval/progress_bar.h"
#include "kimirt/eval/prometheus_histograms.h"
#include "kimirt/eval/request_schedule.h"

namespace kimirt::eval {
namespace {

using Json = nlohmann::json;

Json RateJson(double rate) { return std::isinf(rate) || !(rate > 0) ? Json(nullptr) : Json(rate); }

struct Scraped {
  bool ok = false;
  std::string note;
  std::map<std::string, PromHistogram> histograms;
  double prefix_queries = -1, prefix_hits = -1;  // < 0: not exported
};

// The sum over label sets of a counter's samples, or -1 when the text has none.
double SumCounter(const std::string& text, const std::string& name) {
  double sum = -1;
  size_t at = 0;
  while ((at = text.find(name, at)) != std::string::npos) {
    const bool line_start = at == 0 || text[at - 1] == '\n';
    const size_t end = text.find('\n', at);
    const std::string line = text.substr(at, end == std::string::npos ? std::string::npos : end - at);
    at += name.size();
    if (!line_start || line.size() <= name.size() || (line[name.size()] != '{' && line[name.size()] != ' ')) continue;
    sum = std::max(sum, 0.0) + std::strtod(line.c_str() + line.rfind(' ') + 1, nullptr);
  }
  return sum;
}

Scraped Scrape(OpenAiClient& client) {
  Scraped s;
  Result<std::string> text = client.GetRootText("/metrics");
  if (!text.ok()) {
    s.note = text.status().message();
    return s;
  }
  s.histograms = ParsePromHistograms(*text);
  s.prefix_queries = SumCounter(*text, "vllm:prefix_cache_queries_total");
  s.prefix_hits = SumCounter(*text, "vllm:prefix_cache_hits_total");
  s.ok = true;
  return s;
}

ServerHistogramSummary Summarize(const Scraped& before, const Scraped& after, const std::vector<std::string>& suffixes,
                                 bool* found) {
  ServerHistogramSummary out;
  const PromHistogram* a = FindHistogram(after.histograms, suffixes, &out.name);
  if (a == nullptr) return out;
  auto b = before.histograms.find(out.name);
  const PromHistogram d = HistogramDelta(*a, b == before.histograms.end() ? nullptr : &b->second);
  *found = true;
  out.count = d.count;
  out.mean_ms = d.count > 0 ? d.sum / d.count * 1000 : 0;
  auto ms = [](std::pair<double, double> p) { return std::make_pair(p.first * 1000, p.second * 1000); };
  out.p50_ms = ms(QuantileBucket(d, 0.5));
  out.p90_ms = ms(QuantileBucket(d, 0.9));
  out.p99_ms = ms(QuantileBucket(d, 0.99));
  return out;
}

BenchRun RunOnce(const ServerUrl& url, const BenchServeOptions& o, const std::vector<BenchPrompt>& prompts,
                 const std::vector<double>& arrivals, int max_concurrency) {
  BenchRun run;
  run.max_concurrency = max_concurrency;
  run.request_rate = o.request_rate;
  const size_t n = prompts.size();
  run.records.resize(n);
  const std::string endpoint = EndpointPathFor(o.endpoint);

  OpenAiClient control(url, o.http);
  Scraped before;
  if (o.server_metrics) before = Scrape(control);

  const std::string label = max_concurrency > 0 ? "bench c=" + std::to_string(max_concurrency) : "bench";
  ProgressBar bar(label, n, o.progress ? stderr : nullptr);
  std::mutex mu;
  std::condition_variable cv;
  bool go = false;
  double t0 = 0;
  size_t done = 0, failed = 0;
  int64_t out_tokens = 0;
  std::atomic<size_t> next{0};

  auto worker = [&]() {
    OpenAiClient client(url, o.http);
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return go; });
    }
    for (size_t i = next++; i < n; i = next++) {
      RequestRecord& r = run.records[i];
      r.arrival_s = arrivals[i];
      const double due = t0 + arrivals[i];
      const double wait = due - SteadyNowSeconds();
      if (wait > 0) std::this_thread::sleep_for(std::chrono::duration<double>(wait));
      Result<StreamedCompletion> s = client.Stream(endpoint, BenchRequestBody(o, prompts[i]));
      if (!s.ok()) {
        r.start_s = SteadyNowSeconds() - t0;  // approximate: the send time is inside the client
        r.error = s.status().message();
      } else {
        r.start_s = s->start_s - t0;
        if (s->token_times_s.empty()) {
          r.error = "the stream carried no text (no token arrived to time)";
        } else {
          r.success = true;
          r.ttft_s = s->token_times_s.front() - s->start_s;
          for (size_t k = 1; k < s->token_times_s.size(); ++k) r.itl_s.push_back(s->token_times_s[k] - s->token_times_s[k - 1]);
          r.latency_s = s->token_times_s.back() - s->start_s;
          r.output_tokens = s->usage.completion_tokens > 0 ? s->usage.completion_tokens
                                                          : static_cast<int64_t>(s->token_times_s.size());
          r.prompt_tokens = s->usage.prompt_tokens >= 0 ? s->usage.prompt_tokens : prompts[i].target_input_len;
          r.text = std::move(s->text);
        }
      }
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      failed += r.success ? 0 : 1;
      out_tokens += r.output_tokens;
      const double elapsed = SteadyNowSeconds() - t0;
      char status[96];
      std::snprintf(status, sizeof(status), "%.0f out tok/s%s", elapsed > 0 ? static_cast<double>(out_tokens) / elapsed : 0.0,
                    failed > 0 ? (" failed " + std::to_string(failed)).c_str() : "");
      bar.Update(done, status);
    }
  };
  const size_t workers = max_concurrency > 0 ? std::min(n, static_cast<size_t>(max_concurrency)) : n;
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t i = 0; i < workers; ++i) threads.emplace_back(worker);
  {
    std::lock_guard<std::mutex> lock(mu);
    t0 = SteadyNowSeconds();
    go = true;
  }
  cv.notify_all();
  for (std::thread& t : threads) t.join();
  const double duration = SteadyNowSeconds() - t0;
  run.metrics = ComputeBenchMetrics(run.records, duration);
  char status[96];
  std::snprintf(status, sizeof(status), "%.0f out tok/s", run.metrics.output_throughput);
  bar.Finish(status);

  if (o.server_metrics) {
    if (!before.ok) {
      run.server_metrics_note = before.note;
    } else {
      Scraped after = Scrape(control);
      if (!after.ok) {
        run.server_metrics_note = after.note;
      } else {
        bool f1 = false, f2 = false, f3 = false;
        run.server_ttft = Summarize(before, after, {"time_to_first_token_seconds"}, &f1);
        run.server_itl = Summarize(before, after, {"inter_token_latency_seconds", "time_per_output_token_seconds"}, &f2);
        run.server_e2el = Summarize(before, after, {"e2e_request_latency_seconds"}, &f3);
        run.has_server_metrics = f1 || f2 || f3;
        if (before.prefix_queries >= 0 && after.prefix_queries >= 0) {
          run.prefix_cache_queries = after.prefix_queries - before.prefix_queries;
          run.prefix_cache_hits = after.prefix_hits - before.prefix_hits;
        }
        if (!run.has_server_metrics) run.server_metrics_note = "GET /metrics has no TTFT/ITL/E2E histograms";
      }
    }
  }
  return run;
}

// vLLM's flat key names: mean_ttft_ms, median_ttft_ms, std_ttft_ms, p90_ttft_ms, p99_ttft_ms.
void LatencyJson(Json& j, const std::string& key, const LatencyStats& s) {
  j["mean_" + key + "_ms"] = s.mean;
  j["median_" + key + "_ms"] = s.median;
  j["std_" + key + "_ms"] = s.std;
  j["p90_" + key + "_ms"] = s.p90;
  j["p99_" + key + "_ms"] = s.p99;
}

Json BoundsJson(std::pair<double, double> b) {
  auto num = [](double x) { return std::isfinite(x) ? Json(x) : Json(nullptr); };
  return Json::array({num(b.first), num(b.second)});
}

Json ServerHistogramJson(const ServerHistogramSummary& s) {
  if (s.name.empty()) return nullptr;
  return {{"name", s.name}, {"count", s.count}, {"mean_ms", s.mean_ms}, {"p50_ms_bucket", BoundsJson(s.p50_ms)},
          {"p90_ms_bucket", BoundsJson(s.p90_ms)}, {"p99_ms_bucket", BoundsJson(s.p99_ms)}};
}

std::string Row(const char* label, double v, bool integer = false) {
  char buf[128];
  if (integer) {
    std::snprintf(buf, sizeof(buf), "%-40s %-10lld\n", label, static_cast<long long>(v));
  } else {
    std::snprintf(buf, sizeof(buf), "%-40s %-10.2f\n", label, v);
  }
  return buf;
}

// Python's "{:=^50}".format(title): centred, the odd fill character on the right.
std::string Header(const std::string& title, char fill) {
  const size_t width = 50;
  const size_t pad = width - std::min(width, title.size());
  return std::string(pad / 2, fill) + title + std::string(pad - pad / 2, fill) + "\n";
}

}  // namespace

Json BenchRequestBody(const BenchServeOptions& o, const BenchPrompt& p) {
  Json body;
  body["model"] = o.model;
  if (o.endpoint == "chat") {
    body["messages"] = Json::array({{{"role", "user"}, {"content", p.text}}});
  } else {
    body["prompt"] = p.text;
  }
  body["max_tokens"] = p.max_tokens;
  if (o.ignore_eos) body["ignore_eos"] = true;
  if (!p.stop.empty()) body["stop"] = p.stop;
  if (o.temperature >= 0) body["temperature"] = o.temperature;
  if (o.continuous_usage_stats) body["stream_options"] = {{"continuous_usage_stats", true}};
  return body;
}

Result<BenchServeReport> RunBenchServe(const BenchServeOptions& options, const Gsm8kData* gsm8k) {
  const BenchServeOptions& in = options;
  if (in.endpoint != "completions" && in.endpoint != "chat") {
    return InvalidArgument("--endpoint: expected completions or chat, got \"" + in.endpoint + "\"");
  }
  if (in.dataset != "random" && in.dataset != "gsm8k" && in.dataset != "prefix_repetition") {
    return InvalidArgument("--dataset: expected random, prefix_repetition or gsm8k, got \"" + in.dataset + "\"");
  }
  if (in.num_prompts < 1) return InvalidArgument("--num-prompts must be >= 1");
  if (in.max_concurrency < 0) return InvalidArgument("--max-concurrency must be > 0");
  for (int c : in.sweep_concurrency) {
    if (c < 1) return InvalidArgument("--sweep-concurrency values must be >= 1");
  }
  if (!(in.request_rate > 0)) return InvalidArgument("--request-rate must be > 0 (or inf)");
  if (in.dataset == "gsm8k" && gsm8k == nullptr) return InvalidArgument("--dataset gsm8k needs the GSM8K data");
  KIMIRT_ASSIGN_OR_RETURN(ServerUrl url, ParseServerUrl(in.url));

  BenchServeReport report;
  report.options = in;
  report.created_utc = UtcNowIso8601();
  report.api_url = url.ApiUrl(EndpointPathFor(in.endpoint));
  BenchServeOptions& o = report.options;
  OpenAiClient client(url, o.http);
  KIMIRT_ASSIGN_OR_RETURN(o.model, ResolveModelName(client, in.model));

  std::vector<BenchPrompt> prompts;
  if (o.dataset == "random" || o.dataset == "prefix_repetition") {
    const bool repeated = o.dataset == "prefix_repetition";
    if (repeated) o.input_len = o.prefix_repetition.prefix_len + o.prefix_repetition.suffix_len;
    KIMIRT_ASSIGN_OR_RETURN(RandomLengths lengths,
                            SampleRandomLengths(o.num_prompts, o.input_len, o.output_len, o.range_ratio, o.seed));
    if (o.calibrate) {
      auto body_for = [&](const std::string& text) {
        BenchPrompt p;
        p.text = text;
        p.max_tokens = 1;
        return BenchRequestBody(o, p);
      };
      KIMIRT_ASSIGN_OR_RETURN(report.calibration, CalibrateWords(client, EndpointPathFor(o.endpoint), body_for, o.input_len));
    } else {
      report.calibration.note = "calibration off (--no-calibrate): one word per token assumed";
    }
    if (repeated) {
      KIMIRT_ASSIGN_OR_RETURN(prompts, PrefixRepetitionPrompts(o.num_prompts, o.prefix_repetition, o.output_len,
                                                               report.calibration.fit, o.seed));
    } else {
      prompts = RandomPrompts(lengths, report.calibration.fit);
    }
  } else {
    KIMIRT_ASSIGN_OR_RETURN(prompts, Gsm8kBenchPrompts(*gsm8k, o.num_prompts, o.output_len));
  }

  // vLLM's initial test run: the first request, streamed once, so a misconfiguration fails loudly
  // before the run rather than as N failed requests. It keeps the prompt's own output length, as
  // vLLM does: cut to 2 tokens, a model whose tokens often decode to no text (the built-in one:
  // about 1 in 17) streamed nothing 1 run in 300 and failed a healthy server.
  {
    const BenchPrompt& first = prompts.front();
    Result<StreamedCompletion> s = client.Stream(EndpointPathFor(o.endpoint), BenchRequestBody(o, first));
    if (!s.ok()) return s.status().WithContext("the initial test request failed");
    if (s->token_times_s.empty()) {
      return Internal("the initial test request to " + report.api_url + " streamed no text; cannot time tokens");
    }
  }

  const std::vector<double> arrivals = PoissonArrivals(prompts.size(), o.request_rate, o.seed);
  std::vector<int> concurrencies = o.sweep_concurrency;
  if (concurrencies.empty()) concurrencies.push_back(o.max_concurrency);
  for (int c : concurrencies) report.runs.push_back(RunOnce(url, o, prompts, arrivals, c));
  return report;
}

Json BenchServeReportToJson(const BenchServeReport& r) {
  const BenchServeOptions& o = r.options;
  Json j;
  j["schema"] = "kimirt.bench.serve.v1";
  j["created"] = r.created_utc;
  Json c;
  c["url"] = o.url;
  c["api_url"] = r.api_url;
  c["model"] = o.model;
  c["endpoint"] = o.endpoint;
  c["dataset"] = o.dataset;
  c["input_len"] = o.dataset == "random" ? Json(o.input_len) : Json(nullptr);
  c["output_len"] = o.output_len;
  c["random_range_ratio"] = o.range_ratio;
  c["num_prompts"] = o.num_prompts;
  c["request_rate"] = RateJson(o.request_rate);
  c["max_concurrency"] = o.max_concurrency > 0 ? Json(o.max_concurrency) : Json(nullptr);
  c["sweep_concurrency"] = o.sweep_concurrency.empty() ? Json(nullptr) : Json(o.sweep_concurrency);
  c["seed"] = o.seed;
  c["ignore_eos"] = o.ignore_eos;
  c["continuous_usage_stats"] = o.continuous_usage_stats;
  c["temperature"] = o.temperature >= 0 ? Json(o.temperature) : Json(nullptr);
  j["config"] = std::move(c);
  if (o.dataset == "random") {
    Json cal;
    cal["performed"] = r.calibration.performed;
    cal["intercept"] = r.calibration.fit.intercept;
    cal["slope"] = r.calibration.fit.slope;
    cal["words_kept"] = r.calibration.words_kept;
    Json probes = Json::array();
    for (const auto& [w, t] : r.calibration.probes) probes.push_back({{"words", w}, {"prompt_tokens", t}});
    cal["probes"] = std::move(probes);
    cal["note"] = r.calibration.note;
    j["calibration"] = std::move(cal);
  } else {
    j["calibration"] = nullptr;
  }
  Json runs = Json::array();
  for (const BenchRun& run : r.runs) {
    const BenchMetrics& m = run.metrics;
    Json x;
    x["max_concurrency"] = run.max_concurrency > 0 ? Json(run.max_concurrency) : Json(nullptr);
    x["request_rate"] = RateJson(run.request_rate);
    x["duration"] = m.duration_s;
    x["completed"] = m.completed;
    x["failed"] = m.failed;
    x["total_input_tokens"] = m.total_input_tokens;
    x["total_output_tokens"] = m.total_output_tokens;
    x["request_throughput"] = m.request_throughput;
    x["input_throughput"] = m.input_throughput;
    x["output_throughput"] = m.output_throughput;
    x["total_token_throughput"] = m.total_token_throughput;
    x["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
    x["max_concurrent_requests"] = m.max_concurrent_requests;
    LatencyJson(x, "ttft", m.ttft);
    LatencyJson(x, "tpot", m.tpot);
    LatencyJson(x, "itl", m.itl);
    LatencyJson(x, "e2el", m.e2el);
    LatencyJson(x, "client_queue_time", m.queue);
    std::set<std::string> seen;
    Json errors = Json::array();
    for (const RequestRecord& rec : run.records) {
      if (!rec.success && errors.size() < 10 && seen.insert(rec.error).second) errors.push_back(rec.error);
    }
    x["errors"] = std::move(errors);
    if (run.has_server_metrics) {
      x["server_metrics"] = {{"ttft", ServerHistogramJson(run.server_ttft)},
                             {"itl", ServerHistogramJson(run.server_itl)},
                             {"e2el", ServerHistogramJson(run.server_e2el)}};
    } else {
      x["server_metrics"] = nullptr;
    }
    x["server_metrics_note"] = run.server_metrics_note;
    x["prefix_cache_queries"] = run.prefix_cache_queries >= 0 ? Json(run.prefix_cache_queries) : Json(nullptr);
    x["prefix_cache_hits"] = run.prefix_cache_hits >= 0 ? Json(run.prefix_cache_hits) : Json(nullptr);
    x["prefix_cache_hit_rate"] = run.prefix_cache_queries > 0 ? Json(run.prefix_cache_hit_rate()) : Json(nullptr);
    if (o.detailed) {
      Json in = Json::array(), out = Json::array(), ttfts = Json::array(), itls = Json::array(), lat = Json::array(),
           starts = Json::array(), queues = Json::array(), errs = Json::array();
      for (const RequestRecord& rec : run.records) {
        in.push_back(rec.prompt_tokens);
        out.push_back(rec.output_tokens);
        ttfts.push_back(rec.ttft_s);
        itls.push_back(rec.itl_s);
        lat.push_back(rec.latency_s);
        starts.push_back(rec.start_s);
        queues.push_back(rec.start_s - rec.arrival_s);
        errs.push_back(rec.error);
      }
      x["input_lens"] = std::move(in);
      x["output_lens"] = std::move(out);
      x["ttfts"] = std::move(ttfts);
      x["itls"] = std::move(itls);
      x["latencies"] = std::move(lat);
      x["start_times"] = std::move(starts);
      x["queue_times"] = std::move(queues);
      x["request_errors"] = std::move(errs);
    }
    runs.push_back(std::move(x));
  }
  j["runs"] = std::move(runs);
  return j;
}

std::string FormatBenchRun(const BenchRun& run) {
  const BenchMetrics& m = run.metrics;
  std::string s = Header(" Serving Benchmark Result ", '=');
  s += Row("Successful requests:", static_cast<double>(m.completed), true);
  s += Row("Failed requests:", static_cast<double>(m.failed), true);
  if (run.max_concurrency > 0) s += Row("Maximum request concurrency:", run.max_concurrency, true);
  if (!std::isinf(run.request_rate)) s += Row("Request rate configured (RPS):", run.request_rate);
  s += Row("Benchmark duration (s):", m.duration_s);
  s += Row("Total input tokens:", static_cast<double>(m.total_input_tokens), true);
  s += Row("Total generated tokens:", static_cast<double>(m.total_output_tokens), true);
  s += Row("Request throughput (req/s):", m.request_throughput);
  s += Row("Input token throughput (tok/s):", m.input_throughput);
  s += Row("Output token throughput (tok/s):", m.output_throughput);
  s += Row("Peak output token throughput (tok/s):", m.max_output_tokens_per_s);
  s += Row("Peak concurrent requests:", static_cast<double>(m.max_concurrent_requests));
  s += Row("Total token throughput (tok/s):", m.total_token_throughput);
  auto block = [&](const char* title, const char* name, const LatencyStats& l) {
    s += Header(title, '-');
    const std::string n(name);
    s += Row(("Mean " + n + " (ms):").c_str(), l.mean);
    s += Row(("Median " + n + " (ms):").c_str(), l.median);
    s += Row(("P90 " + n + " (ms):").c_str(), l.p90);
    s += Row(("P99 " + n + " (ms):").c_str(), l.p99);
  };
  if (run.prefix_cache_queries > 0) s += Row("Prefix cache hit rate (%):", 100.0 * run.prefix_cache_hit_rate());
  block("Time to First Token", "TTFT", m.ttft);
  block("Time per Output Token (excl. 1st token)", "TPOT", m.tpot);
  block("Inter-token Latency", "ITL", m.itl);
  block("End-to-end Latency", "E2EL", m.e2el);
  if (run.has_server_metrics) {
    s += Header(" Server /metrics (same window) ", '-');
    auto line = [&](const char* what, const ServerHistogramSummary& h, double client_mean) {
      if (h.name.empty()) return;
      char buf[256];
      std::snprintf(buf, sizeof(buf), "%-40s %-10.2f (client %.2f, n=%.0f, p50 in [%.4g, %.4g] ms)\n", what, h.mean_ms,
                    client_mean, h.count, h.p50_ms.first, h.p50_ms.second);
      s += buf;
    };
    line("Server mean TTFT (ms):", run.server_ttft, m.ttft.mean);
    line("Server mean ITL (ms):", run.server_itl, m.itl.mean);
    line("Server mean E2EL (ms):", run.server_e2el, m.e2el.mean);
  }
  if (m.failed > 0) {
    s += Header(" Errors (first 3) ", '-');
    int shown = 0;
    for (const RequestRecord& rec : run.records) {
      if (!rec.success && shown++ < 3) s += "  " + rec.error + "\n";
    }
  }
  s += std::string(50, '=') + "\n";
  return s;
}

std::string FormatBenchSweep(const BenchServeReport& r) {
  std::string s = "concurrency  req/s   out tok/s  med TTFT ms  med TPOT ms  med ITL ms  med E2EL ms  failed\n";
  for (const BenchRun& run : r.runs) {
    const BenchMetrics& m = run.metrics;
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%-11s  %-6.2f  %-9.1f  %-11.2f  %-11.2f  %-10.2f  %-11.2f  %lld\n",
                  run.max_concurrency > 0 ? std::to_string(run.max_concurrency).c_str() : "inf", m.request_throughput,
                  m.output_throughput, m.ttft.median, m.tpot.median, m.itl.median, m.e2el.median,
                  static_cast<long long>(m.failed));
    s += buf;
  }
  return s;
}

std::vector<PlotPoint> BenchPlotPoints(const BenchServeReport& r) {
  std::vector<PlotPoint> points;
  for (const BenchRun& run : r.runs) {
    if (run.metrics.completed == 0) continue;
    PlotPoint p;
    p.label = run.max_concurrency > 0 ? "c=" + std::to_string(run.max_concurrency) : "c=inf";
    p.output_throughput = run.metrics.output_throughput;
    p.median_tpot_ms = run.metrics.tpot.median;
    p.median_ttft_ms = run.metrics.ttft.median;
    points.push_back(p);
  }
  return points;
}

}  // namespace kimirt::eval
