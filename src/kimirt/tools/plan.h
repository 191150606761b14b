// The capacity planner behind `kimirt plan`: per-GPU weight bytes by the seed's categories
// (from the Layout's placement rules, or from a checkpoint's real headers), runtime state for a
// context, and the fit against a GPU's HBM — reproducing the seed's three tables exactly and
// answering the same questions for any GPU, TP/PP/EP layout, KV dtype and context.
//
// Conventions (docs/plan.md): weight and state tables in decimal GB, the combined table in GiB,
// as the seed prints them. "Per GPU" is the largest rank of the largest pipeline stage, counting
// allocated bytes (vocab and MoE padding included; equal to the loaded bytes at K3 TP8).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/engine/kda_snapshot_budget.h"
#include "kimirt/io/safetensors.h"
#include "kimirt/model/layout.h"
#include "kimirt/tools/gpu_catalog.h"

namespace kimirt {

// The latent cache dtypes a plan sizes (named apart from the runner's KvCacheDType, which also
// has F32, so that one file may use both).
enum class PlanKvDType : uint8_t { kBF16, kFP8 };

struct PlanOptions {
  Parallelism par;                 // tp, ep, MoE pad_align, vision
  int pp = 1;                      // pipeline stages
  int64_t context_tokens = 0;      // per sequence; 0: the config's max, else 1,048,576
  int64_t num_seqs = 1;
  PlanKvDType kv_cache_dtype = PlanKvDType::kBF16;
  std::optional<GpuSpec> gpu;      // capacity to compare against; none: no verdict
  double gpu_memory_utilization = 0.9;  // the budget is this fraction of capacity (vLLM meaning)
  int64_t attn_res_chunk_tokens = 8192; // prefill chunk the AttnRes bank is sized for (seed: 8K)
  bool suggest = true;             // search the smallest layout that fits when this one does not
  // The prefix cache's KDA snapshots (docs/prefix-caching.md "Memory"), on by default as in
  // `kimirt serve`: `kda_snapshots` of them per GPU when >= 0, else `kda_snapshot_fraction` of
  // the cache budget (what the GPU budget leaves after the weights), as serve sizes them
  // (engine/kda_snapshot_budget.h).
  bool prefix_caching = true;
  int64_t kda_snapshots = -1;
  double kda_snapshot_fraction = kServeKdaSnapshotFraction;
};

struct RuntimeRow {
  std::string name;     // "MLA latent KV"
  std::string formula;  // the arithmetic actually used, with its numbers
  int64_t layers = 0;
  uint64_t bytes = 0;
  std::string scaling;  // "grows linearly with tokens; not sharded by TP"
};

// The KDA snapshots one GPU of a stage holds for the prefix cache.
struct SnapshotPlan {
  int64_t count = 0;
  uint64_t bytes_each = 0;   // one snapshot: every KDA layer of the stage, this rank's heads
  uint64_t cache_budget = 0; // what the fraction was taken of (0 with an explicit count)
  uint64_t bytes() const { return static_cast<uint64_t>(count) * bytes_each; }
};

struct StagePlan {
  int stage = 0;
  int64_t first_layer = 0;  // inclusive
  int64_t last_layer = 0;   // inclusive
  std::array<uint64_t, kNumCategories> weight_bytes{};  // per GPU (one rank of this stage)
  uint64_t weights = 0;
  uint64_t loaded_weights = 0;  // without vocab / MoE padding
  std::vector<RuntimeRow> runtime;  // the snapshot row last, when counted
  std::optional<SnapshotPlan> snapshots;  // counted (prefix caching on, count known)
  uint64_t runtime_bytes = 0;
  uint64_t total() const { return weights + runtime_bytes; }
};

struct LayoutChoice {
  int tp = 1;
  int pp = 1;
  int ep = 1;
  uint64_t per_gpu_bytes = 0;  // weights + runtime on the heaviest GPU
  int gpus() const { return tp * pp; }
};

struct PlanReport {
  std::string model;   // "Kimi-K3 (KimiK3ForConditionalGeneration)"
  std::string source;  // "--config FILE" or "--model DIR (checkpoint headers)"
  int64_t layers = 0, kda_layers = 0, mla_layers = 0, experts = 0, experts_per_token = 0;
  int64_t num_tensors = 0;
  uint64_t checkpoint_bytes = 0;
  std::array<uint64_t, kNumCategories> full_bytes{};
  int64_t vision_tensors = 0;
  uint64_t vision_bytes = 0;

  PlanOptions options;  // as resolved (context filled in)
  std::vector<StagePlan> stages;
  int heaviest_stage = 0;
  const StagePlan& heaviest() const { return stages[static_cast<size_t>(heaviest_stage)]; }

  // Present when a GPU was given.
  std::optional<GpuSpec> gpu;
  uint64_t budget_bytes = 0;          // utilization × capacity
  bool fits = false;
  int64_t kv_token_capacity = 0;      // latent-KV tokens the budget holds beside everything else
  std::optional<LayoutChoice> smallest_fit;  // when !fits and a search found one
  std::vector<std::string> notes;
};

Result<PlanReport> PlanFromLayout(const Layout& layout, const PlanOptions& options,
                                  std::string source);
// Bytes from the checkpoint's headers (dtypes and shapes as stored); placement from the layout,
// which the checkpoint must match (missing/unexpected/mis-shaped tensors are an error).
Result<PlanReport> PlanFromCheckpoint(const Layout& layout, const Checkpoint& checkpoint,
                                      const PlanOptions& options, std::string source);

std::string FormatPlanText(const PlanReport& report);
std::string FormatPlanJson(const PlanReport& report);
// Bytes as the combined table prints them: "130.559 GiB" (2^30 bytes, three decimals).
std::string FormatPlanGiB(uint64_t bytes);
// A count as the tables print it: "1,048,576".
std::string FormatPlanCount(int64_t n);

}  // namespace kimirt
