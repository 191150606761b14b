// `kimirt bench model`: flags → BenchModelOptions → RunBenchModel → table or --json.
#include <cstdio>
#include <sstream>
#include <string>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/cli/commands.h"
#include "kimirt/cli/dtype_flag.h"
#include "kimirt/cli/prefill_chunk_flag.h"
#include "kimirt/cli/flags.h"
#include "kimirt/tools/bench_model.h"
#include "kimirt/tools/builtin_model.h"

namespace kimirt {

int RunBenchModelCommand(int argc, char** argv) {
  BenchModelOptions o;
  o.prefill_chunk = 0;  // the device's default unless --prefill-chunk (prefill_chunk_flag.h)
  std::string batch_sizes = "1,8", json_path;
  bool random_weights = false;
  int64_t seed = 0;
  FlagSet f("bench model",
            "The engine in-process (no HTTP): prefill tokens/s and decode step time per batch size.");
  f.String("model", &o.model_dir, "model directory (default: the built-in model, as `serve`)");
  f.String("config", &o.config_path, "config.json to run with --random-weights");
  f.Bool("random-weights", &random_weights, "with --config: deterministic random weights");
  f.Bool("enforce-eager", &o.enforce_eager, "no CUDA graphs: every decode step op by op");
  f.Int("seed", &seed, "seed of the random weights");
  f.String("device", &o.device, "cpu or cuda (a build with -DKIMIRT_CUDA=ON; -tp N takes GPUs 0..N-1)");
  std::string dtype = "auto";
  f.String("dtype", &dtype, "GEMM weights on the device: auto (cuda: bfloat16, cpu: float32), float32, bfloat16");
  f.Int("tp,tensor-parallel-size", &o.tp, "tensor-parallel ranks (CPU: threads; CUDA: one process per GPU)");
  f.Int("pp,pipeline-parallel-size", &o.pp,
        "pipeline stages, each -tp ranks holding its share of the layers (docs/distributed.md); tp × pp ranks");
  f.Int("pp-micro-batches", &o.pp_micro_batches,
        "with -pp: micro-batches a decode step splits into, in flight through the stages (0: one per stage; "
        "more where the backend's row invariance needs them, on the CPU one per sequence)");
  f.Bool("enable-expert-parallel", &o.expert_parallel,
         "routed experts split by ID over the -tp ranks (each holds E/tp whole) instead of sliced on every rank");
  f.Bool("shard-latent-moe", &o.shard_latent_moe,
         "LatentMoE's latent projections split over the -tp ranks (down column-, up row-parallel) instead of replicated on each (docs/plan.md \"Weights\")");
  f.String("batch-sizes", &batch_sizes, "comma-separated batch sizes");
  f.Int("prompt-len", &o.prompt_len, "prompt tokens per request");
  f.Int("decode-tokens", &o.decode_tokens, "tokens generated per request");
  f.Int("prefill-chunk", &o.prefill_chunk, "fixed prefill chunk in tokens, as serve's (0: the device's, cuda 1024, cpu 256)");
  f.String("json", &json_path, "also write the results as JSON to this file");
  int threads = 0;
  f.Int("threads", &threads,
        "CPU threads for GEMMs and per-head loops, shared by every thread rank (0: all cores), as serve's");
  f.Double("peak-gbps", &o.peak_gb_per_s, "memory bandwidth (GB/s) to report decode traffic against");
  std::string kv_dtype = "auto";
  f.String("kv-cache-dtype", &kv_dtype, "latent cache dtype, as serve's: auto (cuda: bf16, cpu: f32), f32, bf16, fp8");
  if (Status s = f.Parse(argc, argv, 3, nullptr); !s.ok()) {
    std::fprintf(stderr, "kimirt bench model: %s\n", s.message().c_str());
    return 2;
  }
  if (f.help_requested()) {
    std::fputs(f.Help().c_str(), stdout);
    return 0;
  }
  if (!o.config_path.empty() && !random_weights) {
    std::fprintf(stderr, "kimirt bench model: --config needs --random-weights\n");
    return 2;
  }
  if (o.model_dir.empty() && o.config_path.empty()) {
    Result<std::string> dir = EnsureBuiltinModel();
    if (!dir.ok()) {
      std::fprintf(stderr, "kimirt bench model: %s\n", dir.status().message().c_str());
      return 1;
    }
    o.model_dir = *dir;
  }
  std::optional<KvCacheDType> kv = KvCacheDTypeFlag(kv_dtype, o.device);
  if (!kv) {
    std::fprintf(stderr, "kimirt bench model: --kv-cache-dtype: expected auto, f32, bf16 or fp8, got \"%s\"\n",
                 kv_dtype.c_str());
    return 2;
  }
  o.kv_cache_dtype = *kv;
  Result<DType> matrix_dtype = ParseDtypeFlag(dtype, o.device);
  if (!matrix_dtype.ok()) {
    std::fprintf(stderr, "kimirt bench model: %s\n", matrix_dtype.status().message().c_str());
    return 2;
  }
  const Result<int> chunk = ResolvePrefillChunk(o.prefill_chunk, o.device);
  if (!chunk.ok()) {
    std::fprintf(stderr, "kimirt bench model: %s\n", chunk.status().message().c_str());
    return 2;
  }
  o.prefill_chunk = chunk.value();
  o.matrix_dtype = *matrix_dtype;
  o.seed = static_cast<uint64_t>(seed);
  o.batch_sizes.clear();
  std::stringstream ss(batch_sizes);
  std::string part;
  while (std::getline(ss, part, ',')) {
    char* end = nullptr;
    const long b = std::strtol(part.c_str(), &end, 10);
    if (part.empty() || *end != '\0' || b < 1 || b > 4096) {
      std::fprintf(stderr, "kimirt bench model: --batch-sizes: \"%s\" is not a batch size\n", part.c_str());
      return 2;
    }
    o.batch_sizes.push_back(static_cast<int>(b));
  }
  SetCpuBackendThreads(threads);
  Result<BenchModelReport> r = RunBenchModel(o);
  if (!r.ok()) {
    std::fprintf(stderr, "kimirt bench model: %s\n", r.status().message().c_str());
    return 1;
  }
  std::fputs(r->ToText().c_str(), stdout);
  if (!json_path.empty()) {
    FILE* out = std::fopen(json_path.c_str(), "w");
    if (out == nullptr) {
      std::fprintf(stderr, "kimirt bench model: cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fputs(r->ToJson().c_str(), out);
    std::fclose(out);
  }
  return 0;
}

}  // namespace kimirt
