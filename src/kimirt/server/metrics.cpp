// Prometheus text rendering of the server's counters, histograms and engine gauges (metrics.h).
#include "kimirt/server/metrics.h"

#include <algorithm>
#include <charconv>
#include <cmath>

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

void Histogram::Render(std::string_view name, std::string* out) const {
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= bounds_.size(); ++i) {
    cumulative += counts_[i];
    const std::string le = i < bounds_.size() ? FormatDouble(bounds_[i]) : "+Inf";
    out->append(name).append("_bucket{le=\"").append(le).append("\"} ");
    out->append(std::to_string(cumulative)).append("\n");
  }
  out->append(name).append("_sum ").append(FormatDouble(sum_)).append("\n");
  out->append(name).append("_count ").append(std::to_string(count_)).append("\n");
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

std::string ServerMetrics::Render(const EngineStats& stats) const {
  std::string out;
  std::lock_guard<std::mutex> lock(mu_);

  Header(&out, "kimirt_http_requests_total", "counter", "HTTP requests by endpoint and status code.");
  for (const auto& [key, count] : requests_) {
    out.append("kimirt_http_requests_total{endpoint=\"").append(key.first);
    out.append("\",status=\"").append(std::to_string(key.second)).append("\"} ");
    out.append(std::to_string(count)).append("\n");
  }
  Header(&out, "kimirt_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  Sample(&out, "kimirt_prompt_tokens_total", prompt_tokens_);
  Header(&out, "kimirt_generation_tokens_total", "counter", "Generated tokens of finished requests.");
  Sample(&out, "kimirt_generation_tokens_total", generation_tokens_);

  Header(&out, "kimirt_time_to_first_token_seconds", "histogram",
         "Time from request arrival to its first generated token.");
  ttft_.Render("kimirt_time_to_first_token_seconds", &out);
  Header(&out, "kimirt_time_per_output_token_seconds", "histogram",
         "Time between consecutive generated tokens of a request.");
  tpot_.Render("kimirt_time_per_output_token_seconds", &out);
  Header(&out, "kimirt_e2e_request_latency_seconds", "histogram",
         "Time from request arrival to its last token.");
  e2e_.Render("kimirt_e2e_request_latency_seconds", &out);

  Header(&out, "kimirt_num_requests_running", "gauge", "Sequences the engine is running.");
  Sample(&out, "kimirt_num_requests_running", stats.running);
  Header(&out, "kimirt_num_requests_waiting", "gauge", "Requests queued in the engine.");
  Sample(&out, "kimirt_num_requests_waiting", stats.waiting);
  Header(&out, "kimirt_kv_cache_blocks_used", "gauge", "MLA latent cache blocks in use.");
  Sample(&out, "kimirt_kv_cache_blocks_used", stats.kv_blocks_used);
  Header(&out, "kimirt_kv_cache_blocks_total", "gauge", "MLA latent cache blocks in all.");
  Sample(&out, "kimirt_kv_cache_blocks_total", stats.kv_blocks_total);
  Header(&out, "kimirt_state_slots_used", "gauge", "KDA state slots in use.");
  Sample(&out, "kimirt_state_slots_used", stats.state_slots_used);
  Header(&out, "kimirt_state_slots_total", "gauge", "KDA state slots in all.");
  Sample(&out, "kimirt_state_slots_total", stats.state_slots_total);
  Header(&out, "kimirt_preemptions_total", "counter", "Sequences preempted for lack of cache blocks.");
  Sample(&out, "kimirt_preemptions_total", stats.preemptions);
  return out;
}

}  // namespace kimirt
