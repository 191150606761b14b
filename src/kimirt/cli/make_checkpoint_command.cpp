// `kimirt make-checkpoint --config FILE --out DIR [--sparse | --random --seed N] [--shards N]`
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <sys/stat.h>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"
#include "kimirt/tools/checkpoint_writer.h"

namespace kimirt {

int RunMakeCheckpointCommand(int argc, char** argv) {
  std::string config_path, out_dir;
  bool sparse = false, random = false, quiet = false;
  int64_t seed = 0;
  int shards = 0;
  FlagSet flags("make-checkpoint",
                "Writes the checkpoint a config implies, in the released format (sharded\n"
                "safetensors + model.safetensors.index.json + config.json).");
  flags.String("config", &config_path, "config.json of the model");
  flags.String("out", &out_dir, "output directory (created if missing)");
  flags.Bool("sparse", &sparse, "leave every tensor payload as a file hole (headers only on disk)");
  flags.Bool("random", &random, "fill tensors with deterministic random weights");
  flags.Int("seed", &seed, "seed for --random");
  flags.Int("shards", &shards, "number of shards (0: one per started 16 GiB)");
  flags.Bool("quiet", &quiet, "no progress output");
  if (Status s = flags.Parse(argc, argv, 2, nullptr); !s.ok()) {
    std::fprintf(stderr, "kimirt make-checkpoint: %s\n", s.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (config_path.empty() || out_dir.empty() || sparse == random) {
    std::fprintf(stderr, "kimirt make-checkpoint: needs --config FILE, --out DIR and one of --sparse or --random\n");
    return 2;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kimirt make-checkpoint: %s\n", s.message().c_str());
    return 1;
  };
  Result<ModelConfig> config = LoadModelConfig(config_path);
  if (!config.ok()) return fail(config.status());
  Result<Layout> layout = Layout::Build(*config);
  if (!layout.ok()) return fail(layout.status());
  if (random && layout->total_bytes() > (uint64_t{64} << 30)) {
    return fail(InvalidArgument("--random would write " + std::to_string(layout->total_bytes() >> 30) +
                                " GiB; use --sparse for a checkpoint this large"));
  }

  CheckpointWriteOptions o;
  o.fill = sparse ? CheckpointFill::kSparse : CheckpointFill::kRandom;
  o.seed = static_cast<uint64_t>(seed);
  o.shards = shards;
  std::string file = config_path;
  struct stat st {};
  if (::stat(config_path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) file += "/config.json";
  std::ifstream in(file, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  o.config_json = ss.str();
  if (!quiet) {
    o.progress = [](int done, int total) {
      std::fprintf(stderr, "\rkimirt make-checkpoint: shard %d/%d", done, total);
      if (done == total) std::fputc('\n', stderr);
    };
  }
  Result<CheckpointWriteSummary> summary = WriteCheckpoint(*layout, out_dir, o);
  if (!summary.ok()) return fail(summary.status());
  std::printf("wrote %s: %lld tensors, %llu bytes in %d shards (%s)\n", out_dir.c_str(),
              static_cast<long long>(summary->tensors), static_cast<unsigned long long>(summary->bytes),
              summary->shards, sparse ? "sparse" : "random");
  return 0;
}

}  // namespace kimirt
