// The subcommands of the `kimirt` binary. Each parses its own flags (flags.h), calls a library
// entry point and prints; it returns the process exit code (0 ok, 1 error, 2 usage error).
#pragma once

namespace kimirt {

int RunPlanCommand(int argc, char** argv);            // kimirt plan
int RunMakeCheckpointCommand(int argc, char** argv);  // kimirt make-checkpoint
int RunGenerateCommand(int argc, char** argv);        // kimirt generate
int RunLogitsCommand(int argc, char** argv);          // kimirt logits
int RunServeCommand(int argc, char** argv);           // kimirt serve
int RunTokenizeCommand(int argc, char** argv);        // kimirt tokenize
int RunDetokenizeCommand(int argc, char** argv);      // kimirt detokenize
int RunEvalCommand(int argc, char** argv);            // kimirt eval gsm8k
int RunBenchCommand(int argc, char** argv);           // kimirt bench serve|model
int RunBenchModelCommand(int argc, char** argv);      // kimirt bench model
int RunDistCheckCommand(int argc, char** argv);       // kimirt dist-check

}  // namespace kimirt
