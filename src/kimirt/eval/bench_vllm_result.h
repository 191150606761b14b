// `kimirt bench serve --save-result`: a run's results in the flat JSON that
// `vllm bench serve --save-result` writes (vllm/benchmarks/serve.py), so the two compare side by
// side with the same scripts: date, endpoint_type, model_id, num_prompts, request_rate
// ("inf" or a number), max_concurrency, duration, completed, failed, total_input_tokens,
// total_output_tokens, request_throughput, output_throughput, total_token_throughput,
// max_output_tokens_per_s, max_concurrent_requests, and for each --percentile-metrics name M
// (ttft, tpot, itl, e2el) mean_M_ms, median_M_ms, std_M_ms and pP_M_ms for each
// --metric-percentiles P (vLLM writes 99 as "p99", 99.9 as "p99.9"). --save-detailed adds
// vLLM's per-request arrays (input_lens, output_lens, ttfts, itls, generated_texts, errors).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/core/status.h"
#include "kimirt/eval/bench_serve.h"

namespace kimirt::eval {

struct VllmResultOptions {
  std::vector<std::string> percentile_metrics = {"ttft", "tpot", "itl"};  // vLLM's defaults
  std::vector<double> metric_percentiles = {99};
};

// "ttft,tpot,itl,e2el" and "50,90,99" as vLLM's flags take them.
Result<std::vector<std::string>> ParsePercentileMetrics(const std::string& text);
Result<std::vector<double>> ParseMetricPercentiles(const std::string& text);

nlohmann::ordered_json VllmResultJson(const BenchServeReport& report, const BenchRun& run,
                                      const VllmResultOptions& options);
// vLLM's default file name: {endpoint_type}-{rate}qps[-concurrency{N}]-{model base name}-{date}.json
std::string VllmResultFileName(const BenchServeReport& report, const BenchRun& run);

}  // namespace kimirt::eval
