// The metrics `vllm bench serve` reports, computed the same way
// (vllm-project/vllm:vllm/benchmarks/serve.py calculate_metrics, and
// vllm/benchmarks/lib/endpoint_request_func.py for the per-request timings):
//   TTFT  first text chunk − request sent
//   ITL   gaps between consecutive text chunks (all requests pooled)
//   TPOT  (E2EL − TTFT) / (output tokens − 1), for requests with more than one output token
//   E2EL  last text chunk − request sent
// Throughputs divide totals over successful requests by the run's wall time. Output tokens are
// the server's usage.completion_tokens, else the number of text chunks. Statistics are numpy's:
// mean, median, population std, percentiles by linear interpolation; an empty list gives 0.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kimirt::eval {

struct RequestRecord {
  bool success = false;
  std::string error;
  double arrival_s = 0;   // scheduled arrival, from the run's start
  double start_s = 0;     // sent, from the run's start (start − arrival = client queue time)
  double ttft_s = 0;
  double latency_s = 0;   // E2EL
  std::vector<double> itl_s;
  int64_t prompt_tokens = 0;   // usage.prompt_tokens, else the dataset's expected length
  int64_t output_tokens = 0;
  std::string text;
};

// numpy.percentile(values, p) with the default linear method; p in [0, 100]. Empty: 0.
double Percentile(std::vector<double> values, double p);

struct LatencyStats {  // milliseconds
  double mean = 0, median = 0, std = 0, p90 = 0, p99 = 0;
};
LatencyStats SummarizeMs(const std::vector<double>& seconds);

struct BenchMetrics {
  int64_t completed = 0;
  int64_t failed = 0;
  double duration_s = 0;
  int64_t total_input_tokens = 0;
  int64_t total_output_tokens = 0;
  double request_throughput = 0;      // completed / s
  double input_throughput = 0;        // input tokens / s
  double output_throughput = 0;       // output tokens / s
  double total_token_throughput = 0;  // (input + output) / s
  LatencyStats ttft, tpot, itl, e2el, queue;
  double max_output_tokens_per_s = 0; // busiest whole second
  int64_t max_concurrent_requests = 0;
};

BenchMetrics ComputeBenchMetrics(const std::vector<RequestRecord>& records, double duration_s);

// The per-metric samples (seconds) of the successful requests, as the statistics above pool them.
struct MetricSamples {
  std::vector<double> ttft, tpot, itl, e2el, queue;
};
MetricSamples CollectMetricSamples(const std::vector<RequestRecord>& records);

}  // namespace kimirt::eval
