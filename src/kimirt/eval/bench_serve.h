// `kimirt bench serve`: a load generator for OpenAI-compatible servers that reports what
// `vllm bench serve` reports (bench_metrics.h), from streamed completions timed chunk by chunk.
// Requests arrive as vLLM schedules them (request_schedule.h) and wait for a free slot when
// --max-concurrency is set; a sweep repeats the run for several concurrencies. Around each run
// the server's /metrics histograms are read, so the report sets the server's own TTFT/ITL/E2EL
// beside the client's. JSON schema: docs/eval.md ("kimirt.bench.serve.v1").
#pragma once

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/core/status.h"
#include "kimirt/eval/bench_dataset.h"
#include "kimirt/eval/bench_metrics.h"
#include "kimirt/eval/bench_plot.h"
#include "kimirt/eval/gsm8k.h"
#include "kimirt/eval/openai_client.h"
#include "kimirt/eval/word_calibration.h"

namespace kimirt::eval {

struct BenchServeOptions {
  std::string url;
  std::string model;                      // empty: the first model of GET /v1/models
  std::string endpoint = "completions";   // completions | chat
  std::string dataset = "random";         // random | prefix_repetition | gsm8k
  PrefixRepetition prefix_repetition;     // prefix_repetition's shape (output: output_len)
  int64_t input_len = 1024;               // vLLM's random defaults
  int64_t output_len = 128;
  double range_ratio = 0;
  int64_t num_prompts = 1000;
  double request_rate = std::numeric_limits<double>::infinity();
  int max_concurrency = 0;                // 0: unbounded
  std::vector<int> sweep_concurrency;     // non-empty: one run per value (overrides max_concurrency)
  uint32_t seed = 0;                      // vLLM's default --seed
  bool ignore_eos = true;
  // Ask for vLLM's stream_options.continuous_usage_stats and time a token by the usage count
  // rising rather than by text arriving: for servers whose tokenizer leaves tokens textless
  // (random weights served with a small built-in tokenizer).
  bool continuous_usage_stats = false;
  double temperature = -1;                // < 0: not sent (the server's default, as vLLM does)
  bool calibrate = true;                  // random: fit prompt words to the server's token counts
  bool server_metrics = true;             // read GET /metrics around each run
  bool detailed = false;                  // per-request arrays in the JSON
  bool progress = true;
  HttpOptions http;
};

struct ServerHistogramSummary {
  std::string name;
  double count = 0;
  double mean_ms = 0;
  std::pair<double, double> p50_ms, p90_ms, p99_ms;  // the bucket holding each quantile
};

struct BenchRun {
  int max_concurrency = 0;
  double request_rate = 0;
  BenchMetrics metrics;
  std::vector<RequestRecord> records;
  bool has_server_metrics = false;
  std::string server_metrics_note;
  ServerHistogramSummary server_ttft, server_itl, server_e2el;
  // From the server's vllm:prefix_cache_{queries,hits}_total over the run; < 0: not exported.
  double prefix_cache_queries = -1, prefix_cache_hits = -1;
  double prefix_cache_hit_rate() const { return prefix_cache_queries > 0 ? prefix_cache_hits / prefix_cache_queries : 0; }
};

struct BenchServeReport {
  BenchServeOptions options;  // as run (model resolved)
  std::string api_url;
  std::string created_utc;
  WordCalibrationReport calibration;
  std::vector<BenchRun> runs;
};

// The request body for one prompt (without the streaming fields the client adds).
nlohmann::json BenchRequestBody(const BenchServeOptions& o, const BenchPrompt& p);

// `gsm8k` is needed only for --dataset gsm8k.
Result<BenchServeReport> RunBenchServe(const BenchServeOptions& options, const Gsm8kData* gsm8k);

nlohmann::json BenchServeReportToJson(const BenchServeReport& report);
// vLLM's result block for one run, and a one-line-per-run table for sweeps.
std::string FormatBenchRun(const BenchRun& run);
std::string FormatBenchSweep(const BenchServeReport& report);
std::vector<PlotPoint> BenchPlotPoints(const BenchServeReport& report);

}  // namespace kimirt::eval
