#include "kimirt/eval/bench_metrics.h"

#include <gtest/gtest.h>

namespace kimirt::eval {
namespace {

TEST(BenchMetrics, PercentileIsNumpyLinear) {
  // np.percentile([0.3, 0.1, 0.4, 0.15, 0.9, 0.26, 0.5], p) for p = 0, 50, 90, 99, 100
  const std::vector<double> v = {0.3, 0.1, 0.4, 0.15, 0.9, 0.26, 0.5};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 0.1);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 0.3);
  EXPECT_NEAR(Percentile(v, 90), 0.66, 1e-15);
  EXPECT_NEAR(Percentile(v, 99), 0.876, 1e-15);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 0.9);
  EXPECT_DOUBLE_EQ(Percentile({5.0}, 99), 5.0);
  EXPECT_DOUBLE_EQ(Percentile({1.0, 2.0}, 90), 1.9);
  EXPECT_EQ(Percentile({}, 50), 0.0);  // vLLM: np.percentile(x or 0, p)
}

TEST(BenchMetrics, SummaryIsInMillisecondsWithPopulationStd) {
  const LatencyStats s = SummarizeMs({0.3, 0.1, 0.4, 0.15, 0.9, 0.26, 0.5});
  EXPECT_NEAR(s.mean, 372.8571428571429, 1e-9);
  EXPECT_NEAR(s.std, 249.84076561535212, 1e-9);  // np.std (ddof 0)
  EXPECT_NEAR(s.median, 300, 1e-9);
  EXPECT_NEAR(s.p90, 660, 1e-9);
  EXPECT_NEAR(s.p99, 876, 1e-9);
}

TEST(BenchMetrics, RequestMetricsAsVllmComputesThem) {
  std::vector<RequestRecord> r(3);
  // Request 0: sent at 0, tokens at 0.1, 0.15, 0.25 → TTFT 0.1, ITL 0.05 and 0.1, E2EL 0.25,
  // TPOT (0.25 − 0.1) / (3 − 1) = 0.075.
  r[0].success = true;
  r[0].arrival_s = 0;
  r[0].start_s = 0;
  r[0].ttft_s = 0.1;
  r[0].itl_s = {0.05, 0.1};
  r[0].latency_s = 0.25;
  r[0].prompt_tokens = 10;
  r[0].output_tokens = 3;
  // Request 1: one token only → no TPOT; queued 0.5 s behind its arrival.
  r[1].success = true;
  r[1].arrival_s = 0.5;
  r[1].start_s = 1.0;
  r[1].ttft_s = 0.2;
  r[1].latency_s = 0.2;
  r[1].prompt_tokens = 20;
  r[1].output_tokens = 1;
  // Request 2 failed: it counts only as failed.
  r[2].error = "HTTP 500";
  r[2].prompt_tokens = 99;
  const BenchMetrics m = ComputeBenchMetrics(r, 2.0);
  EXPECT_EQ(m.completed, 2);
  EXPECT_EQ(m.failed, 1);
  EXPECT_EQ(m.total_input_tokens, 30);
  EXPECT_EQ(m.total_output_tokens, 4);
  EXPECT_DOUBLE_EQ(m.request_throughput, 1.0);
  EXPECT_DOUBLE_EQ(m.input_throughput, 15.0);
  EXPECT_DOUBLE_EQ(m.output_throughput, 2.0);
  EXPECT_DOUBLE_EQ(m.total_token_throughput, 17.0);
  EXPECT_NEAR(m.ttft.mean, 150, 1e-9);
  EXPECT_NEAR(m.tpot.mean, 75, 1e-9);
  EXPECT_NEAR(m.itl.mean, 75, 1e-9);
  EXPECT_NEAR(m.itl.median, 75, 1e-9);
  EXPECT_NEAR(m.e2el.mean, 225, 1e-9);
  EXPECT_NEAR(m.queue.mean, 250, 1e-9);
  EXPECT_EQ(m.max_concurrent_requests, 1);  // [0, 0.25) and [1.0, 1.2) never overlap
  EXPECT_EQ(m.max_output_tokens_per_s, 3);  // all three tokens of request 0 in second 0
}

TEST(BenchMetrics, PeakConcurrencyTreatsEndsBeforeStarts) {
  std::vector<RequestRecord> r(3);
  for (RequestRecord& x : r) {
    x.success = true;
    x.output_tokens = 1;
  }
  r[0].start_s = 0;
  r[0].latency_s = 1;  // [0, 1)
  r[1].start_s = 1;
  r[1].latency_s = 1;  // [1, 2): touches r0 only at 1
  r[2].start_s = 0.5;
  r[2].latency_s = 1;  // [0.5, 1.5)
  EXPECT_EQ(ComputeBenchMetrics(r, 2).max_concurrent_requests, 2);
}

}  // namespace
}  // namespace kimirt::eval
