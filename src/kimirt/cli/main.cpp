// kimirt: inference engine and OpenAI-compatible server for Kimi-K3 and Kimi-Linear.
#include <cstdio>
#include <cstring>
#include <string>

#include "kimirt/cli/commands.h"
#include "kimirt/engine/process_ranks_runner.h"
#include "kimirt/server/version.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: kimirt <command> [flags]\n\n"
               "commands:\n"
               "  serve            OpenAI-compatible server (built-in demo model without --model)\n"
               "  plan             capacity planner: per-GPU weights, runtime state and fit\n"
               "  make-checkpoint  write a config's checkpoint (sparse or random) as safetensors\n"
               "  generate         greedy continuation of token ids (CPU reference)\n"
               "  tokenize         token ids of a text or of a rendered chat request\n"
               "  detokenize       text of token ids\n"
               "  eval gsm8k       GSM8K 5-shot as lm-eval runs it, against any OpenAI-compatible server\n"
               "  bench serve      load generator with vllm bench serve's metrics\n"
               "  bench model      the engine in-process: prefill tokens/s, decode step time\n"
               "  logits           FP32 logits of every position, as safetensors\n"
               "  dist-check       start -tp × -pp ranks (one process each) and check rendezvous and NCCL\n\n"
               "`kimirt <command> --help` lists a command's flags; `kimirt --version` prints the version.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "serve") return kimirt::RunServeCommand(argc, argv);
  if (cmd == "plan") return kimirt::RunPlanCommand(argc, argv);
  if (cmd == "make-checkpoint") return kimirt::RunMakeCheckpointCommand(argc, argv);
  if (cmd == "generate") return kimirt::RunGenerateCommand(argc, argv);
  if (cmd == "tokenize") return kimirt::RunTokenizeCommand(argc, argv);
  if (cmd == "eval") return kimirt::RunEvalCommand(argc, argv);
  if (cmd == "bench") return kimirt::RunBenchCommand(argc, argv);
  if (cmd == "detokenize") return kimirt::RunDetokenizeCommand(argc, argv);
  if (cmd == "logits") return kimirt::RunLogitsCommand(argc, argv);
  // Hidden: a follower rank of `serve --distributed-executor-backend mp` (process_ranks_runner.h).
  if (cmd == "rank-worker") return kimirt::RunProcessRankWorker();
  if (cmd == "dist-check") return kimirt::RunDistCheckCommand(argc, argv);
  if (cmd == "--version" || cmd == "-V" || cmd == "version") {
    std::printf("kimirt %.*s\n", static_cast<int>(kimirt::kKimirtVersion.size()), kimirt::kKimirtVersion.data());
    return 0;
  }
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    Usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "kimirt: unknown command \"%s\"\n\n", cmd.c_str());
  Usage(stderr);
  return 2;
}
