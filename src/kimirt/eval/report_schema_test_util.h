// Test helper: the JSON outputs of `kimirt eval gsm8k` and `kimirt bench serve` checked against
// the schemas documented in docs/eval.md. A schema here is JSON: a string names the allowed
// types ("string", "integer", "number", "boolean", "array", "object", "null", joined by '|'),
// an object lists required keys (a key starting with '?' is optional), and a one-element array
// describes every element of an array.
#pragma once

#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

namespace kimirt::eval::testing {

inline bool HasType(const nlohmann::json& v, const std::string& types) {
  std::stringstream ss(types);
  std::string t;
  while (std::getline(ss, t, '|')) {
    if ((t == "string" && v.is_string()) || (t == "integer" && v.is_number_integer()) ||
        (t == "number" && v.is_number()) || (t == "boolean" && v.is_boolean()) || (t == "array" && v.is_array()) ||
        (t == "object" && v.is_object()) || (t == "null" && v.is_null())) {
      return true;
    }
  }
  return false;
}

inline void ExpectSchema(const nlohmann::json& v, const nlohmann::json& schema, const std::string& path = "$") {
  if (schema.is_string()) {
    EXPECT_TRUE(HasType(v, schema.get<std::string>())) << path << ": expected " << schema.get<std::string>() << ", got "
                                                       << v.dump().substr(0, 200);
    return;
  }
  if (schema.is_array()) {
    ASSERT_TRUE(v.is_array()) << path << ": expected an array";
    for (size_t i = 0; i < v.size(); ++i) ExpectSchema(v[i], schema[0], path + "[" + std::to_string(i) + "]");
    return;
  }
  if (v.is_null() && schema.contains("?null")) return;  // an object that may also be null
  ASSERT_TRUE(v.is_object()) << path << ": expected an object, got " << v.dump().substr(0, 200);
  for (auto it = schema.begin(); it != schema.end(); ++it) {
    std::string key = it.key();
    if (key == "?null") continue;
    const bool optional = key[0] == '?';
    if (optional) key = key.substr(1);
    if (!v.contains(key)) {
      EXPECT_TRUE(optional) << path << ": missing key \"" << key << "\"";
      continue;
    }
    ExpectSchema(v[key], it.value(), path + "." + key);
  }
}

// docs/eval.md, "kimirt.eval.gsm8k.v1".
inline nlohmann::json Gsm8kReportSchema() {
  const nlohmann::json filter = {{"extracted", "string"}, {"exact_match", "integer"}};
  const nlohmann::json summary = {{"exact_match", "number"}, {"exact_match_stderr", "number|null"}, {"correct", "integer"}};
  return {
      {"schema", "string"},
      {"task", "string"},
      {"task_version", "number"},
      {"created", "string"},
      {"config",
       {{"url", "string"}, {"api_url", "string"}, {"model", "string"}, {"endpoint", "string"},
        {"num_fewshot", "integer"}, {"fewshot_seed", "integer"}, {"fewshot_as_multiturn", "boolean"},
        {"limit", "integer|null"}, {"max_tokens", "integer"}, {"temperature", "number"},
        {"stop", nlohmann::json::array({"string"})}, {"seed", "integer"}, {"concurrency", "integer"},
        {"data_dir", "string"}, {"num_test_docs", "integer"}}},
      {"results", {{"strict-match", summary}, {"flexible-extract", summary}}},
      {"n_samples", "integer"},
      {"failed_requests", "integer"},
      {"wall_seconds", "number"},
      {"usage", {{"prompt_tokens", "integer"}, {"completion_tokens", "integer"}}},
      {"samples",
       nlohmann::json::array({{{"doc_id", "integer"},
                               {"fewshot_ids", nlohmann::json::array({"integer"})},
                               {"question", "string"},
                               {"target", "string"},
                               {"gold", "string"},
                               {"prompt", "string"},
                               {"messages", "array|null"},
                               {"output", "string"},
                               {"finish_reason", "string|null"},
                               {"usage", {{"?null", "null"}, {"prompt_tokens", "integer"}, {"completion_tokens", "integer"}}},
                               {"error", "string|null"},
                               {"attempts", "integer"},
                               {"latency_s", "number"},
                               {"filters", {{"strict-match", filter}, {"flexible-extract", filter}}}}})},
  };
}

// docs/eval.md, "kimirt.bench.serve.v1".
inline nlohmann::json BenchReportSchema() {
  nlohmann::json run = {
      {"max_concurrency", "integer|null"}, {"request_rate", "number|null"}, {"duration", "number"},
      {"completed", "integer"}, {"failed", "integer"}, {"total_input_tokens", "integer"},
      {"total_output_tokens", "integer"}, {"request_throughput", "number"}, {"input_throughput", "number"},
      {"output_throughput", "number"}, {"total_token_throughput", "number"}, {"max_output_tokens_per_s", "number"},
      {"max_concurrent_requests", "integer"}, {"errors", nlohmann::json::array({"string"})},
      {"server_metrics_note", "string"},
      {"server_metrics",
       {{"?null", "null"},
        {"ttft", "object|null"},
        {"itl", "object|null"},
        {"e2el", "object|null"}}},
      {"?input_lens", nlohmann::json::array({"integer"})}, {"?output_lens", nlohmann::json::array({"integer"})},
      {"?ttfts", nlohmann::json::array({"number"})}, {"?itls", nlohmann::json::array({nlohmann::json::array({"number"})})},
      {"?latencies", nlohmann::json::array({"number"})}, {"?start_times", nlohmann::json::array({"number"})},
      {"?queue_times", nlohmann::json::array({"number"})}, {"?request_errors", nlohmann::json::array({"string"})}};
  for (const char* m : {"ttft", "tpot", "itl", "e2el", "client_queue_time"}) {
    for (const char* s : {"mean", "median", "std", "p90", "p99"}) run[std::string(s) + "_" + m + "_ms"] = "number";
  }
  return {
      {"schema", "string"},
      {"created", "string"},
      {"config",
       {{"url", "string"}, {"api_url", "string"}, {"model", "string"}, {"endpoint", "string"}, {"dataset", "string"},
        {"input_len", "integer|null"}, {"output_len", "integer"}, {"random_range_ratio", "number"},
        {"num_prompts", "integer"}, {"request_rate", "number|null"}, {"max_concurrency", "integer|null"},
        {"sweep_concurrency", "array|null"}, {"seed", "integer"}, {"ignore_eos", "boolean"}, {"temperature", "number|null"},
        {"continuous_usage_stats", "boolean"}}},
      {"calibration",
       {{"?null", "null"},
        {"performed", "boolean"},
        {"intercept", "number"},
        {"slope", "number"},
        {"words_kept", "integer"},
        {"probes", nlohmann::json::array({{{"words", "integer"}, {"prompt_tokens", "integer"}}})},
        {"note", "string"}}},
      {"runs", nlohmann::json::array({run})},
  };
}

// The server-side histogram summary inside runs[].server_metrics.
inline nlohmann::json ServerHistogramSchema() {
  return {{"name", "string"}, {"count", "number"}, {"mean_ms", "number"},
          {"p50_ms_bucket", nlohmann::json::array({"number|null"})},
          {"p90_ms_bucket", nlohmann::json::array({"number|null"})},
          {"p99_ms_bucket", nlohmann::json::array({"number|null"})}};
}

}  // namespace kimirt::eval::testing
