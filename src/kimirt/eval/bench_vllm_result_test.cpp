// The vLLM --save-result shape of a bench serve run: vLLM's key names, percentiles as asked,
// values from the same statistics as kimirt's own report.
#include "kimirt/eval/bench_vllm_result.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kimirt::eval {
namespace {

BenchServeReport TwoRequestReport() {
  BenchServeReport r;
  r.options.model = "org/kimi-k3";
  r.options.num_prompts = 2;
  BenchRun run;
  run.request_rate = std::numeric_limits<double>::infinity();
  run.max_concurrency = 4;
  RequestRecord a;
  a.success = true;
  a.ttft_s = 0.1;
  a.latency_s = 0.4;
  a.itl_s = {0.1, 0.2};
  a.prompt_tokens = 10;
  a.output_tokens = 3;
  RequestRecord b = a;
  b.ttft_s = 0.3;
  b.latency_s = 0.5;
  b.itl_s = {0.2};
  b.output_tokens = 2;
  run.records = {a, b};
  run.metrics = ComputeBenchMetrics(run.records, 2.0);
  r.runs.push_back(run);
  return r;
}

TEST(BenchVllmResult, KeysAsVllmNamesThem) {
  const BenchServeReport r = TwoRequestReport();
  VllmResultOptions o;
  o.percentile_metrics = {"ttft", "tpot", "itl", "e2el"};
  o.metric_percentiles = {50, 90, 99.9};
  const auto j = VllmResultJson(r, r.runs[0], o);
  EXPECT_EQ(j["completed"], 2);
  EXPECT_EQ(j["total_input_tokens"], 20);
  EXPECT_EQ(j["total_output_tokens"], 5);
  EXPECT_DOUBLE_EQ(j["request_throughput"].get<double>(), 1.0);
  EXPECT_DOUBLE_EQ(j["output_throughput"].get<double>(), 2.5);
  EXPECT_EQ(j["request_rate"], "inf");
  EXPECT_EQ(j["max_concurrency"], 4);
  EXPECT_EQ(j["model_id"], "org/kimi-k3");
  // ttft 0.1, 0.3 s: mean 200 ms, median 200, numpy's p90 by linear interpolation 280.
  EXPECT_NEAR(j["mean_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["median_ttft_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["std_ttft_ms"].get<double>(), 100, 1e-9);
  EXPECT_NEAR(j["p90_ttft_ms"].get<double>(), 280, 1e-9);
  EXPECT_TRUE(j.contains("p50_ttft_ms"));
  EXPECT_TRUE(j.contains("p99.9_ttft_ms"));
  // tpot: (0.4 − 0.1) / 2 = 150 ms and (0.5 − 0.3) / 1 = 200 ms.
  EXPECT_NEAR(j["mean_tpot_ms"].get<double>(), 175, 1e-9);
  // itl pooled: 100, 200, 200 ms.
  EXPECT_NEAR(j["median_itl_ms"].get<double>(), 200, 1e-9);
  EXPECT_NEAR(j["mean_e2el_ms"].get<double>(), 450, 1e-9);
  EXPECT_FALSE(j.contains("p99_ttft_ms"));
  EXPECT_FALSE(j.contains("ttfts"));  // per-request arrays only with --save-detailed

  // vLLM's defaults: ttft, tpot, itl at p99; no e2el.
  const auto d = VllmResultJson(r, r.runs[0], {});
  EXPECT_TRUE(d.contains("p99_tpot_ms"));
  EXPECT_FALSE(d.contains("mean_e2el_ms"));
}

TEST(BenchVllmResult, FlagsAndFileName) {
  EXPECT_EQ(*ParsePercentileMetrics("ttft,tpot,itl,e2el"), (std::vector<std::string>{"ttft", "tpot", "itl", "e2el"}));
  EXPECT_FALSE(ParsePercentileMetrics("ttft,latency").ok());
  EXPECT_EQ(*ParseMetricPercentiles("50,90,99"), (std::vector<double>{50, 90, 99}));
  EXPECT_FALSE(ParseMetricPercentiles("50,100").ok());
  EXPECT_FALSE(ParseMetricPercentiles("x").ok());
  const BenchServeReport r = TwoRequestReport();
  const std::string name = VllmResultFileName(r, r.runs[0]);
  EXPECT_EQ(name.rfind("openai-infqps-concurrency4-kimi-k3-", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - 5), ".json");
}

}  // namespace
}  // namespace kimirt::eval
