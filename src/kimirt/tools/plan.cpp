// Capacity planning (see plan.h). Weight bytes come from Layout::SliceFor (spec §11 placement);
// runtime state follows k3-checkpoint-memory.md "Runtime state for one sequence", printing the
// formula actually used (the seed's text says "× 2 bytes" for an FP8 latent and an FP32 state;
// its numbers need 1 and 4 bytes — docs/plan.md).
#include "kimirt/tools/plan.h"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <optional>

#include <nlohmann/json.hpp>

#include "kimirt/model/pipeline_stages.h"

namespace kimirt {
namespace {

constexpr double kGB = 1e9;
constexpr double kGiB = 1073741824.0;

std::string Fmt(const char* fmt, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), fmt, v);
  return buf;
}
std::string GB(uint64_t b) { return Fmt("%.3f GB", static_cast<double>(b) / kGB); }
std::string GiB(uint64_t b) { return Fmt("%.3f GiB", static_cast<double>(b) / kGiB); }
// 1048576 -> "1,048,576"
std::string Commas(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v);
  for (int i = static_cast<int>(s.size()) - 3; i > 0; i -= 3) s.insert(static_cast<size_t>(i), ",");
  return (v < 0 ? "-" : "") + s;
}
std::string Pad(std::string s, size_t w) {
  // Width in characters; our strings may hold multi-byte "×", "÷", "⌈⌉", "−": count code points.
  size_t cps = 0;
  for (unsigned char ch : s) cps += (ch & 0xC0) != 0x80;
  if (cps < w) s.append(w - cps, ' ');
  return s;
}
std::string PadLeft(std::string s, size_t w) {
  size_t cps = 0;
  for (unsigned char ch : s) cps += (ch & 0xC0) != 0x80;
  if (cps < w) s.insert(0, w - cps, ' ');
  return s;
}

int64_t KdaLayersIn(const ModelConfig& c, int64_t first, int64_t last) {
  int64_t n = 0;
  for (int64_t i = first; i <= last; ++i) n += c.IsKdaLayer(i) ? 1 : 0;
  return n;
}

std::vector<RuntimeRow> RuntimeFor(const ModelConfig& c, const PlanOptions& o, int64_t first,
                                   int64_t last) {
  int64_t kda = 0, mla = 0;
  for (int64_t i = first; i <= last; ++i) (c.IsKdaLayer(i) ? kda : mla) += 1;
  const int64_t tp = o.par.tp;
  const int64_t seqs = o.num_seqs;
  const std::string seq_prefix = seqs == 1 ? "" : Commas(seqs) + " seqs × ";
  std::vector<RuntimeRow> rows;

  // Spec §6.5: 512 latent + 64 shared-key values per token and layer, held whole by every rank.
  const int64_t latent = c.kv_lora_rank + c.qk_rope_head_dim;
  const int64_t kv_bytes = o.kv_cache_dtype == PlanKvDType::kFP8 ? 1 : 2;
  const char* kv_name = o.kv_cache_dtype == PlanKvDType::kFP8 ? "fp8" : "bf16";
  rows.push_back({"MLA latent KV",
                  seq_prefix + Commas(o.context_tokens) + " × (" + std::to_string(c.kv_lora_rank) +
                      " + " + std::to_string(c.qk_rope_head_dim) + ") × " +
                      std::to_string(kv_bytes) + " byte" + (kv_bytes > 1 ? "s" : "") + " (" +
                      kv_name + ")/layer",
                  mla,
                  static_cast<uint64_t>(seqs * o.context_tokens * latent * kv_bytes * mla),
                  "grows linearly with tokens; every rank holds the whole latent"});

  // Spec §5.7: FP32 recurrent state [H/tp, K, K] per KDA layer, sharded by head.
  const int64_t H = c.linear_attn.num_heads;
  const int64_t K = c.linear_attn.head_dim;
  rows.push_back({"KDA SSM state",
                  seq_prefix + "(" + std::to_string(H) + " ÷ " + std::to_string(tp) + ") × " +
                      std::to_string(K) + " × " + std::to_string(K) + " × 4 bytes (fp32)/layer",
                  kda, static_cast<uint64_t>(seqs * (H / tp) * K * K * 4 * kda),
                  "fixed per sequence; sharded by head"});

  // Spec §5.7: the last W-1 pre-conv q/k/v projections, BF16 (the model dtype, as ATOM keeps it).
  const int64_t P = c.KdaProjDim();
  const int64_t W = c.linear_attn.short_conv_kernel_size;
  rows.push_back({"KDA conv state",
                  seq_prefix + "3 × (" + std::to_string(P) + " ÷ " + std::to_string(tp) + ") × (" +
                      std::to_string(W) + " − 1) × 2 bytes (bf16)/layer",
                  kda, static_cast<uint64_t>(seqs * 3 * (P / tp) * (W - 1) * 2 * kda),
                  "fixed per sequence; sharded by channel"});

  if (c.UsesAttnRes()) {
    // Spec §8.1: the bank holds one BF16 snapshot per closed block (blocks close at layers
    // 0, bs, 2bs, ...), for every token of the prefill chunk in flight.
    const int64_t bs = *c.attn_res_block_size;
    const int64_t blocks = last / bs + 1;
    const std::string blocks_text =
        first == 0 && last == c.num_hidden_layers - 1
            ? "⌈" + std::to_string(c.num_hidden_layers) + " ÷ " + std::to_string(bs) + "⌉"
            : std::to_string(blocks);
    rows.push_back({"AttnRes chunk temporary",
                    Commas(o.attn_res_chunk_tokens) + " × " + blocks_text + " × " +
                        std::to_string(c.hidden_size) + " × 2 bytes (bf16)",
                    last - first + 1,
                    static_cast<uint64_t>(o.attn_res_chunk_tokens * blocks * c.hidden_size * 2),
                    "one block residual per " + std::to_string(bs) +
                        " layers; scales with the prefill chunk"});
  }
  return rows;
}

// Per-GPU weight bytes of every stage for one parallel layout. Ranks of a stage hold equal
// allocations (padding makes them equal), except under EP where rank 0 holds the most experts;
// rank 0 is therefore the largest rank.
struct Tally {
  std::vector<StagePlan> stages;
};

Tally TallyWeights(const Layout& layout, const std::vector<const TensorSpec*>& tensors,
                   const Parallelism& par, int pp) {
  const ModelConfig& c = layout.config();
  Tally tally;
  // The stages as the loader places them (model/pipeline_stages.h: one rule for both).
  const std::vector<PipelineStage> ranges = PipelineStages(c.num_hidden_layers, pp);
  for (const PipelineStage& r : ranges) {
    StagePlan sp;
    sp.stage = r.stage;
    sp.first_layer = r.first_layer;
    sp.last_layer = r.end_layer - 1;
    tally.stages.push_back(std::move(sp));
  }
  for (const TensorSpec* t : tensors) {
    const TensorSlice slice = layout.SliceFor(*t, par, /*rank=*/0);
    if (!slice.loaded) continue;
    StagePlan& sp = tally.stages[static_cast<size_t>(StageOfTensor(*t, ranges))];
    sp.weight_bytes[static_cast<size_t>(t->category)] += slice.allocated_bytes;
    sp.weights += slice.allocated_bytes;
    sp.loaded_weights += slice.loaded_bytes;
  }
  return tally;
}

// The prefix cache's KDA snapshots on one GPU of a stage holding `kda` KDA layers and `weights`
// bytes of weights, counted as `kimirt serve` allocates them (engine/kda_snapshot_budget.h): an
// explicit count, or a share of the cache budget, which serve takes as what
// --gpu-memory-utilization leaves after the weights. None when caching is off, the stage has
// no KDA layer, or neither a count nor a GPU budget is known.
std::optional<SnapshotPlan> SnapshotsFor(const ModelConfig& c, const PlanOptions& o, int64_t kda, uint64_t weights,
                                         std::optional<uint64_t> budget) {
  if (!o.prefix_caching || kda == 0) return std::nullopt;
  SnapshotPlan p;
  p.bytes_each = KdaSnapshotBytes(c, o.par.tp, kda);
  if (o.kda_snapshots >= 0) {
    p.count = o.kda_snapshots;
    return p;
  }
  if (!budget) return std::nullopt;
  p.cache_budget = *budget > weights ? *budget - weights : 0;
  p.count = KdaSnapshotsFor(p.cache_budget, o.kda_snapshot_fraction, p.bytes_each);
  return p;
}

RuntimeRow SnapshotRow(const ModelConfig& c, const PlanOptions& o, int64_t kda, const SnapshotPlan& p) {
  const std::string tp = std::to_string(o.par.tp);
  const std::string H = std::to_string(c.linear_attn.num_heads), K = std::to_string(c.linear_attn.head_dim);
  RuntimeRow r;
  r.name = "KDA prefix snapshots";
  // The recurrent state and the conv windows as the runner holds them: FP32 both.
  // (The conv windows' 3 × (W − 1) × (H·K ÷ tp) multiplied out, so that the row fits its column.)
  r.formula = Commas(p.count) + " × ((" + H + " ÷ " + tp + ") × " + K + " × " + K + " + " +
              std::to_string(3 * (c.linear_attn.short_conv_kernel_size - 1)) + " × " +
              std::to_string(c.KdaProjDim() / o.par.tp) + ") × 4 bytes/layer";
  r.layers = kda;
  r.bytes = p.bytes();
  r.scaling = o.kda_snapshots >= 0
                  ? "prefix cache: --kda-snapshots"
                  : "prefix cache: " + Fmt("%g", 100 * o.kda_snapshot_fraction) + "% of the " + GiB(p.cache_budget) +
                        " cache budget, as serve";
  return r;
}

void AddRuntime(const ModelConfig& c, const PlanOptions& o, std::optional<uint64_t> budget,
                std::vector<StagePlan>* stages) {
  for (StagePlan& sp : *stages) {
    sp.runtime = RuntimeFor(c, o, sp.first_layer, sp.last_layer);
    const int64_t kda = KdaLayersIn(c, sp.first_layer, sp.last_layer);
    sp.snapshots = SnapshotsFor(c, o, kda, sp.weights, budget);
    if (sp.snapshots) sp.runtime.push_back(SnapshotRow(c, o, kda, *sp.snapshots));
    sp.runtime_bytes = 0;
    for (const RuntimeRow& r : sp.runtime) sp.runtime_bytes += r.bytes;
  }
}

int Heaviest(const std::vector<StagePlan>& stages) {
  int best = 0;
  for (size_t s = 1; s < stages.size(); ++s) {
    if (stages[s].total() > stages[static_cast<size_t>(best)].total()) best = static_cast<int>(s);
  }
  return best;
}

// Smallest GPU count (then the widest TP) whose heaviest GPU fits the budget. TP stays inside
// the GPU's scale-up domain; pipeline stages span nodes (DESIGN.md "Multi-GPU and multi-node").
std::optional<LayoutChoice> SearchSmallestFit(const Layout& layout,
                                              const std::vector<const TensorSpec*>& tensors,
                                              const PlanOptions& o, uint64_t budget) {
  const ModelConfig& c = layout.config();
  const int max_gpus = 1024;
  for (int n = 1; n <= max_gpus; ++n) {
    for (int tp = std::min(n, o.gpu->scale_up_domain); tp >= 1; --tp) {
      if (n % tp != 0) continue;
      const int pp = n / tp;
      if (pp > c.num_hidden_layers) continue;
      PlanOptions cand = o;
      cand.par.tp = tp;
      cand.par.ep = o.par.ep == 1 ? 1 : tp;
      cand.pp = pp;
      if (!layout.CheckParallelism(cand.par).ok()) continue;
      Tally t = TallyWeights(layout, tensors, cand.par, pp);
      AddRuntime(c, cand, budget, &t.stages);
      const uint64_t worst = t.stages[static_cast<size_t>(Heaviest(t.stages))].total();
      if (worst <= budget) return LayoutChoice{tp, pp, cand.par.ep, worst};
    }
  }
  return std::nullopt;
}

Result<PlanReport> PlanTensors(const Layout& layout, const std::vector<const TensorSpec*>& tensors,
                               const PlanOptions& options, std::string source) {
  const ModelConfig& c = layout.config();
  PlanOptions o = options;
  KIMIRT_RETURN_IF_ERROR(CheckPipelineDegree(c.num_hidden_layers, o.pp));
  if (o.num_seqs < 1) return InvalidArgument("--num-seqs must be >= 1");
  if (o.context_tokens < 0) return InvalidArgument("--context must be >= 0");
  if (o.attn_res_chunk_tokens < 1) return InvalidArgument("--attn-res-chunk must be >= 1");
  if (o.kda_snapshots < -1) return InvalidArgument("--kda-snapshots must be >= 0");
  if (!(o.kda_snapshot_fraction >= 0 && o.kda_snapshot_fraction < 1)) {
    return InvalidArgument("the KDA snapshot fraction must be in [0, 1)");
  }
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1)) {
    return InvalidArgument("--gpu-memory-utilization must be in (0, 1]");
  }
  if (o.context_tokens == 0) {
    o.context_tokens = c.max_position_embeddings > 0 ? c.max_position_embeddings : 1048576;
  }
  if (Status s = layout.CheckParallelism(o.par); !s.ok()) {
    return s.WithContext("layout TP " + std::to_string(o.par.tp) + " EP " + std::to_string(o.par.ep));
  }
  if (c.linear_attn.num_heads % o.par.tp != 0) {
    return InvalidArgument("KDA heads " + std::to_string(c.linear_attn.num_heads) +
                           " do not split over TP " + std::to_string(o.par.tp));
  }

  PlanReport r;
  r.model = std::string(ModelFamilyName(c.family)) +
            (c.architecture.empty() ? "" : " (" + c.architecture + ")");
  r.source = std::move(source);
  r.layers = c.num_hidden_layers;
  r.kda_layers = c.NumKdaLayers();
  r.mla_layers = c.NumMlaLayers();
  r.experts = c.num_experts;
  r.experts_per_token = c.num_experts_per_token;
  r.num_tensors = static_cast<int64_t>(tensors.size());
  for (const TensorSpec* t : tensors) {
    const uint64_t b = t->nbytes();
    r.checkpoint_bytes += b;
    r.full_bytes[static_cast<size_t>(t->category)] += b;
    if (t->component == Component::kVision) {
      r.vision_tensors += 1;
      r.vision_bytes += b;
    }
  }

  std::optional<uint64_t> budget;  // utilization × capacity, when a GPU is given
  if (o.gpu) {
    budget = static_cast<uint64_t>(std::floor(o.gpu_memory_utilization * static_cast<double>(o.gpu->capacity_bytes)));
  }
  Tally tally = TallyWeights(layout, tensors, o.par, o.pp);
  AddRuntime(c, o, budget, &tally.stages);
  r.stages = std::move(tally.stages);
  r.heaviest_stage = Heaviest(r.stages);
  r.options = o;

  const StagePlan& h = r.heaviest();
  if (h.weights != h.loaded_weights) {
    r.notes.push_back("per-GPU weights include " + GB(h.weights - h.loaded_weights) +
                      " of padding (vocab rows rounded up, MoE intermediate padded to a multiple of " +
                      std::to_string(o.par.pad_align) + ")");
  }
  if (o.prefix_caching && !h.snapshots && KdaLayersIn(c, h.first_layer, h.last_layer) > 0) {
    r.notes.push_back("prefix caching (on by default in serve) also keeps KDA snapshots of " +
                      GB(KdaSnapshotBytes(c, o.par.tp, KdaLayersIn(c, h.first_layer, h.last_layer))) +
                      " each per GPU, not counted here: give a GPU (serve gives them " +
                      Fmt("%g", 100 * o.kda_snapshot_fraction) +
                      "% of the cache budget) or --kda-snapshots N; --no-enable-prefix-caching plans without");
  }
  if (o.gpu) {
    r.gpu = o.gpu;
    r.budget_bytes = *budget;
    r.fits = h.total() <= r.budget_bytes;
    // Tokens of latent KV the budget holds beside the weights and the fixed per-sequence state.
    const int64_t latent = c.kv_lora_rank + c.qk_rope_head_dim;
    const int64_t per_token = latent * (o.kv_cache_dtype == PlanKvDType::kFP8 ? 1 : 2) *
                              std::max<int64_t>(1, [&] {
                                int64_t m = 0;
                                for (int64_t i = h.first_layer; i <= h.last_layer; ++i) m += !c.IsKdaLayer(i);
                                return m;
                              }());
    const uint64_t kv_now = h.runtime.empty() ? 0 : h.runtime[0].bytes;
    const uint64_t fixed = h.weights + h.runtime_bytes - kv_now;
    r.kv_token_capacity =
        r.budget_bytes > fixed ? static_cast<int64_t>((r.budget_bytes - fixed) / static_cast<uint64_t>(per_token)) : 0;
    if (!r.fits && o.suggest) r.smallest_fit = SearchSmallestFit(layout, tensors, o, r.budget_bytes);
  }
  return r;
}

std::string PlacementText(Category cat, const PlanOptions& o) {
  switch (cat) {
    case Category::kDenseMlp: return "gate/up column parallel; down row parallel";
    case Category::kRoutedExpert:
      return o.par.ep > 1 ? "experts split by ID over " + std::to_string(o.par.ep) + " ranks"
                          : "all expert IDs on every rank; each expert matrix TP-sharded";
    case Category::kSharedExpert: return "gate/up column parallel; down row parallel";
    case Category::kKdaGemm: return "head projections sharded; f_a replicated";
    case Category::kMlaGemm: return "head projections sharded; q_a/kv_a replicated";
    case Category::kNorm:
      return o.par.load_vision ? "replicated (vision norms too)" : "replicated; vision norms skipped";
    case Category::kOther:
      return std::string("embedding and LM head vocab-sharded; ") +
             (o.par.shard_latent_moe ? "LatentMoE down column / up row parallel; router, AttnRes replicated; "
                                     : "router, LatentMoE, AttnRes replicated; ") +
             (o.par.load_vision ? "vision replicated" : "vision skipped");
  }
  return "";
}

std::string LayoutName(int tp, int pp, int ep) {
  std::string s = "TP" + std::to_string(tp);
  if (pp > 1) s += " × PP" + std::to_string(pp);
  if (ep > 1) s += " (EP" + std::to_string(ep) + ")";
  return s;
}

}  // namespace

Result<PlanReport> PlanFromLayout(const Layout& layout, const PlanOptions& options,
                                  std::string source) {
  std::vector<const TensorSpec*> tensors;
  tensors.reserve(layout.size());
  for (const TensorSpec& t : layout.tensors()) tensors.push_back(&t);
  return PlanTensors(layout, tensors, options, std::move(source));
}

Result<PlanReport> PlanFromCheckpoint(const Layout& layout, const Checkpoint& checkpoint,
                                      const PlanOptions& options, std::string source) {
  LayoutMismatch mismatch = CheckCheckpoint(layout, checkpoint);
  KIMIRT_RETURN_IF_ERROR(mismatch.ToStatus(checkpoint.dir()));
  // Count each tensor with the dtype it is stored in (the layout allows an alternative for the
  // F32 islands, spec §15.3); shapes already match.
  std::vector<TensorSpec> overridden;
  overridden.reserve(16);
  std::vector<const TensorSpec*> tensors;
  tensors.reserve(layout.size());
  size_t n_override = 0;
  for (const TensorSpec& t : layout.tensors()) {
    if (checkpoint.Find(t.name)->info->dtype != t.dtype) ++n_override;
  }
  overridden.reserve(n_override);  // no reallocation: the pointers below stay valid
  for (const TensorSpec& t : layout.tensors()) {
    const DType stored = checkpoint.Find(t.name)->info->dtype;
    if (stored == t.dtype) {
      tensors.push_back(&t);
    } else {
      overridden.push_back(t);
      overridden.back().dtype = stored;
      tensors.push_back(&overridden.back());
    }
  }
  KIMIRT_ASSIGN_OR_RETURN(PlanReport r, PlanTensors(layout, tensors, options, std::move(source)));
  if (r.checkpoint_bytes != checkpoint.total_bytes()) {
    return Internal("planner counted " + std::to_string(r.checkpoint_bytes) +
                    " bytes but the checkpoint holds " + std::to_string(checkpoint.total_bytes()));
  }
  if (n_override > 0) {
    r.notes.push_back(std::to_string(n_override) +
                      " tensors are stored in their alternative dtype (BF16/F32 islands) and counted as stored");
  }
  return r;
}

std::string FormatPlanGiB(uint64_t bytes) { return GiB(bytes); }
std::string FormatPlanCount(int64_t n) { return Commas(n); }

std::string FormatPlanText(const PlanReport& r) {
  const PlanOptions& o = r.options;
  const StagePlan& h = r.heaviest();
  const std::string layout = LayoutName(o.par.tp, o.pp, o.par.ep);
  std::string s;
  s += r.model + ": " + std::to_string(r.layers) + " layers (" + std::to_string(r.kda_layers) +
       " KDA + " + std::to_string(r.mla_layers) + " MLA), " + std::to_string(r.experts) +
       " routed experts, top-" + std::to_string(r.experts_per_token) + "\n";
  s += "source: " + r.source + ": " + Commas(r.num_tensors) + " tensors, " +
       Commas(static_cast<int64_t>(r.checkpoint_bytes)) + " bytes\n";
  s += "layout: " + layout + " = " + std::to_string(o.par.tp * o.pp) + " GPU" +
       (o.par.tp * o.pp > 1 ? "s" : "") + (o.par.load_vision ? ", vision loaded" : ", text only") + "\n";
  if (o.pp > 1) {
    s += "pipeline stages (layers): ";
    for (const StagePlan& sp : r.stages) {
      s += (sp.stage ? ", " : "") + std::to_string(sp.first_layer) + "-" + std::to_string(sp.last_layer);
    }
    s += "; per-GPU columns show stage " + std::to_string(r.heaviest_stage) + ", the heaviest\n";
  }

  s += "\nWeights (decimal GB; per GPU = the slice one rank loads, in checkpoint dtypes)\n";
  const std::string col = layout + " per GPU";
  s += "  " + Pad("Weight category", 22) + PadLeft("Full checkpoint", 17) + PadLeft(col, 22) +
       "   Placement\n";
  for (int k = 0; k < kNumCategories; ++k) {
    const Category cat = static_cast<Category>(k);
    s += "  " + Pad(std::string(CategoryName(cat)), 22) + PadLeft(GB(r.full_bytes[k]), 17) +
         PadLeft(GB(h.weight_bytes[k]), 22) + "   " + PlacementText(cat, o) + "\n";
  }
  s += "  " + Pad("Loader-aware total", 22) + PadLeft(GB(r.checkpoint_bytes), 17) +
       PadLeft(GB(h.weights), 22) + "   replicated weights included; unloaded vision excluded\n";
  if (r.vision_tensors > 0) {
    s += "  (the full column includes the vision tower + projector: " +
         std::to_string(r.vision_tensors) + " tensors, " + GB(r.vision_bytes) + ", " +
         (o.par.load_vision ? "loaded replicated" : "not loaded by the text server") + ")\n";
  }

  s += "\nRuntime state for " + (o.num_seqs == 1 ? std::string("one sequence") : Commas(o.num_seqs) + " sequences") +
       " of " + Commas(o.context_tokens) + " tokens (decimal GB, per GPU)\n";
  s += "  " + Pad("Runtime state", 25) + Pad("Size calculation", 58) + PadLeft("Layers", 6) +
       PadLeft("Per GPU", 12) + "   Scaling\n";
  for (const RuntimeRow& row : h.runtime) {
    s += "  " + Pad(row.name, 25) + Pad(row.formula, 58) + PadLeft(std::to_string(row.layers), 6) +
         PadLeft(GB(row.bytes), 12) + "   " + row.scaling + "\n";
  }
  s += "  " + Pad("Known additional memory", 25) + Pad("", 58) + PadLeft("", 6) +
       PadLeft(GB(h.runtime_bytes), 12) + "   excludes kernel workspaces, comm buffers, graphs\n";

  s += "\nCombined (GiB = 2^30 bytes)\n";
  const std::string dep = (r.gpu ? r.gpu->name + " " : std::string()) + layout;
  s += "  " + Pad("Deployment", 20) + PadLeft("Model weights", 15) + PadLeft("Context", 13) +
       PadLeft("Known total", 14);
  if (r.gpu) s += PadLeft("HBM capacity", 14) + PadLeft("Utilization", 13) + PadLeft("Remaining", 14);
  s += "\n  " + Pad(dep, 20) + PadLeft(GiB(h.weights), 15) + PadLeft(GiB(h.runtime_bytes), 13) +
       PadLeft(GiB(h.total()), 14);
  if (r.gpu) {
    const double cap = static_cast<double>(r.gpu->capacity_bytes);
    const double cap_gib = cap / kGiB;
    s += PadLeft(cap_gib == std::floor(cap_gib) ? Fmt("%.0f GiB", cap_gib) : Fmt("%.3f GiB", cap_gib), 14) +
         PadLeft(Fmt("%.1f%%", 100.0 * static_cast<double>(h.total()) / cap), 13) +
         PadLeft(Fmt("%.3f GiB", (cap - static_cast<double>(h.total())) / kGiB), 14);
  }
  s += "\n";

  if (r.gpu) {
    s += "\nGPU: " + r.gpu->name + ", sold as " + r.gpu->sold_as + "; capacity " +
         Commas(static_cast<int64_t>(r.gpu->capacity_bytes)) + " bytes (" + r.gpu->basis + ")\n";
    s += "Budget at --gpu-memory-utilization " + Fmt("%.2f", o.gpu_memory_utilization) + ": " +
         GiB(r.budget_bytes) + " per GPU\n";
    if (r.fits) {
      s += "Verdict: FITS on " + std::to_string(o.par.tp * o.pp) + " × " + r.gpu->name + " (" +
           layout + "), " + GiB(r.budget_bytes - h.total()) + " left under the budget on the heaviest GPU; " +
           "the budget holds " + Commas(r.kv_token_capacity) + " latent-KV tokens in all\n";
    } else {
      s += "Verdict: DOES NOT FIT on " + std::to_string(o.par.tp * o.pp) + " × " + r.gpu->name + " (" +
           layout + "): the heaviest GPU needs " + GiB(h.total()) + ", " +
           GiB(h.total() - r.budget_bytes) + " over the budget\n";
      if (r.smallest_fit) {
        const LayoutChoice& f = *r.smallest_fit;
        s += "Smallest layout that fits: " + std::to_string(f.gpus()) + " × " + r.gpu->name + " as " +
             LayoutName(f.tp, f.pp, f.ep) + " (" + GiB(f.per_gpu_bytes) +
             " on the heaviest GPU); rerun with -tp " + std::to_string(f.tp) +
             (f.pp > 1 ? " -pp " + std::to_string(f.pp) : "") + " for its tables\n";
      } else if (o.suggest) {
        s += "No layout of up to 1024 GPUs fits this context on " + r.gpu->name + "\n";
      }
    }
  }
  for (const std::string& n : r.notes) s += "note: " + n + "\n";
  return s;
}

std::string FormatPlanJson(const PlanReport& r) {
  using Json = nlohmann::ordered_json;
  const PlanOptions& o = r.options;
  Json j;
  j["model"] = r.model;
  j["source"] = r.source;
  j["layers"] = {{"total", r.layers}, {"kda", r.kda_layers}, {"mla", r.mla_layers}};
  j["checkpoint"] = {{"tensors", r.num_tensors},
                     {"bytes", r.checkpoint_bytes},
                     {"vision_tensors", r.vision_tensors},
                     {"vision_bytes", r.vision_bytes}};
  j["layout"] = {{"tp", o.par.tp},
                 {"pp", o.pp},
                 {"ep", o.par.ep},
                 {"gpus", o.par.tp * o.pp},
                 {"moe_pad_align", o.par.pad_align},
                 {"with_vision", o.par.load_vision}};
  j["context"] = {{"tokens_per_sequence", o.context_tokens},
                  {"num_sequences", o.num_seqs},
                  {"kv_cache_dtype", o.kv_cache_dtype == PlanKvDType::kFP8 ? "fp8" : "bf16"},
                  {"attn_res_chunk_tokens", o.attn_res_chunk_tokens},
                  {"prefix_caching", o.prefix_caching}};
  Json cats = Json::array();
  const StagePlan& h = r.heaviest();
  for (int k = 0; k < kNumCategories; ++k) {
    cats.push_back({{"category", std::string(CategoryName(static_cast<Category>(k)))},
                    {"full_bytes", r.full_bytes[static_cast<size_t>(k)]},
                    {"per_gpu_bytes", h.weight_bytes[static_cast<size_t>(k)]}});
  }
  j["weights"] = {{"categories", cats},
                  {"full_bytes", r.checkpoint_bytes},
                  {"per_gpu_bytes", h.weights},
                  {"per_gpu_loaded_bytes", h.loaded_weights}};
  Json rt = Json::array();
  for (const RuntimeRow& row : h.runtime) {
    rt.push_back({{"name", row.name}, {"formula", row.formula}, {"layers", row.layers}, {"bytes", row.bytes}});
  }
  j["runtime"] = {{"items", rt}, {"per_gpu_bytes", h.runtime_bytes}};
  if (h.snapshots) {
    j["runtime"]["kda_snapshots"] = {{"count", h.snapshots->count},
                                     {"bytes_each", h.snapshots->bytes_each},
                                     {"bytes", h.snapshots->bytes()},
                                     {"cache_budget_bytes", h.snapshots->cache_budget}};
  }
  Json stages = Json::array();
  for (const StagePlan& sp : r.stages) {
    stages.push_back({{"stage", sp.stage},
                      {"first_layer", sp.first_layer},
                      {"last_layer", sp.last_layer},
                      {"weights_bytes", sp.weights},
                      {"runtime_bytes", sp.runtime_bytes},
                      {"total_bytes", sp.total()}});
  }
  j["stages"] = stages;
  j["heaviest_stage"] = r.heaviest_stage;
  j["per_gpu_total_bytes"] = h.total();
  if (r.gpu) {
    j["gpu"] = {{"name", r.gpu->name},
                {"sold_as", r.gpu->sold_as},
                {"capacity_bytes", r.gpu->capacity_bytes},
                {"capacity_basis", r.gpu->basis}};
    j["verdict"] = {{"gpu_memory_utilization", o.gpu_memory_utilization},
                    {"budget_bytes", r.budget_bytes},
                    {"fits", r.fits},
                    {"utilization", static_cast<double>(h.total()) / static_cast<double>(r.gpu->capacity_bytes)},
                    {"remaining_bytes", static_cast<int64_t>(r.gpu->capacity_bytes) - static_cast<int64_t>(h.total())},
                    {"kv_token_capacity", r.kv_token_capacity}};
    if (r.smallest_fit) {
      j["verdict"]["smallest_fit"] = {{"tp", r.smallest_fit->tp},
                                      {"pp", r.smallest_fit->pp},
                                      {"ep", r.smallest_fit->ep},
                                      {"gpus", r.smallest_fit->gpus()},
                                      {"per_gpu_total_bytes", r.smallest_fit->per_gpu_bytes}};
    }
  }
  j["notes"] = r.notes;
  return j.dump(2) + "\n";
}

}  // namespace kimirt
