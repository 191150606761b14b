// kimirt: inference engine and OpenAI-compatible server for Kimi-K3 and Kimi-Linear.
#include <cstdio>
#include <cstring>
#include <string>

#include "kimirt/cli/commands.h"

namespace {

void Usage(FILE* out) {
  std::fprintf(out,
               "usage: kimirt <command> [flags]\n\n"
               "commands:\n"
               "  plan             capacity planner: per-GPU weights, runtime state and fit\n"
               "  make-checkpoint  write a config's checkpoint (sparse or random) as safetensors\n"
               "  generate         greedy continuation of token ids (CPU reference)\n"
               "  logits           FP32 logits of every position, as safetensors\n\n"
               "`kimirt <command> --help` lists a command's flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    Usage(stderr);
    return 2;
  }
  const std::string cmd = argv[1];
  if (cmd == "plan") return kimirt::RunPlanCommand(argc, argv);
  if (cmd == "make-checkpoint") return kimirt::RunMakeCheckpointCommand(argc, argv);
  if (cmd == "generate") return kimirt::RunGenerateCommand(argc, argv);
  if (cmd == "logits") return kimirt::RunLogitsCommand(argc, argv);
  if (cmd == "--help" || cmd == "-h" || cmd == "help") {
    Usage(stdout);
    return 0;
  }
  std::fprintf(stderr, "kimirt: unknown command \"%s\"\n\n", cmd.c_str());
  Usage(stderr);
  return 2;
}
