// `kimirt bench model`: the engine in-process (no HTTP) on a model directory, or on a config with
// random weights: for each batch size B, B requests of `prompt_len` tokens run to `decode_tokens`
// outputs; reported are prefill tokens/s (all prompts) and the decode step time with B sequences
// running, and the decode step's memory traffic against a given bandwidth (--peak-gbps).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kimirt/core/dtype.h"
#include "kimirt/core/status.h"
#include "kimirt/model/latent_kv_cache.h"
#include "kimirt/model/layout.h"

namespace kimirt {

// Bytes one decode step must move through memory on one rank (TP slice), at `batch` sequences of
// `context` tokens: every weight except the embedding table and the routed experts, read once
// and shared by the batch; the routed experts the batch selects — in expectation
// E·(1 − (1 − k/E)^B) distinct experts per MoE layer, as if routing were uniform; each sequence's
// latent cache (every MLA layer reads all its positions); each sequence's KDA state, read and
// written. The roofline a decode step is held to: achieved bytes/s ÷ peak bandwidth.
// `weight_bytes`: 0: weights as stored in the checkpoint; 4: every weight widened to F32 (the CPU
// backend; MXFP4 experts then move 8× their stored bytes); 2: BF16- and MXFP4-stored weights held
// as BF16, F32-stored ones as F32. `mxfp4_as_stored`: MXFP4 experts count their stored bytes
// (4.25 bits a weight) whatever `weight_bytes` says — the CUDA backend holds them so.
uint64_t DecodeStepBytes(const Layout& layout, int tp, int batch, int64_t context, int kv_bytes_per_value,
                         int weight_bytes, bool mxfp4_as_stored = false, bool shard_latent_moe = false);

// Rank 0's weight bytes as `kimirt plan` counts them per GPU (tools/plan.h: the slices as placed,
// padding included, experts as stored, the vision tower not loaded); `ep` as plan's -ep; with
// `pp` stages, the heaviest stage's rank (plan's -pp).
uint64_t PlannedWeightBytes(const Layout& layout, int tp, int ep = 1, int pp = 1, bool shard_latent_moe = false);

struct BenchModelOptions {
  std::string model_dir;       // or
  std::string config_path;     // with random weights, made at load (ModelSource::RandomWeights)
  uint64_t seed = 0;
  std::string device = "cpu";  // or "cuda"
  DType matrix_dtype = DType::kF32;
  int tp = 1;
  int pp = 1;  // pipeline stages (RunnerOptions::pp)
  int pp_micro_batches = 0;  // micro-batches a decode step asks for (RunnerOptions::pp_micro_batches)
  bool expert_parallel = false;  // routed experts split by id over the tp ranks (ep = tp)
  bool shard_latent_moe = false;  // LatentMoE's latent projections split over the tp ranks
  std::vector<int> batch_sizes = {1, 8};
  int64_t prompt_len = 128;
  int64_t decode_tokens = 16;
  int prefill_chunk = 256;
  double peak_gb_per_s = 0;  // memory bandwidth to compare with (--gpu NAME or --peak-gbps); 0: none
  bool enforce_eager = false;  // no decode graphs (Model::set_decode_graphs)
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;  // the latent cache's element type (as serve's flag)
};

struct BenchModelPoint {
  int batch = 0;
  double prefill_seconds = 0, prefill_tokens_per_s = 0;
  double decode_seconds = 0, decode_step_ms = 0, decode_tokens_per_s = 0;
  uint64_t decode_step_bytes = 0;   // DecodeStepBytes at the mean context of the decode phase
  double decode_gb_per_s = 0;       // decode_step_bytes / step time
  double bandwidth_fraction = 0;    // decode_gb_per_s / peak (0 without a peak)
  double decode_step_ms_median = 0; // the median step of the decode phase (0: fewer than 3 tokens)
};

struct BenchModelReport {
  std::string model;
  std::string device = "cpu";
  DType matrix_dtype = DType::kF32;
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;
  std::string weights;                 // how the weights are held: "MXFP4 experts + BF16", "F32", ...
  uint64_t weight_bytes_planned = 0;   // `kimirt plan`'s per-GPU weight bytes for this config and TP
  uint64_t weight_bytes_on_device = 0; // bytes of the tensors rank 0 holds after loading (0: not known)
  // What loading the model took from the GPU by the driver's count (cudaMemGetInfo's in-use bytes
  // after Model::Load less before it; 0: not known): the tensors' bytes plus what the allocator
  // rounds them up to, the CUDA context and libraries' workspaces (TP 1 and PP 1 only).
  uint64_t device_bytes_loading_took = 0;
  double load_seconds = 0;             // making the runner: backends, weights (read or made), caches
  float max_abs_logit = 0;             // of a probe prompt's last logits (all finite, or the bench fails)
  int tp = 1;
  int ep = 1;
  int pp = 1;
  int pp_micro_batches = 0;
  int64_t prompt_len = 0, decode_tokens = 0;
  int prefill_chunk = 0;
  double peak_gb_per_s = 0;
  // Rank 0's decode steps run as graph replays, warm-up included (CUDA without --enforce-eager,
  // at any TP); the JSON's `cuda_graphs` is whether there were any.
  int64_t graph_replays = 0;
  // What the ranks' sums go through: "none" (one rank), "threads" (CPU thread ranks), or on GPUs
  // "nccl (all-gather + rank-ordered sum)", the batch-invariant all-reduce (nccl_communicator.h).
  std::string communicator = "none";
  std::vector<BenchModelPoint> points;
  std::string ToText() const;
  std::string ToJson() const;
};

Result<BenchModelReport> RunBenchModel(const BenchModelOptions& options);

}  // namespace kimirt
