// `kimirt generate` and `kimirt logits`: run the model on token ids through the runner serve
// uses — one rank, -tp/-pp CPU ranks (threads, or processes with --distributed-executor-backend
// mp), or GPUs (--device cuda; one process per GPU beyond one rank).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/io/safetensors.h"

namespace kimirt {
namespace {

Result<std::vector<int32_t>> ParseIds(const std::string& text) {
  std::vector<int32_t> ids;
  std::stringstream ss(text);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    const long v = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || end != part.c_str() + part.size() || v < 0 || v > INT32_MAX) {
      return InvalidArgument("--ids: \"" + part + "\" is not a token id");
    }
    ids.push_back(static_cast<int32_t>(v));
  }
  if (ids.empty()) return InvalidArgument("--ids: no token ids given");
  return ids;
}

struct CommonFlags {
  std::string model_dir, ids_text, device = "cpu", executor = "threads";
  int tp = 1, pp = 1;
  bool expert_parallel = false;
  bool shard_latent_moe = false;
  void Register(FlagSet& f) {
    f.String("model", &model_dir, "model directory (config.json + safetensors checkpoint)");
    f.String("device", &device, "cpu or cuda (a build with -DKIMIRT_CUDA=ON; -tp/-pp > 1: one GPU a rank)");
    f.String("ids", &ids_text, "prompt token ids, comma separated");
    f.Int("tp,tensor-parallel-size", &tp, "tensor-parallel ranks (CPU threads or processes; GPUs)");
    f.Int("pp,pipeline-parallel-size", &pp, "pipeline stages of -tp ranks each");
    f.Bool("enable-expert-parallel", &expert_parallel,
           "routed experts split by ID over the -tp ranks (each holds E/tp whole) instead of sliced on every rank");
    f.Bool("shard-latent-moe", &shard_latent_moe,
           "LatentMoE's latent projections split over the -tp ranks (down column-, up row-parallel) instead of replicated on each (docs/plan.md \"Weights\")");
    f.String("distributed-executor-backend", &executor,
             "CPU ranks as threads (the default) or mp: one process per rank, as serve runs them");
  }

  // The runner `serve` would make for these flags (engine/model_runner.h: thread or process
  // ranks on CPU, one process per GPU on CUDA beyond one rank), with latent cache room for one
  // sequence of `tokens` positions: the same model, ops and sums as one Model on one rank.
  Result<std::unique_ptr<ModelRunner>> MakeRunner(int64_t tokens) const {
    if (tp < 1 || pp < 1) return InvalidArgument("-tp and -pp must be >= 1");
    if (executor != "threads" && executor != "mp") {
      return InvalidArgument("--distributed-executor-backend must be threads or mp, not \"" + executor + "\"");
    }
    RunnerOptions ro;
    ro.device = device;
    ro.tp = tp;
    ro.pp = pp;
    ro.ep = expert_parallel ? tp : 1;
    ro.shard_latent_moe = shard_latent_moe;
    ro.process_ranks = executor == "mp" && tp * pp > 1;
    ro.num_kv_blocks = tokens / ro.block_size + 2;
    return ModelRunner::Create(ModelSource::Directory(model_dir), ro);
  }
};

int Fail(const char* cmd, const Status& s, int code = 1) {
  std::fprintf(stderr, "kimirt %s: %s\n", cmd, s.message().c_str());
  return code;
}

}  // namespace

int RunGenerateCommand(int argc, char** argv) {
  CommonFlags common;
  int64_t max_tokens = 16;
  bool ignore_eos = false;
  FlagSet flags("generate", "Greedy continuation of a prompt of token ids.");
  common.Register(flags);
  flags.Int("max-tokens", &max_tokens, "tokens to generate");
  flags.Bool("ignore-eos", &ignore_eos, "keep going past the config's end-of-sequence ids");
  if (Status s = flags.Parse(argc, argv, 2, nullptr); !s.ok()) return Fail("generate", s, 2);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (common.model_dir.empty()) return Fail("generate", InvalidArgument("--model DIR is required"), 2);
  Result<std::vector<int32_t>> ids = ParseIds(common.ids_text);
  if (!ids.ok()) return Fail("generate", ids.status(), 2);
  Status s = [&]() -> Status {
    KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> r,
                            common.MakeRunner(static_cast<int64_t>(ids->size()) + std::max<int64_t>(max_tokens, 0)));
    const int64_t V = r->config().vocab_size;
    const std::vector<int64_t>& eos = r->config().eos_token_ids;
    const ModelRunner::Handle h = r->NewSequence();
    KIMIRT_RETURN_IF_ERROR(r->Reserve(h, static_cast<int64_t>(ids->size())));
    const auto t0 = std::chrono::steady_clock::now();
    KIMIRT_ASSIGN_OR_RETURN(Tensor logits, r->Forward(h, *ids, /*last_only=*/true));
    const auto t1 = std::chrono::steady_clock::now();
    std::vector<int32_t> out;
    for (int64_t i = 0; i < max_tokens; ++i) {
      const int32_t next = static_cast<int32_t>(std::max_element(logits.f32(), logits.f32() + V) - logits.f32());
      out.push_back(next);
      if (!ignore_eos && std::find(eos.begin(), eos.end(), next) != eos.end()) break;
      if (i + 1 == max_tokens) break;
      KIMIRT_RETURN_IF_ERROR(r->Reserve(h, static_cast<int64_t>(ids->size()) + i + 1));
      KIMIRT_ASSIGN_OR_RETURN(logits, r->Forward(h, std::vector<int32_t>{next}, /*last_only=*/true));
    }
    const auto t2 = std::chrono::steady_clock::now();
    std::string line;
    for (int32_t t : out) line += (line.empty() ? "" : ",") + std::to_string(t);
    std::printf("%s\n", line.c_str());
    const double pre = std::chrono::duration<double>(t1 - t0).count();
    const double dec = std::chrono::duration<double>(t2 - t1).count();
    std::fprintf(stderr, "prefill %zu tokens in %.3f s; decode %zu tokens in %.3f s\n", ids->size(), pre,
                 out.size() > 0 ? out.size() - 1 : 0, dec);
    return Status::Ok();
  }();
  return s.ok() ? 0 : Fail("generate", s);
}

int RunLogitsCommand(int argc, char** argv) {
  CommonFlags common;
  std::string out_path;
  FlagSet flags("logits", "FP32 logits of every prompt position, written as safetensors (tensor \"logits\" [T, vocab]).");
  common.Register(flags);
  flags.String("out", &out_path, "output .safetensors file");
  if (Status s = flags.Parse(argc, argv, 2, nullptr); !s.ok()) return Fail("logits", s, 2);
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  if (common.model_dir.empty() || out_path.empty()) {
    return Fail("logits", InvalidArgument("--model DIR and --out FILE are required"), 2);
  }
  Result<std::vector<int32_t>> ids = ParseIds(common.ids_text);
  if (!ids.ok()) return Fail("logits", ids.status(), 2);
  Status s = [&]() -> Status {
    KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<ModelRunner> r, common.MakeRunner(static_cast<int64_t>(ids->size())));
    const ModelRunner::Handle h = r->NewSequence();
    KIMIRT_RETURN_IF_ERROR(r->Reserve(h, static_cast<int64_t>(ids->size())));
    KIMIRT_ASSIGN_OR_RETURN(Tensor logits, r->Forward(h, *ids, /*last_only=*/false));
    SafetensorsWriter w;
    w.SetMetadata("format", "pt");
    w.Add("logits", DType::kF32, logits.shape(),
          std::span<const uint8_t>(static_cast<const uint8_t*>(logits.raw()), logits.nbytes()));
    KIMIRT_RETURN_IF_ERROR(w.Write(out_path));
    std::printf("wrote %s: logits %s\n", out_path.c_str(), ShapeToString(logits.shape()).c_str());
    return Status::Ok();
  }();
  return s.ok() ? 0 : Fail("logits", s);
}

}  // namespace kimirt
