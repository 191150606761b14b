#include "kimirt/eval/bench_metrics.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace kimirt::eval {

double Percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * static_cast<double>(v.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(rank));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  const double frac = rank - static_cast<double>(lo);
  return v[lo] + (v[hi] - v[lo]) * frac;
}

LatencyStats SummarizeMs(const std::vector<double>& seconds) {
  LatencyStats s;
  if (seconds.empty()) return s;
  double sum = 0;
  for (double x : seconds) sum += x;
  const double mean = sum / static_cast<double>(seconds.size());
  double ss = 0;
  for (double x : seconds) ss += (x - mean) * (x - mean);
  s.mean = mean * 1000;
  s.std = std::sqrt(ss / static_cast<double>(seconds.size())) * 1000;
  s.median = Percentile(seconds, 50) * 1000;
  s.p90 = Percentile(seconds, 90) * 1000;
  s.p99 = Percentile(seconds, 99) * 1000;
  return s;
}

MetricSamples CollectMetricSamples(const std::vector<RequestRecord>& records) {
  MetricSamples s;
  for (const RequestRecord& r : records) {
    if (!r.success) continue;
    if (r.output_tokens > 1) s.tpot.push_back((r.latency_s - r.ttft_s) / static_cast<double>(r.output_tokens - 1));
    s.itl.insert(s.itl.end(), r.itl_s.begin(), r.itl_s.end());
    s.ttft.push_back(r.ttft_s);
    s.e2el.push_back(r.latency_s);
    s.queue.push_back(r.start_s - r.arrival_s);
  }
  return s;
}

BenchMetrics ComputeBenchMetrics(const std::vector<RequestRecord>& records, double duration_s) {
  BenchMetrics m;
  m.duration_s = duration_s;
  std::vector<std::pair<double, int>> events;  // (time, +1 start / -1 end)
  double min_start = 0, max_end = 0;
  bool any = false;
  for (const RequestRecord& r : records) {
    if (!r.success) {
      ++m.failed;
      continue;
    }
    ++m.completed;
    m.total_input_tokens += r.prompt_tokens;
    m.total_output_tokens += r.output_tokens;
    events.emplace_back(r.start_s, +1);
    events.emplace_back(r.start_s + r.latency_s, -1);
    min_start = any ? std::min(min_start, r.start_s) : r.start_s;
    max_end = any ? std::max(max_end, r.start_s + r.latency_s) : r.start_s + r.latency_s;
    any = true;
  }
  if (duration_s > 0) {
    m.request_throughput = static_cast<double>(m.completed) / duration_s;
    m.input_throughput = static_cast<double>(m.total_input_tokens) / duration_s;
    m.output_throughput = static_cast<double>(m.total_output_tokens) / duration_s;
    m.total_token_throughput = static_cast<double>(m.total_input_tokens + m.total_output_tokens) / duration_s;
  }
  const MetricSamples samples = CollectMetricSamples(records);
  m.ttft = SummarizeMs(samples.ttft);
  m.tpot = SummarizeMs(samples.tpot);
  m.itl = SummarizeMs(samples.itl);
  m.e2el = SummarizeMs(samples.e2el);
  m.queue = SummarizeMs(samples.queue);

  if (any) {
    // Peak concurrency: a sweep over half-open [start, end) intervals, ends before starts on ties.
    std::sort(events.begin(), events.end());
    int64_t cur = 0;
    for (const auto& e : events) {
      cur += e.second;
      m.max_concurrent_requests = std::max(m.max_concurrent_requests, cur);
    }
    // Busiest second: token arrivals (start + ttft + running ITL sums) in whole-second buckets.
    const size_t buckets = static_cast<size_t>(std::ceil(max_end - min_start)) + 1;
    std::vector<double> per_second(buckets, 0.0);
    for (const RequestRecord& r : records) {
      if (!r.success) continue;
      double t = r.start_s + r.ttft_s;
      auto add = [&](double time) {
        const double b = std::floor(time - min_start);
        if (b >= 0 && b < static_cast<double>(buckets)) per_second[static_cast<size_t>(b)] += 1;
      };
      add(t);
      for (double gap : r.itl_s) {
        t += gap;
        add(t);
      }
    }
    m.max_output_tokens_per_s = *std::max_element(per_second.begin(), per_second.end());
  }
  return m;
}

}  // namespace kimirt::eval
