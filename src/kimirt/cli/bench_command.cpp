// `kimirt bench serve`: flags → BenchServeOptions → RunBenchServe → vLLM's result block (and a
// table per concurrency for sweeps), --json FILE, --plot FILE.png. `kimirt bench` dispatches on
// its mode; `model` (the in-process engine benchmark) plugs in beside `serve`.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/eval/bench_plot.h"
#include "kimirt/eval/bench_serve.h"
#include "kimirt/eval/bench_vllm_result.h"
#include "kimirt/eval/gsm8k.h"

namespace kimirt {
namespace {

Result<double> ParseRate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "infinity") return std::numeric_limits<double>::infinity();
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || end != s.c_str() + s.size() || !(v > 0) || std::isinf(v)) {
    return InvalidArgument("--request-rate: expected a positive number or inf, got \"" + s + "\"");
  }
  return v;
}

Result<std::vector<int>> ParseIntList(const std::string& flag, const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || end != part.c_str() + part.size() || v < 1 || v > 1000000) {
      return InvalidArgument(flag + ": expected positive integers separated by commas, got \"" + s + "\"");
    }
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) return InvalidArgument(flag + ": empty list");
  return out;
}

}  // namespace

int RunBenchServeCommand(int argc, char** argv) {
  eval::BenchServeOptions o;
  std::string rate = "inf", sweep, json_path, plot_path, data_dir;
  int64_t seed = o.seed;
  double timeout = o.http.read_timeout_s;

  FlagSet flags("bench serve",
                "Load test of an OpenAI-compatible server with the metrics of `vllm bench serve` (TTFT, TPOT,\n"
                "ITL, E2E latency; request and token throughput), timed from streamed tokens. See docs/eval.md.");
  flags.String("url,base-url", &o.url, "server base URL: http://host:port or http://host:port/v1 (required)");
  flags.String("model", &o.model, "model name to request (default: the first of GET /v1/models)");
  flags.String("endpoint", &o.endpoint, "completions or chat");
  flags.String("dataset,dataset-name", &o.dataset,
               "random (synthetic prompts of --input-len tokens), prefix_repetition (shared prefixes) or gsm8k");
  flags.Int("prefix-repetition-prefix-len", &o.prefix_repetition.prefix_len, "prefix_repetition: tokens of each shared prefix");
  flags.Int("prefix-repetition-suffix-len", &o.prefix_repetition.suffix_len, "prefix_repetition: tokens of each request's own suffix");
  flags.Int("prefix-repetition-num-prefixes", &o.prefix_repetition.num_prefixes, "prefix_repetition: distinct prefixes");
  flags.Int("input-len,random-input-len", &o.input_len, "random: prompt tokens per request");
  flags.Int("output-len,random-output-len,prefix-repetition-output-len", &o.output_len, "tokens generated per request (max_tokens)");
  flags.Double("random-range-ratio", &o.range_ratio, "random: lengths uniform in [L(1-r), L(1+r)]");
  flags.Int("num-prompts", &o.num_prompts, "requests per run");
  flags.String("request-rate", &rate, "requests per second, Poisson arrivals (inf: all at once)");
  flags.Int("max-concurrency", &o.max_concurrency, "requests in flight at most (0: no limit)");
  flags.String("sweep-concurrency", &sweep, "one run per concurrency, e.g. 1,2,4,8,16 (overrides --max-concurrency)");
  flags.Int("seed", &seed, "seed of the prompt lengths and the arrival times (vLLM's default: 0)");
  flags.Bool("continuous-usage-stats", &o.continuous_usage_stats,
             "ask for stream_options.continuous_usage_stats and time tokens by the usage count (for models whose "
             "tokens may decode to no text, e.g. random weights)");
  flags.Bool("ignore-eos", &o.ignore_eos, "send ignore_eos so each request generates its full length (default: on for random, off for gsm8k)");
  flags.Double("temperature", &o.temperature, "temperature to send (default: not sent, the server decides)");
  flags.Bool("calibrate", &o.calibrate, "random: fit prompt words to the server's token counts (--no-calibrate: one word per token)");
  flags.Bool("server-metrics", &o.server_metrics, "read the server's GET /metrics histograms around each run");
  flags.Bool("detailed,save-detailed", &o.detailed, "per-request arrays (ttfts, itls, latencies, ...) in the JSON");
  flags.String("json", &json_path, "write the results as JSON to FILE (kimirt's schema, every run)");
  bool save_result = false;
  std::string result_dir, result_filename, percentile_metrics = "ttft,tpot,itl", metric_percentiles = "99";
  flags.Bool("save-result", &save_result, "write each run as vllm bench serve --save-result does (flat JSON)");
  flags.String("result-dir", &result_dir, "--save-result: directory (default: the current one)");
  flags.String("result-filename", &result_filename,
               "--save-result: file name (default: vLLM's openai-{rate}qps[-concurrency{N}]-{model}-{date}.json)");
  flags.String("percentile-metrics", &percentile_metrics, "--save-result: metrics with percentiles: ttft,tpot,itl,e2el");
  flags.String("metric-percentiles", &metric_percentiles, "--save-result: percentiles, e.g. 50,90,99");
  flags.String("plot", &plot_path, "draw throughput vs latency per concurrency into FILE.png (needs gnuplot)");
  flags.String("data-dir", &data_dir, "gsm8k: directory with train.jsonl and test.jsonl");
  flags.Double("timeout", &timeout, "seconds a response may stay silent before the request fails");
  flags.Bool("progress", &o.progress, "progress bar on stderr");

  if (Status s = flags.Parse(argc, argv, 3, nullptr); !s.ok()) {
    std::fprintf(stderr, "kimirt bench serve: %s\n", s.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kimirt bench serve: %s\n", s.message().c_str());
    return 1;
  };
  if (o.url.empty()) {
    std::fprintf(stderr, "kimirt bench serve: --url is required (e.g. --url http://127.0.0.1:8000)\n");
    return 2;
  }
  Result<double> r = ParseRate(rate);
  if (!r.ok()) return fail(r.status());
  o.request_rate = *r;
  if (!sweep.empty()) {
    Result<std::vector<int>> list = ParseIntList("--sweep-concurrency", sweep);
    if (!list.ok()) return fail(list.status());
    o.sweep_concurrency = *list;
  }
  if (seed < 0 || seed > 0xFFFFFFFFll) return fail(InvalidArgument("--seed must be in [0, 2^32)"));
  o.seed = static_cast<uint32_t>(seed);
  if (!(timeout > 0)) return fail(InvalidArgument("--timeout must be > 0"));
  o.http.read_timeout_s = timeout;
  if (!flags.WasSet("ignore-eos")) o.ignore_eos = o.dataset != "gsm8k";
  eval::VllmResultOptions vllm_result;
  if (save_result) {
    Result<std::vector<std::string>> metrics = eval::ParsePercentileMetrics(percentile_metrics);
    if (!metrics.ok()) return fail(metrics.status());
    Result<std::vector<double>> percentiles = eval::ParseMetricPercentiles(metric_percentiles);
    if (!percentiles.ok()) return fail(percentiles.status());
    vllm_result = {*metrics, *percentiles};
  }
  if (!plot_path.empty() && eval::FindOnPath("gnuplot").empty()) {
    // Fail before the run, not after minutes of load.
    return fail(NotFound("--plot needs gnuplot, which is not on PATH: install the Debian package gnuplot-nox "
                         "(apt-get install gnuplot-nox), or drop --plot"));
  }

  eval::Gsm8kData gsm8k;
  if (o.dataset == "gsm8k") {
    if (data_dir.empty()) data_dir = eval::DefaultGsm8kDataDir(argv[0]);
    if (data_dir.empty()) return fail(NotFound("no GSM8K data found; give --data-dir"));
    Result<eval::Gsm8kData> d = eval::LoadGsm8k(data_dir);
    if (!d.ok()) return fail(d.status());
    gsm8k = std::move(*d);
  }

  Result<eval::BenchServeReport> report = eval::RunBenchServe(o, o.dataset == "gsm8k" ? &gsm8k : nullptr);
  if (!report.ok()) return fail(report.status());
  if (!report->calibration.note.empty()) std::fprintf(stderr, "note: %s\n", report->calibration.note.c_str());
  for (const eval::BenchRun& run : report->runs) std::fputs(eval::FormatBenchRun(run).c_str(), stdout);
  if (report->runs.size() > 1) std::fputs(eval::FormatBenchSweep(*report).c_str(), stdout);

  if (!json_path.empty()) {
    std::ofstream f(json_path, std::ios::binary);
    f << eval::BenchServeReportToJson(*report).dump(2) << "\n";
    if (!f) return fail(IoError(json_path + ": cannot write the results"));
    std::printf("results: %s\n", json_path.c_str());
  }
  if (save_result) {
    for (size_t i = 0; i < report->runs.size(); ++i) {
      const eval::BenchRun& run = report->runs[i];
      std::string name = result_filename.empty() ? eval::VllmResultFileName(*report, run) : result_filename;
      if (!result_filename.empty() && report->runs.size() > 1) {
        // One file per concurrency of a sweep: name-c{N}.json.
        const size_t dot = name.rfind(".json");
        name = name.substr(0, dot) + "-c" + std::to_string(run.max_concurrency) + (dot == std::string::npos ? "" : ".json");
      }
      const std::string path = result_dir.empty() ? name : result_dir + "/" + name;
      std::ofstream f(path, std::ios::binary);
      f << eval::VllmResultJson(*report, run, vllm_result).dump(2) << "\n";
      if (!f) return fail(IoError(path + ": cannot write the results"));
      std::printf("result: %s\n", path.c_str());
    }
  }
  if (!plot_path.empty()) {
    const std::string title = report->options.model + ", " + report->options.dataset + " " +
                              (report->options.dataset == "random" ? std::to_string(o.input_len) + "/" : std::string()) +
                              std::to_string(o.output_len) + " tokens, " + std::to_string(o.num_prompts) + " prompts";
    if (Status s = eval::PlotThroughputLatency(eval::BenchPlotPoints(*report), plot_path, title); !s.ok()) return fail(s);
    std::printf("plot: %s\n", plot_path.c_str());
  }
  int64_t failed = 0;
  for (const eval::BenchRun& run : report->runs) failed += run.metrics.failed;
  return failed > 0 ? 1 : 0;
}

int RunBenchCommand(int argc, char** argv) {
  const std::string mode = argc >= 3 ? argv[2] : "";
  if (mode == "serve") return RunBenchServeCommand(argc, argv);
  if (mode == "model") return RunBenchModelCommand(argc, argv);
  if (mode == "--help" || mode == "-h" || mode == "help") {
    std::printf("usage: kimirt bench <mode> [flags]\n\nmodes:\n"
                "  serve   load test of an OpenAI-compatible server (vllm bench serve's metrics)\n"
                "  model   the engine in-process: prefill tokens/s and decode step time per batch size\n");
    return 0;
  }
  std::fprintf(stderr, "kimirt bench: unknown bench mode \"%s\" (known: serve, model)\n", mode.c_str());
  return 2;
}

}  // namespace kimirt
