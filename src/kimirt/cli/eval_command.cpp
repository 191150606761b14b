// `kimirt eval gsm8k`: flags → Gsm8kEvalOptions → RunGsm8kEval → lm-eval's table, and the JSON
// report (--output FILE, or --json for stdout). Exit 1 when any request failed after retries.
#include <cstdio>
#include <fstream>
#include <string>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/eval/gsm8k.h"
#include "kimirt/eval/gsm8k_eval.h"

namespace kimirt {
namespace {

int RunEvalGsm8k(int argc, char** argv) {
  eval::Gsm8kEvalOptions o;
  std::string output, data_dir;
  int64_t fewshot_seed = static_cast<int64_t>(o.fewshot_seed);
  double timeout = o.http.read_timeout_s;
  bool json = false;

  FlagSet flags("eval gsm8k",
                "GSM8K as lm-eval's gsm8k task runs it (5-shot, greedy, strict-match and flexible-extract),\n"
                "against any OpenAI-compatible server. See docs/eval.md.");
  flags.String("url,base-url", &o.url, "server base URL: http://host:port or http://host:port/v1 (required)");
  flags.String("model", &o.model, "model name to request (default: the first of GET /v1/models)");
  flags.String("endpoint", &o.endpoint,
               "completions (lm-eval local-completions) or chat (local-chat-completions --apply_chat_template)");
  flags.Int("num-fewshot", &o.num_fewshot, "few-shot examples per prompt");
  flags.Int("limit", &o.limit, "evaluate the first N test problems (-1: all 1319)");
  flags.Int("concurrency,num-concurrent", &o.concurrency, "requests in flight at once");
  flags.Int("max-tokens,max-gen-toks", &o.max_tokens, "max_tokens of each request (lm-eval: 256)");
  flags.Int("fewshot-seed", &fewshot_seed, "seed of the few-shot sampler (lm-eval: 1234)");
  flags.Int("seed", &o.request_seed, "`seed` sent with each request (lm-eval: 1234)");
  flags.Bool("fewshot-as-multiturn", &o.fewshot_as_multiturn,
             "chat: few-shot examples as user/assistant turns (lm-eval's default with a chat template)");
  flags.String("data-dir", &data_dir, "directory with GSM8K train.jsonl and test.jsonl (default: the repo's data/gsm8k)");
  flags.String("output,o", &output, "write the JSON report (per-sample prompts, outputs, scores) to FILE");
  flags.Bool("json", &json, "print the JSON report on stdout instead of the table");
  flags.Double("timeout", &timeout, "seconds a response may stay silent before the request fails");
  flags.Int("max-retries", &o.max_retries, "attempts per request (transport errors and HTTP 5xx are retried)");
  flags.Bool("progress", &o.progress, "progress bar with live accuracy on stderr");

  if (Status s = flags.Parse(argc, argv, 3, nullptr); !s.ok()) {
    std::fprintf(stderr, "kimirt eval gsm8k: %s\n", s.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kimirt eval gsm8k: %s\n", s.message().c_str());
    return 1;
  };
  if (o.url.empty()) {
    std::fprintf(stderr, "kimirt eval gsm8k: --url is required (e.g. --url http://127.0.0.1:8000)\n");
    return 2;
  }
  if (fewshot_seed < 0) return fail(InvalidArgument("--fewshot-seed must be >= 0"));
  if (!(timeout > 0)) return fail(InvalidArgument("--timeout must be > 0"));
  o.fewshot_seed = static_cast<uint64_t>(fewshot_seed);
  o.http.read_timeout_s = timeout;

  if (data_dir.empty()) data_dir = eval::DefaultGsm8kDataDir(argv[0]);
  if (data_dir.empty()) {
    return fail(NotFound("no GSM8K data found (looked for data/gsm8k beside the binary and in the source tree, "
                         "and ../shared/data/gsm8k); give --data-dir"));
  }
  Result<eval::Gsm8kData> data = eval::LoadGsm8k(data_dir);
  if (!data.ok()) return fail(data.status());

  Result<eval::Gsm8kReport> report = eval::RunGsm8kEval(o, *data);
  if (!report.ok()) return fail(report.status());
  const nlohmann::json j = eval::Gsm8kReportToJson(*report);
  if (!output.empty()) {
    std::ofstream f(output, std::ios::binary);
    f << j.dump(2) << "\n";
    if (!f) return fail(IoError(output + ": cannot write the report"));
  }
  if (json) {
    std::fputs((j.dump(2) + "\n").c_str(), stdout);
  } else {
    std::fputs(eval::FormatGsm8kTable(*report).c_str(), stdout);
    if (!output.empty()) std::printf("report: %s\n", output.c_str());
  }
  if (report->failed_requests > 0) {
    std::fprintf(stderr, "kimirt eval gsm8k: %lld request(s) failed after %d attempt(s); they count as wrong. First: %s\n",
                 static_cast<long long>(report->failed_requests), o.max_retries, [&] {
                   for (const auto& s : report->samples) {
                     if (!s.error.empty()) return s.error;
                   }
                   return std::string();
                 }().c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int RunEvalCommand(int argc, char** argv) {
  const std::string mode = argc >= 3 ? argv[2] : "";
  if (mode == "gsm8k") return RunEvalGsm8k(argc, argv);
  if (mode == "--help" || mode == "-h" || mode == "help") {
    std::printf("usage: kimirt eval <task> [flags]\n\ntasks:\n  gsm8k   GSM8K 5-shot as lm-eval's gsm8k task\n");
    return 0;
  }
  std::fprintf(stderr, "kimirt eval: unknown task \"%s\" (known: gsm8k)\n", mode.c_str());
  return 2;
}

}  // namespace kimirt
