// `kimirt eval gsm8k`: runs lm-eval's gsm8k task (gsm8k.h, gsm8k_scoring.h) against an
// OpenAI-compatible server and reports per-sample results and the two scores with lm-eval's
// standard errors. The JSON report's schema is in docs/eval.md ("kimirt.eval.gsm8k.v1").
//
// Requests are what lm-eval's API models send (EleutherAI/lm-evaluation-harness:
// lm_eval/models/openai_completions.py _create_payload, with tokenizer_backend=None so that no
// EOS string is appended to the stops):
//   completions: {"prompt", "model", "max_tokens": 256, "temperature": 0.0, "stop": [...], "seed": 1234}
//   chat:        {"messages", "model", "max_tokens": 256, "temperature": 0.0, "stop": [...], "seed": 1234}
// Replies are scored as returned (lm-eval does not cut completions at the stops itself).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/core/status.h"
#include "kimirt/eval/gsm8k.h"
#include "kimirt/eval/gsm8k_scoring.h"
#include "kimirt/eval/openai_client.h"

namespace kimirt::eval {

struct Gsm8kEvalOptions {
  std::string url;                    // --url
  std::string model;                  // empty: the first model of GET /v1/models
  std::string endpoint = "completions";  // completions | chat
  int num_fewshot = kGsm8kNumFewshot;
  int64_t limit = -1;                 // first N test documents; -1: all 1319
  int concurrency = 8;
  int max_tokens = kGsm8kMaxGenToks;
  uint64_t fewshot_seed = kGsm8kFewshotSeed;
  int64_t request_seed = kGsm8kRequestSeed;
  bool fewshot_as_multiturn = true;   // chat only
  int max_retries = 3;                // attempts per request (lm-eval: max_retries=3)
  HttpOptions http;
  bool progress = true;               // progress bar on stderr
};

struct Gsm8kSample {
  Gsm8kPrompt prompt;
  std::string question;
  std::string target;        // the full reference answer
  std::string output;        // the generated text as returned
  std::string finish_reason;
  Usage usage;
  std::string error;         // empty unless every attempt failed
  int attempts = 0;
  double latency_s = 0;
  Gsm8kScore score;
};

struct Gsm8kFilterSummary {
  double exact_match = 0;
  double stderr_ = 0;  // NaN when fewer than 2 samples
  int64_t correct = 0;
};

struct Gsm8kReport {
  Gsm8kEvalOptions options;  // as run (model resolved)
  std::string api_url;
  std::string data_dir;
  size_t num_test_docs = 0;
  std::string created_utc;
  std::vector<Gsm8kSample> samples;
  Gsm8kFilterSummary strict_match;
  Gsm8kFilterSummary flexible_extract;
  int64_t failed_requests = 0;
  double wall_s = 0;
};

// The request body for one prompt (exposed for tests).
nlohmann::json Gsm8kRequestBody(const Gsm8kEvalOptions& o, const Gsm8kPrompt& p);

// Model name: `requested`, or the first id the server lists.
Result<std::string> ResolveModelName(OpenAiClient& client, const std::string& requested);

Result<Gsm8kReport> RunGsm8kEval(const Gsm8kEvalOptions& options, const Gsm8kData& data);

nlohmann::json Gsm8kReportToJson(const Gsm8kReport& report);
// lm-eval's results table (lm_eval/utils.py make_table), for people.
std::string FormatGsm8kTable(const Gsm8kReport& report);

}  // namespace kimirt::eval
