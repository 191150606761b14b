// vLLM-shaped bench serve results (bench_vllm_result.h).
#include "kimirt/eval/bench_vllm_result.h"

#include <cmath>
#include <cstdio>
#include <ctime>
#include <sstream>

namespace kimirt::eval {
namespace {

using OJson = nlohmann::ordered_json;

// vLLM: str(int(p)) if int(p) == p else str(p).
std::string PercentileWord(double p) {
  if (p == std::floor(p)) return std::to_string(static_cast<long long>(p));
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", p);
  return buf;
}

std::vector<std::string> SplitComma(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  for (std::string part; std::getline(ss, part, ',');) {
    while (!part.empty() && part.front() == ' ') part.erase(part.begin());
    while (!part.empty() && part.back() == ' ') part.pop_back();
    out.push_back(part);
  }
  return out;
}

// "20250101-120000", the local time as vLLM's datetime.now().strftime("%Y%m%d-%H%M%S").
std::string DateStamp() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y%m%d-%H%M%S", &tm);
  return buf;
}

OJson RateJson(double rate) { return std::isinf(rate) ? OJson("inf") : OJson(rate); }

}  // namespace

Result<std::vector<std::string>> ParsePercentileMetrics(const std::string& text) {
  std::vector<std::string> out = SplitComma(text);
  if (out.empty()) return InvalidArgument("--percentile-metrics: empty list");
  for (const std::string& m : out) {
    if (m != "ttft" && m != "tpot" && m != "itl" && m != "e2el") {
      return InvalidArgument("--percentile-metrics: \"" + m + "\" is not one of ttft, tpot, itl, e2el");
    }
  }
  return out;
}

Result<std::vector<double>> ParseMetricPercentiles(const std::string& text) {
  std::vector<double> out;
  for (const std::string& part : SplitComma(text)) {
    char* end = nullptr;
    const double p = std::strtod(part.c_str(), &end);
    if (part.empty() || end != part.c_str() + part.size() || !(p > 0 && p < 100)) {
      return InvalidArgument("--metric-percentiles: expected numbers in (0, 100) separated by commas, got \"" + text + "\"");
    }
    out.push_back(p);
  }
  if (out.empty()) return InvalidArgument("--metric-percentiles: empty list");
  return out;
}

OJson VllmResultJson(const BenchServeReport& report, const BenchRun& run, const VllmResultOptions& options) {
  const BenchServeOptions& o = report.options;
  const BenchMetrics& m = run.metrics;
  OJson j = OJson::object();
  j["date"] = DateStamp();
  j["endpoint_type"] = "openai";
  j["label"] = nullptr;
  j["model_id"] = o.model;
  j["tokenizer_id"] = o.model;
  j["num_prompts"] = o.num_prompts;
  j["request_rate"] = RateJson(run.request_rate);
  j["burstiness"] = 1.0;  // Poisson arrivals, vLLM's default
  j["max_concurrency"] = run.max_concurrency > 0 ? OJson(run.max_concurrency) : OJson(nullptr);
  j["duration"] = m.duration_s;
  j["completed"] = m.completed;
  j["failed"] = m.failed;
  j["total_input_tokens"] = m.total_input_tokens;
  j["total_output_tokens"] = m.total_output_tokens;
  j["request_throughput"] = m.request_throughput;
  j["request_goodput"] = nullptr;
  j["output_throughput"] = m.output_throughput;
  j["total_token_throughput"] = m.total_token_throughput;
  const MetricSamples samples = CollectMetricSamples(run.records);
  for (const std::string& name : options.percentile_metrics) {
    const std::vector<double>& v = name == "ttft"   ? samples.ttft
                                   : name == "tpot" ? samples.tpot
                                   : name == "itl"  ? samples.itl
                                                    : samples.e2el;
    const LatencyStats s = SummarizeMs(v);
    j["mean_" + name + "_ms"] = s.mean;
    j["median_" + name + "_ms"] = s.median;
    j["std_" + name + "_ms"] = s.std;
    for (double p : options.metric_percentiles) {
      j["p" + PercentileWord(p) + "_" + name + "_ms"] = Percentile(v, p) * 1000;
    }
  }
  j["max_output_tokens_per_s"] = m.max_output_tokens_per_s;
  j["max_concurrent_requests"] = m.max_concurrent_requests;
  if (o.detailed) {
    OJson in = OJson::array(), out = OJson::array(), ttfts = OJson::array(), itls = OJson::array(),
          texts = OJson::array(), errors = OJson::array();
    for (const RequestRecord& r : run.records) {
      in.push_back(r.prompt_tokens);
      out.push_back(r.success ? r.output_tokens : 0);
      ttfts.push_back(r.success ? r.ttft_s : 0.0);
      itls.push_back(r.itl_s);
      texts.push_back(r.text);
      errors.push_back(r.error);
    }
    j["input_lens"] = std::move(in);
    j["output_lens"] = std::move(out);
    j["ttfts"] = std::move(ttfts);
    j["itls"] = std::move(itls);
    j["generated_texts"] = std::move(texts);
    j["errors"] = std::move(errors);
  }
  return j;
}

std::string VllmResultFileName(const BenchServeReport& report, const BenchRun& run) {
  std::string model = report.options.model;
  const size_t slash = model.rfind('/');
  if (slash != std::string::npos) model = model.substr(slash + 1);
  // Python's str(float): "inf", "10.0", "2.5".
  const double r = run.request_rate;
  const std::string rate = std::isinf(r) ? "inf" : r == std::floor(r) ? PercentileWord(r) + ".0" : PercentileWord(r);
  std::string name = "openai-" + rate + "qps";
  if (run.max_concurrency > 0) name += "-concurrency" + std::to_string(run.max_concurrency);
  return name + "-" + model + "-" + DateStamp() + ".json";
}

}  // namespace kimirt::eval
