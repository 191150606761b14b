// Prometheus text format of the server metrics.
#include "kimirt/server/metrics.h"

#include <gtest/gtest.h>

#include <sstream>

#include "kimirt/engine/engine.h"

namespace kimirt {
namespace {

std::vector<std::string> Lines(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool Has(const std::string& text, const std::string& line) {
  for (const std::string& l : Lines(text)) {
    if (l == line) return true;
  }
  return false;
}

TEST(Histogram, BucketsAreCumulativeWithInf) {
  Histogram h({0.1, 1.0, 10.0});
  h.Observe(0.05);
  h.Observe(0.1);  // le is inclusive
  h.Observe(0.5, 3);
  h.Observe(100.0);
  std::string out;
  h.Render("lat", "", &out);
  EXPECT_EQ(out,
            "lat_bucket{le=\"0.1\"} 2\n"
            "lat_bucket{le=\"1\"} 5\n"
            "lat_bucket{le=\"10\"} 5\n"
            "lat_bucket{le=\"+Inf\"} 6\n"
            "lat_sum 101.65\n"
            "lat_count 6\n");
}

TEST(ServerMetrics, TextFormat) {
  ServerMetrics m;
  m.SetModelName("kimi");
  m.SetKnownEndpoints({"/v1/completions"});
  m.CountFinished(FinishReason::kStop);
  m.CountFinished(FinishReason::kStop);
  m.CountFinished(FinishReason::kLength);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 200);
  m.CountRequest("/v1/completions", 400);
  m.CountRequest("/random/probe", 404);
  m.AddTokens(10, 5);
  m.AddTokens(1, 2);
  m.ObserveTimeToFirstToken(0.003);
  m.ObserveTimePerOutputToken(0.02, 4);
  m.ObserveEndToEnd(2.0);
  EngineStats s;
  s.running = 3;
  s.waiting = 1;
  s.kv_blocks_used = 7;
  s.kv_blocks_total = 100;
  s.state_slots_used = 3;
  s.state_slots_total = 64;
  s.preemptions = 2;
  s.prefix_cache_queries = 1500;
  s.prefix_cache_hits = 1024;
  s.kda_snapshot_bytes = 4096;
  s.kv_blocks_evictable = 5;
  const std::string text = m.Render(s);

  EXPECT_TRUE(Has(text, "kimirt_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 2"));
  EXPECT_TRUE(Has(text, "kimirt_http_requests_total{endpoint=\"/v1/completions\",status=\"400\"} 1"));
  EXPECT_TRUE(Has(text, "kimirt_http_requests_total{endpoint=\"other\",status=\"404\"} 1"));
  // vLLM's names and model_name label (issue 11), so vLLM dashboards read kimirt unchanged.
  EXPECT_TRUE(Has(text, "vllm:prompt_tokens_total{model_name=\"kimi\"} 11"));
  EXPECT_TRUE(Has(text, "vllm:generation_tokens_total{model_name=\"kimi\"} 7"));
  EXPECT_TRUE(Has(text, "vllm:request_success_total{model_name=\"kimi\",finished_reason=\"stop\"} 2"));
  EXPECT_TRUE(Has(text, "vllm:request_success_total{model_name=\"kimi\",finished_reason=\"length\"} 1"));
  EXPECT_TRUE(Has(text, "vllm:time_to_first_token_seconds_bucket{model_name=\"kimi\",le=\"0.001\"} 0"));
  EXPECT_TRUE(Has(text, "vllm:time_to_first_token_seconds_bucket{model_name=\"kimi\",le=\"0.005\"} 1"));
  EXPECT_TRUE(Has(text, "vllm:time_to_first_token_seconds_count{model_name=\"kimi\"} 1"));
  EXPECT_TRUE(Has(text, "vllm:time_per_output_token_seconds_bucket{model_name=\"kimi\",le=\"+Inf\"} 4"));
  EXPECT_TRUE(Has(text, "vllm:inter_token_latency_seconds_bucket{model_name=\"kimi\",le=\"+Inf\"} 4"));
  EXPECT_TRUE(Has(text, "vllm:inter_token_latency_seconds_sum{model_name=\"kimi\"} 0.08"));
  EXPECT_TRUE(Has(text, "vllm:e2e_request_latency_seconds_bucket{model_name=\"kimi\",le=\"1.5\"} 0"));
  EXPECT_TRUE(Has(text, "vllm:e2e_request_latency_seconds_bucket{model_name=\"kimi\",le=\"2\"} 1"));
  EXPECT_TRUE(Has(text, "vllm:num_requests_running{model_name=\"kimi\"} 3"));
  EXPECT_TRUE(Has(text, "vllm:num_requests_waiting{model_name=\"kimi\"} 1"));
  EXPECT_TRUE(Has(text, "vllm:kv_cache_usage_perc{model_name=\"kimi\"} 0.07"));
  EXPECT_TRUE(Has(text, "vllm:num_preemptions_total{model_name=\"kimi\"} 2"));
  EXPECT_TRUE(Has(text, "vllm:prefix_cache_queries_total{model_name=\"kimi\"} 1500"));
  EXPECT_TRUE(Has(text, "vllm:prefix_cache_hits_total{model_name=\"kimi\"} 1024"));
  EXPECT_TRUE(Has(text, "kimirt_kda_snapshot_bytes{model_name=\"kimi\"} 4096"));
  EXPECT_TRUE(Has(text, "kimirt_kv_cache_blocks_evictable{model_name=\"kimi\"} 5"));
  EXPECT_TRUE(Has(text, "kimirt_kv_cache_blocks_used 7"));
  EXPECT_TRUE(Has(text, "kimirt_kv_cache_blocks_total 100"));
  EXPECT_TRUE(Has(text, "kimirt_state_slots_used 3"));
  EXPECT_TRUE(Has(text, "kimirt_state_slots_total 64"));

  // Every metric family has HELP then TYPE before its samples, and every sample line belongs to
  // a declared family; histogram buckets never decrease.
  std::string family;
  int64_t last_bucket = -1;
  int families = 0;
  const std::vector<std::string> lines = Lines(text);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& l = lines[i];
    if (l.rfind("# HELP ", 0) == 0) {
      family = l.substr(7, l.find(' ', 7) - 7);
      ASSERT_LT(i + 1, lines.size());
      EXPECT_EQ(lines[i + 1].rfind("# TYPE " + family + " ", 0), 0u) << l;
      ++families;
      last_bucket = -1;
      continue;
    }
    if (l.rfind("# TYPE ", 0) == 0) continue;
    ASSERT_FALSE(family.empty()) << l;
    EXPECT_EQ(l.rfind(family, 0), 0u) << l << " outside family " << family;
    if (l.find("_bucket{") != std::string::npos) {
      const int64_t v = std::stoll(l.substr(l.rfind(' ') + 1));
      EXPECT_GE(v, last_bucket) << l;
      last_bucket = v;
    }
  }
  EXPECT_EQ(families, 20);  // 16, and the prefix cache's 4
  EXPECT_EQ(text.back(), '\n');
}

}  // namespace
}  // namespace kimirt
