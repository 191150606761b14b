// Prometheus metrics of the server (GET /metrics, text exposition format 0.0.4), under vLLM's
// names and `model_name` label so that dashboards and alerts written for vLLM work unchanged:
//   counters   vllm:prompt_tokens_total, vllm:generation_tokens_total,
//              vllm:request_success_total{finished_reason}, vllm:num_preemptions_total
//   histograms vllm:time_to_first_token_seconds, vllm:time_per_output_token_seconds and
//              vllm:inter_token_latency_seconds (the same inter-token gaps, under the older and
//              the newer vLLM name), vllm:e2e_request_latency_seconds; vLLM's buckets
//   gauges     vllm:num_requests_running / _waiting, vllm:kv_cache_usage_perc (0..1)
// plus kimirt's own (no vLLM equivalent): kimirt_http_requests_total{endpoint,status},
// kimirt_kv_cache_blocks_used / _total, kimirt_state_slots_used / _total (KDA state).
// Engine gauges are read from Engine::Stats at scrape time.
//
// Thread safety: every method may be called from any thread (one mutex; observations are a few
// per token, far below contention).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kimirt {

struct EngineStats;
enum class FinishReason : uint8_t;

// Fixed-bucket histogram. Buckets are upper bounds, ascending; +Inf is implied.
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double value, uint64_t count = 1);
  // Prometheus lines (`_bucket{LABELS,le=...}` cumulative, `_sum`, `_count`) without HELP/TYPE.
  // `labels` is `key="value",…` or empty.
  void Render(std::string_view name, std::string_view labels, std::string* out) const;

  const std::vector<double>& upper_bounds() const { return bounds_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); last = above every bound
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

class ServerMetrics {
 public:
  ServerMetrics();

  // `endpoint` is the route ("/v1/completions"); anything else is counted as "other" so that
  // clients probing random paths cannot grow the label set without bound.
  void CountRequest(std::string_view endpoint, int http_status);
  void AddTokens(int64_t prompt_tokens, int64_t generation_tokens);
  void ObserveTimeToFirstToken(double seconds);
  // `count` tokens arrived together after `seconds_per_token` each.
  void ObserveTimePerOutputToken(double seconds_per_token, uint64_t count);
  void ObserveEndToEnd(double seconds);
  // A request choice ended (vllm:request_success_total{finished_reason}).
  void CountFinished(FinishReason reason);
  // The `model_name` label of the vLLM series; set once before serving.
  void SetModelName(std::string name);
  // Totals for the periodic stats line.
  int64_t prompt_tokens() const;
  int64_t generation_tokens() const;

  // Routes counted by name; set once before serving.
  void SetKnownEndpoints(std::vector<std::string> endpoints);

  std::string Render(const EngineStats& stats) const;

 private:
  mutable std::mutex mu_;
  std::vector<std::string> endpoints_;
  std::string model_label_ = "model_name=\"\"";
  std::map<std::pair<std::string, int>, uint64_t> requests_;
  std::map<std::string, uint64_t> finished_;  // by finished_reason
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  Histogram ttft_;
  Histogram tpot_;
  Histogram e2e_;
};

inline constexpr std::string_view kPrometheusContentType = "text/plain; version=0.0.4; charset=utf-8";

}  // namespace kimirt
