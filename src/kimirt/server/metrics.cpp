// Prometheus text rendering of the server's counters, histograms and engine gauges (metrics.h).
#include "kimirt/server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <type_traits>

#include "kimirt/core/check.h"
#include "kimirt/engine/engine.h"

namespace kimirt {
namespace {

// Shortest round-trip spelling; Prometheus reads Go float syntax, which this is a subset of.
std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (std::isnan(v)) return "NaN";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);
  if (ec != std::errc()) return "0";
  return std::string(buf, end);
}

void Header(std::string* out, std::string_view name, std::string_view type, std::string_view help) {
  out->append("# HELP ").append(name).append(" ").append(help).append("\n");
  out->append("# TYPE ").append(name).append(" ").append(type).append("\n");
}

void Sample(std::string* out, std::string_view name, int64_t value) {
  out->append(name).append(" ").append(std::to_string(value)).append("\n");
}

// Buckets as vLLM chose them for the same three latencies, so dashboards carry over.
std::vector<double> TtftBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
          0.75,  1.0,   2.5,  5.0,  7.5,  10.0, 20.0, 40.0, 80.0};
}
std::vector<double> TpotBuckets() {
  return {0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3,
          0.4,   0.5,   0.75, 1.0,   2.5,  5.0,   7.5, 10.0, 20.0, 40.0, 80.0};
}
std::vector<double> E2eBuckets() {
  return {0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,    10.0,   15.0, 20.0,
          30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {
  KIMIRT_CHECK(std::is_sorted(bounds_.begin(), bounds_.end()));
}

void Histogram::Observe(double value, uint64_t count) {
  if (count == 0 || std::isnan(value)) return;
  // le="b" counts value <= b: the first bound not below the value.
  size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  counts_[i] += count;
  sum_ += value * static_cast<double>(count);
  count_ += count;
}

void Histogram::Render(std::string_view name, std::string_view labels, std::string* out) const {
  const std::string prefix = labels.empty() ? std::string() : std::string(labels) + ",";
  const std::string plain = labels.empty() ? std::string() : "{" + std::string(labels) + "}";
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? FormatDouble(bounds_[i]) : "+Inf";
    out->append(name).append("_bucket{").append(prefix).append("le=\"").append(le).append("\"} ");
    out->append(std::to_string(cumulative)).append("\n");
  }
  out->append(name).append("_sum").append(plain).append(" ").append(FormatDouble(sum_)).append("\n");
  out->append(name).append("_count").append(plain).append(" ").append(std::to_string(count_)).append("\n");
}

ServerMetrics::ServerMetrics() : ttft_(TtftBuckets()), tpot_(TpotBuckets()), e2e_(E2eBuckets()) {}

void ServerMetrics::SetKnownEndpoints(std::vector<std::string> endpoints) {
  std::lock_guard<std::mutex> lock(mu_);
  endpoints_ = std::move(endpoints);
}

void ServerMetrics::CountRequest(std::string_view endpoint, int http_status) {
  std::lock_guard<std::mutex> lock(mu_);
  const bool known = std::find(endpoints_.begin(), endpoints_.end(), endpoint) != endpoints_.end();
  ++requests_[{known ? std::string(endpoint) : std::string("other"), http_status}];
}

void ServerMetrics::AddTokens(int64_t prompt_tokens, int64_t generation_tokens) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt_tokens;
  generation_tokens_ += generation_tokens;
}

void ServerMetrics::ObserveTimeToFirstToken(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(seconds);
}

void ServerMetrics::ObserveTimePerOutputToken(double seconds_per_token, uint64_t count) {
  std::lock_guard<std::mutex> lock(mu_);
  tpot_.Observe(seconds_per_token, count);
}

void ServerMetrics::ObserveEndToEnd(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  e2e_.Observe(seconds);
}

void ServerMetrics::CountFinished(FinishReason reason) {
  std::lock_guard<std::mutex> lock(mu_);
  ++finished_[std::string(FinishReasonName(reason))];
}

void ServerMetrics::SetModelName(std::string name) {
  // Prometheus label values escape backslash, quote and newline.
  std::string escaped;
  for (const char c : name) {
    if (c == '\\' || c == '"') escaped += '\\';
    if (c == '\n') {
      escaped += "\\n";
      continue;
    }
    escaped += c;
  }
  std::lock_guard<std::mutex> lock(mu_);
  model_label_ = "model_name=\"" + escaped + "\"";
}

int64_t ServerMetrics::prompt_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return prompt_tokens_;
}

int64_t ServerMetrics::generation_tokens() const {
  std::lock_guard<std::mutex> lock(mu_);
  return generation_tokens_;
}

std::string ServerMetrics::Render(const EngineStats& stats) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& model = model_label_;
  auto labelled = [&](std::string_view name, std::string_view type, std::string_view help, auto value) {
    Header(&out, name, type, help);
    out.append(name).append("{").append(model).append("} ");
    if constexpr (std::is_floating_point_v<decltype(value)>) {
      out.append(FormatDouble(value));
    } else {
      out.append(std::to_string(value));
    }
    out.append("\n");
  };

  labelled("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", stats.running);
  labelled("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", stats.waiting);
  const double usage = stats.kv_blocks_total > 0 ? static_cast<double>(stats.kv_blocks_used) /
                                                       static_cast<double>(stats.kv_blocks_total)
                                                 : 0.0;
  labelled("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", usage);
  labelled("vllm:num_preemptions_total", "counter", "Cumulative number of preemptions from the engine.",
           stats.preemptions);
  // Prefix cache (docs/prefix-caching.md), in tokens as vLLM counts them.
  labelled("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.",
           stats.prefix_cache_queries);
  labelled("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.",
           stats.prefix_cache_hits);
  labelled("kimirt_kda_snapshot_bytes", "gauge", "Device bytes of the prefix cache's KDA snapshots, per rank.",
           stats.kda_snapshot_bytes);
  labelled("kimirt_kv_cache_blocks_evictable", "gauge", "Latent blocks held only by the prefix cache (free for reuse).",
           stats.kv_blocks_evictable);
  labelled("vllm:prompt_tokens_total", "counter", "Number of prefill tokens processed.", prompt_tokens_);
  labelled("vllm:generation_tokens_total", "counter", "Number of generation tokens processed.", generation_tokens_);
  Header(&out, "vllm:request_success_total", "counter", "Count of successfully processed requests.");
  for (const auto& [reason, count] : finished_) {
    out.append("vllm:request_success_total{").append(model).append(",finished_reason=\"").append(reason);
    out.append("\"} ").append(std::to_string(count)).append("\n");
  }

  Header(&out, "vllm:time_to_first_token_seconds", "histogram", "Histogram of time to first token in seconds.");
  ttft_.Render("vllm:time_to_first_token_seconds", model, &out);
  Header(&out, "vllm:time_per_output_token_seconds", "histogram",
         "Histogram of time per output token in seconds (the gaps between consecutive tokens).");
  tpot_.Render("vllm:time_per_output_token_seconds", model, &out);
  Header(&out, "vllm:inter_token_latency_seconds", "histogram", "Histogram of inter-token latency in seconds.");
  tpot_.Render("vllm:inter_token_latency_seconds", model, &out);
  Header(&out, "vllm:e2e_request_latency_seconds", "histogram",
         "Histogram of e2e request latency in seconds.");
  e2e_.Render("vllm:e2e_request_latency_seconds", model, &out);

  Header(&out, "kimirt_http_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, count] : requests_) {
    out.append("kimirt_http_requests_total{endpoint=\"").append(key.first);
    out.append("\",status=\"").append(std::to_string(key.second)).append("\"} ");
    out.append(std::to_string(count)).append("\n");
  }
  Header(&out, "kimirt_kv_cache_blocks_used", "gauge", "MLA latent cache blocks in use.");
  Sample(&out, "kimirt_kv_cache_blocks_used", stats.kv_blocks_used);
  Header(&out, "kimirt_kv_cache_blocks_total", "gauge", "MLA latent cache blocks in all.");
  Sample(&out, "kimirt_kv_cache_blocks_total", stats.kv_blocks_total);
  Header(&out, "kimirt_state_slots_used", "gauge", "KDA state slots in use.");
  Sample(&out, "kimirt_state_slots_used", stats.state_slots_used);
  Header(&out, "kimirt_state_slots_total", "gauge", "KDA state slots in all.");
  Sample(&out, "kimirt_state_slots_total", stats.state_slots_total);
  return out;
}

}  // namespace kimirt
