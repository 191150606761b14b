#include "kimirt/eval/prometheus_histograms.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kimirt::eval {
namespace {

const char* kBefore =
    "# HELP kimirt_time_to_first_token_seconds TTFT.\n"
    "# TYPE kimirt_time_to_first_token_seconds histogram\n"
    "kimirt_time_to_first_token_seconds_bucket{le=\"0.01\"} 1\n"
    "kimirt_time_to_first_token_seconds_bucket{le=\"0.1\"} 2\n"
    "kimirt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 2\n"
    "kimirt_time_to_first_token_seconds_sum 0.06\n"
    "kimirt_time_to_first_token_seconds_count 2\n"
    "kimirt_prompt_tokens_total 50\n";

// vLLM style: a colon in the name, a model label, two label sets summed.
const char* kAfter =
    "kimirt_time_to_first_token_seconds_bucket{le=\"0.01\"} 1\n"
    "kimirt_time_to_first_token_seconds_bucket{le=\"0.1\"} 6\n"
    "kimirt_time_to_first_token_seconds_bucket{le=\"+Inf\"} 7\n"
    "kimirt_time_to_first_token_seconds_sum 0.56\n"
    "kimirt_time_to_first_token_seconds_count 7\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"1.0\"} 3 1700000000\n"
    "vllm:e2e_request_latency_seconds_bucket{le=\"1.0\",model_name=\"n\"} 1\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 4\n"
    "vllm:e2e_request_latency_seconds_bucket{model_name=\"n\",le=\"+Inf\"} 1\n"
    "vllm:e2e_request_latency_seconds_sum{model_name=\"m\"} 3.5\n"
    "vllm:e2e_request_latency_seconds_count{model_name=\"m\"} 4\n";

TEST(PromHistograms, ParsesDeltasAndQuantileBuckets) {
  const auto before = ParsePromHistograms(kBefore);
  const auto after = ParsePromHistograms(kAfter);
  ASSERT_EQ(before.size(), 1u);  // the counter is not a histogram
  ASSERT_EQ(after.size(), 2u);
  std::string name;
  const PromHistogram* ttft = FindHistogram(after, {"time_to_first_token_seconds"}, &name);
  ASSERT_NE(ttft, nullptr);
  EXPECT_EQ(name, "kimirt_time_to_first_token_seconds");
  const PromHistogram d = HistogramDelta(*ttft, &before.at(name));
  EXPECT_DOUBLE_EQ(d.count, 5);
  EXPECT_NEAR(d.sum, 0.5, 1e-12);
  EXPECT_EQ(d.cumulative, (std::vector<double>{0, 4, 5}));
  // Median of 5 is the 2.5th observation: in (0.01, 0.1]; p99 beyond the last finite bound.
  EXPECT_EQ(QuantileBucket(d, 0.5), std::make_pair(0.01, 0.1));
  const auto p99 = QuantileBucket(d, 0.99);
  EXPECT_EQ(p99.first, 0.1);
  EXPECT_TRUE(std::isinf(p99.second));

  const PromHistogram* e2e = FindHistogram(after, {"e2e_request_latency_seconds"}, &name);
  ASSERT_NE(e2e, nullptr);
  EXPECT_EQ(name, "vllm:e2e_request_latency_seconds");
  EXPECT_EQ(e2e->cumulative, (std::vector<double>{4, 5}));  // label sets summed
  EXPECT_DOUBLE_EQ(e2e->count, 4);
  EXPECT_TRUE(std::isnan(QuantileBucket(PromHistogram{}, 0.5).first));
}

}  // namespace
}  // namespace kimirt::eval
