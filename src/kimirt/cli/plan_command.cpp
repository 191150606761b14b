// `kimirt plan`: flags → PlanOptions → PlanFromLayout / PlanFromCheckpoint → table or JSON.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>

#include "kimirt/cli/commands.h"
#include "kimirt/cli/flags.h"
#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"
#include "kimirt/tools/plan.h"
#include "kimirt/tools/plan_fit.h"

namespace kimirt {
namespace {

// --fit-layers: reads the config's text (the cut keeps every field it does not change), prints
// the chosen cut's tables and why the next cut point does not fit, writes the cut on request.
int RunFitLayers(const std::string& config_path, const PlanOptions& o, bool json, const std::string& write_config) {
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kimirt plan: %s\n", s.message().c_str());
    return 1;
  };
  std::string file;
  Result<std::string> text = ReadModelConfigText(config_path, &file);
  if (!text.ok()) return fail(text.status());
  Result<LayerFit> fit = FitLayers(*text, file, o);
  if (!fit.ok()) return fail(fit.status());
  if (!write_config.empty()) {
    std::ofstream out(write_config, std::ios::binary | std::ios::trunc);
    out << fit->config_json;
    out.close();
    if (!out) return fail(IoError("--write-config: cannot write " + write_config));
  }
  const std::string report = json ? FormatLayerFitJson(*fit) : FormatLayerFitText(*fit);
  std::fputs(report.c_str(), stdout);
  if (!write_config.empty() && !json) {
    std::printf("wrote %s: the config cut to %lld layers\n", write_config.c_str(),
                static_cast<long long>(fit->layers));
  }
  return 0;
}

}  // namespace

int RunPlanCommand(int argc, char** argv) {
  std::string config_path, model_dir, gpu_name, kv_dtype = "auto", write_config;
  int tp = 1, pp = 1, ep = 1, pad_align = 128;
  int64_t context = 0, num_seqs = 1, chunk = 8192;
  double gpu_mem_gib = 0, util = 0.9;
  bool with_vision = false, shard_latent_moe = false, json = false, prefix_caching = true, fit_layers = false;
  int64_t kda_snapshots = -1;

  FlagSet flags("plan",
                "Per-GPU HBM for a Kimi model: weights by category (from the layout, or from a\n"
                "checkpoint's headers), runtime state for a context, and whether it fits a GPU.");
  flags.String("config", &config_path, "config.json of the model (counts the layout the config implies)");
  flags.String("model", &model_dir, "checkpoint directory (counts the tensors as stored in its headers)");
  flags.Int("tp,tensor-parallel-size", &tp, "tensor-parallel degree");
  flags.Int("pp,pipeline-parallel-size", &pp, "pipeline stages (layers split evenly, as vLLM does)");
  flags.Int("ep,expert-parallel-size", &ep, "expert-parallel degree: 1, or equal to -tp (experts split by ID)");
  flags.Int("context,max-model-len", &context, "tokens per sequence (0: the config's maximum)");
  flags.Int("num-seqs,max-num-seqs", &num_seqs, "sequences held at once");
  flags.String("kv-cache-dtype", &kv_dtype, "MLA latent cache dtype: auto (= bf16), bf16 or fp8");
  flags.String("gpu", &gpu_name, "GPU from the catalog: " + GpuCatalogNames());
  flags.Double("gpu-mem-gib", &gpu_mem_gib, "GPU capacity in GiB (instead of --gpu)");
  flags.Double("gpu-memory-utilization", &util, "fraction of capacity the engine may use");
  flags.Int("attn-res-chunk", &chunk, "prefill chunk tokens the AttnRes bank is sized for");
  flags.Int("moe-pad-align", &pad_align, "per-rank MoE intermediate padding (ATOM uses 128 for Kimi)");
  flags.Bool("with-vision", &with_vision, "load the vision tower and projector (replicated)");
  flags.Bool("shard-latent-moe", &shard_latent_moe,
             "LatentMoE's latent projections split over the -tp ranks (down column-, up row-parallel) instead of replicated on each (docs/plan.md \"Weights\")");
  flags.Bool("enable-prefix-caching", &prefix_caching,
             "count the prefix cache's KDA snapshots, as serve allocates them (default on, as in serve; "
             "--no-enable-prefix-caching plans without)");
  flags.Int("kda-snapshots", &kda_snapshots,
            "KDA snapshots per GPU (default: serve's share of the cache budget the GPU leaves)");
  flags.Bool("fit-layers", &fit_layers,
             "plan the config cut to the most of its first layers that fit the GPU (whole AttnRes blocks "
             "ending on an MLA layer; needs --config and a GPU)");
  flags.String("write-config", &write_config, "with --fit-layers: write the cut config.json to this file");
  flags.Bool("json", &json, "print one JSON object instead of tables");

  if (Status s = flags.Parse(argc, argv, 2, nullptr); !s.ok()) {
    std::fprintf(stderr, "kimirt plan: %s\n", s.message().c_str());
    return 2;
  }
  if (flags.help_requested()) {
    std::fputs(flags.Help().c_str(), stdout);
    return 0;
  }
  auto fail = [](const Status& s) {
    std::fprintf(stderr, "kimirt plan: %s\n", s.message().c_str());
    return 1;
  };
  if (config_path.empty() == model_dir.empty()) {
    std::fprintf(stderr, "kimirt plan: give exactly one of --config FILE or --model DIR\n");
    return 2;
  }
  if (fit_layers && config_path.empty()) {
    std::fprintf(stderr, "kimirt plan: --fit-layers cuts a config: give --config FILE, not --model\n");
    return 2;
  }
  if (!write_config.empty() && !fit_layers) {
    std::fprintf(stderr, "kimirt plan: --write-config writes the cut of --fit-layers: add --fit-layers\n");
    return 2;
  }

  PlanOptions o;
  o.par.tp = tp;
  o.par.ep = ep;
  o.par.pad_align = pad_align;
  o.par.load_vision = with_vision;
  o.par.shard_latent_moe = shard_latent_moe;
  o.pp = pp;
  o.context_tokens = context;
  o.num_seqs = num_seqs;
  o.attn_res_chunk_tokens = chunk;
  o.gpu_memory_utilization = util;
  o.prefix_caching = prefix_caching;
  o.kda_snapshots = kda_snapshots;
  if (kv_dtype == "fp8" || kv_dtype == "fp8_e4m3" || kv_dtype == "fp8-e4m3") {
    o.kv_cache_dtype = PlanKvDType::kFP8;
  } else if (kv_dtype == "bf16" || kv_dtype == "auto" || kv_dtype == "bfloat16") {
    o.kv_cache_dtype = PlanKvDType::kBF16;
  } else {
    return fail(InvalidArgument("--kv-cache-dtype: expected auto, bf16 or fp8, got \"" + kv_dtype + "\""));
  }
  if (!gpu_name.empty() && gpu_mem_gib > 0) {
    return fail(InvalidArgument("give --gpu or --gpu-mem-gib, not both"));
  }
  if (!gpu_name.empty()) {
    o.gpu = FindGpu(gpu_name);
    if (!o.gpu) {
      return fail(InvalidArgument("--gpu: unknown GPU \"" + gpu_name + "\" (known: " + GpuCatalogNames() + ")"));
    }
  } else if (flags.WasSet("gpu-mem-gib")) {
    if (!(gpu_mem_gib > 0)) return fail(InvalidArgument("--gpu-mem-gib must be positive"));
    o.gpu = GpuSpec{"custom", std::to_string(gpu_mem_gib) + " GiB",
                    static_cast<uint64_t>(gpu_mem_gib * 1073741824.0), "--gpu-mem-gib", 0.0, 8};
  }

  if (fit_layers) return RunFitLayers(config_path, o, json, write_config);

  const std::string cfg_source = config_path.empty() ? model_dir : config_path;
  Result<ModelConfig> config = LoadModelConfig(cfg_source);
  if (!config.ok()) return fail(config.status());
  for (const std::string& k : config->unknown_keys) {
    std::fprintf(stderr, "kimirt plan: note: ignoring unknown config key %s\n", k.c_str());
  }
  Result<Layout> layout = Layout::Build(*config);
  if (!layout.ok()) return fail(layout.status());

  auto make_report = [&]() -> Result<PlanReport> {
    if (!config_path.empty()) return PlanFromLayout(*layout, o, "--config " + config_path);
    const auto t0 = std::chrono::steady_clock::now();
    KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Checkpoint> ckpt, Checkpoint::Open(model_dir));
    const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    char src[512];
    std::snprintf(src, sizeof(src), "--model %s (%zu shard headers read in %.2f s)", model_dir.c_str(),
                  ckpt->shards().size(), secs);
    return PlanFromCheckpoint(*layout, *ckpt, o, src);
  };
  Result<PlanReport> report = make_report();
  if (!report.ok()) return fail(report.status());
  const std::string out = json ? FormatPlanJson(*report) : FormatPlanText(*report);
  std::fputs(out.c_str(), stdout);
  return 0;
}

}  // namespace kimirt
