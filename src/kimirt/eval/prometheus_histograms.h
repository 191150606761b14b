// Histograms read from a server's GET /metrics (Prometheus text exposition format 0.0.4), so a
// benchmark can set its client-side TTFT/ITL/E2EL beside the server's own: vllm:time_to_first_
// token_seconds, vllm:inter_token_latency_seconds / vllm:time_per_output_token_seconds,
// vllm:e2e_request_latency_seconds, as vLLM and kimirt serve (server/metrics.h) both export them.
// Series that differ only in labels other than `le` (e.g. model_name) are summed.
#pragma once

#include <map>
#include <string>
#include <string_view>
#include <vector>

namespace kimirt::eval {

struct PromHistogram {
  std::vector<double> upper_bounds;  // ascending, +Inf last when present
  std::vector<double> cumulative;    // observations <= each bound
  double sum = 0;
  double count = 0;
};

// Every histogram in the text, by metric name (without _bucket/_sum/_count).
std::map<std::string, PromHistogram> ParsePromHistograms(std::string_view text);

// after − before, bucket by bucket (a histogram absent before counts as empty).
PromHistogram HistogramDelta(const PromHistogram& after, const PromHistogram* before);

// The bucket holding quantile q (0..1): [lower, upper] bounds in the histogram's unit, the
// resolution at which a client-side percentile can be checked against it. {NaN, NaN} if empty.
std::pair<double, double> QuantileBucket(const PromHistogram& h, double q);

// The first histogram whose name ends with one of `suffixes` (e.g. "time_to_first_token_seconds").
const PromHistogram* FindHistogram(const std::map<std::string, PromHistogram>& all,
                                   const std::vector<std::string>& suffixes, std::string* name);

}  // namespace kimirt::eval
