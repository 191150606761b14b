#include "kimirt/tools/bench_model.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <mutex>

#include <nlohmann/json.hpp>

#include "kimirt/engine/engine.h"
#include "kimirt/backend/backend_factory.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/model/pipeline_stages.h"
#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"
#include "kimirt/model/model.h"
#include "kimirt/model/weights.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {
namespace {

using Clock = std::chrono::steady_clock;

// The largest |logit| of one prompt of min(prompt_len, 64) tokens, or an error when any logit is
// not finite: a model whose activations blow up (say, random weights drawn at the wrong scale)
// fails here, not as plausible-looking timings.
Result<float> ProbeLogits(ModelRunner& runner, int64_t prompt_len) {
  const int64_t V = runner.config().vocab_size;
  std::vector<int32_t> ids;
  for (int64_t k = 0; k < std::min<int64_t>(prompt_len, 64); ++k) ids.push_back(static_cast<int32_t>((k * 131 + 7) % V));
  const ModelRunner::Handle h = runner.NewSequence();
  Status reserved = runner.Reserve(h, static_cast<int64_t>(ids.size()));
  Result<Tensor> logits = reserved.ok() ? runner.Forward(h, ids, /*last_only=*/true) : Result<Tensor>(reserved);
  runner.Release(h);
  if (!logits.ok()) return logits.status();
  float max_abs = 0;
  int64_t bad = 0;
  for (int64_t i = 0; i < logits->numel(); ++i) {
    const float v = logits->f32()[i];
    if (!std::isfinite(v)) ++bad;
    else max_abs = std::max(max_abs, std::fabs(v));
  }
  if (bad > 0) {
    return Internal("the model's logits are not finite: " + std::to_string(bad) + " of " +
                    std::to_string(logits->numel()) + " after a " + std::to_string(ids.size()) + "-token prompt");
  }
  return max_abs;
}

}  // namespace

uint64_t DecodeStepBytes(const Layout& layout, int tp, int batch, int64_t context, int kv_bytes_per_value,
                         int weight_bytes, bool mxfp4_as_stored, bool shard_latent_moe) {
  const ModelConfig& c = layout.config();
  Parallelism par;
  par.tp = tp;
  par.shard_latent_moe = shard_latent_moe;
  par.experts_dequantized = true;  // count the stored bytes of each rank's slice
  double shared = 0, experts = 0;
  for (const TensorSpec& t : layout.tensors()) {
    if (t.component == Component::kVision) continue;
    if (t.role == TensorRole::kEmbed) continue;
    double bytes = static_cast<double>(layout.SliceFor(t, par, 0).loaded_bytes);
    const bool mxfp4 = IsMxfp4Codes(t.role) || IsMxfp4Scales(t.role);
    if (weight_bytes > 0 && !(mxfp4 && mxfp4_as_stored)) {
      // Logical elements × the bytes they are held in: packed MXFP4 bytes hold 2 elements and
      // their scales are folded in; in BF16 mode, F32-stored tensors stay F32.
      const bool packed = IsMxfp4Codes(t.role);
      const bool scale = IsMxfp4Scales(t.role);
      const double held = t.dtype == DType::kF32 ? 4.0 : static_cast<double>(weight_bytes);
      bytes = scale ? 0.0 : bytes / static_cast<double>(DTypeSize(t.dtype)) * (packed ? 2.0 : 1.0) * held;
    }
    (t.category == Category::kRoutedExpert ? experts : shared) += bytes;
  }
  // Expected distinct experts a batch touches per MoE layer, relative to all of them.
  const double E = static_cast<double>(c.num_experts), k = static_cast<double>(c.num_experts_per_token);
  const double touched = E > 0 ? 1.0 - std::pow(1.0 - k / E, batch) : 0.0;
  const double latent = static_cast<double>(batch) * static_cast<double>(context) *
                        static_cast<double>(c.kv_lora_rank + c.qk_rope_head_dim) * kv_bytes_per_value *
                        static_cast<double>(c.NumMlaLayers());
  const double H = static_cast<double>(c.linear_attn.num_heads / tp), K = static_cast<double>(c.linear_attn.head_dim);
  const double kda = 2.0 * static_cast<double>(batch) * H * K * K * 4.0 * static_cast<double>(c.NumKdaLayers());
  return static_cast<uint64_t>(shared + touched * experts + latent + kda);
}

uint64_t PlannedWeightBytes(const Layout& layout, int tp, int ep, int pp, bool shard_latent_moe) {
  Parallelism par;
  par.tp = tp;  // experts as stored, vision not loaded: as `kimirt plan` places them
  par.ep = ep;
  par.shard_latent_moe = shard_latent_moe;
  const std::vector<PipelineStage> stages = PipelineStages(layout.config().num_hidden_layers, pp);
  std::vector<uint64_t> per_stage(stages.size(), 0);
  for (const TensorSpec& t : layout.tensors()) {
    const TensorSlice s = layout.SliceFor(t, par, 0);
    if (s.loaded) per_stage[static_cast<size_t>(StageOfTensor(t, stages))] += s.allocated_bytes;
  }
  return *std::max_element(per_stage.begin(), per_stage.end());
}

Result<BenchModelReport> RunBenchModel(const BenchModelOptions& opt) {
  if (opt.model_dir.empty() == opt.config_path.empty()) {
    return InvalidArgument("give --model DIR or --config FILE --random-weights");
  }
  if (opt.prompt_len < 1 || opt.decode_tokens < 1) return InvalidArgument("--prompt-len and decode tokens must be >= 1");
  if (opt.prefill_chunk < 1) return InvalidArgument("--prefill-chunk must be >= 1");
  ModelSource source = ModelSource::Directory(opt.model_dir);
  if (!opt.config_path.empty()) {
    // Random weights, made at load by each rank for its own slices (no checkpoint on disk).
    source = ModelSource::RandomWeights(opt.config_path, opt.seed);
    KIMIRT_ASSIGN_OR_RETURN(ModelConfig rc, LoadModelConfig(opt.config_path));
    KIMIRT_ASSIGN_OR_RETURN(Layout rl, Layout::Build(rc));
    if (opt.device == "cpu" && rl.total_bytes() > (uint64_t{16} << 30)) {
      return Unsupported(opt.config_path + ": " + std::to_string(rl.total_bytes() >> 30) +
                         " GiB of random weights (twice that as the CPU's F32) is beyond a CPU benchmark; use a "
                         "smaller config or a GPU");
    }
  }

  int max_batch = 1;
  for (int b : opt.batch_sizes) {
    if (b < 1) return InvalidArgument("--batch-sizes: batch sizes must be >= 1");
    max_batch = std::max(max_batch, b);
  }
  RunnerOptions ro;
  ro.device = opt.device;
  ro.matrix_dtype = opt.matrix_dtype;
  ro.tp = opt.tp;
  ro.pp = opt.pp;
  ro.pp_micro_batches = opt.pp_micro_batches;
  ro.ep = opt.expert_parallel ? opt.tp : 1;
  ro.shard_latent_moe = opt.shard_latent_moe;
  ro.block_size = 64;
  ro.kv_cache_dtype = opt.kv_cache_dtype;
  // Every sequence's whole context, plus the engine's admission check of one prefill chunk.
  ro.num_kv_blocks = static_cast<int64_t>(max_batch) * ((opt.prompt_len + opt.decode_tokens) / 64 + 2) +
                     (opt.prefill_chunk + 63) / 64;
  // One rank: load the model here, so the bytes its weights hold on the device can be counted
  // against the plan; more ranks: the runner loads them.
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;
  std::unique_ptr<ModelRunner> runner;
  uint64_t held_bytes = 0, loading_took = 0;
  const Clock::time_point load_start = Clock::now();
  if (opt.tp == 1 && opt.pp == 1 && (opt.device != "cpu" || opt.matrix_dtype == DType::kF32)) {
    KIMIRT_ASSIGN_OR_RETURN(backend, MakeBackend(opt.device));
    comm = MakeSingleRankCommunicator();
    LoadOptions lo;
    lo.matrix_dtype = opt.matrix_dtype;
    const std::optional<Backend::MemoryInfo> before = backend->DeviceMemory();
    KIMIRT_ASSIGN_OR_RETURN(model, Model::Load(source, *backend, *comm, lo));
    model->set_decode_graphs(!opt.enforce_eager);
    held_bytes = HeldBytes(model->weights());
    const std::optional<Backend::MemoryInfo> after = backend->DeviceMemory();
    if (before && after && before->free > after->free) loading_took = before->free - after->free;
    KIMIRT_ASSIGN_OR_RETURN(runner, ModelRunner::ForModel(*model, ro));
  } else {
    KIMIRT_ASSIGN_OR_RETURN(runner, ModelRunner::Create(source, ro));
  }
  const double load_seconds = std::chrono::duration<double>(Clock::now() - load_start).count();
  const ModelConfig& c = runner->config();
  KIMIRT_ASSIGN_OR_RETURN(Layout layout, Layout::Build(c));
  // Numerical sanity first (random weights above all): one prompt's last logits must be finite.
  KIMIRT_ASSIGN_OR_RETURN(const float max_logit, ProbeLogits(*runner, opt.prompt_len));
  EngineOptions eo;
  eo.max_num_seqs = max_batch;
  eo.prefill_chunk = opt.prefill_chunk;
  // Room for every sequence's prefill chunk in one step: the batch prefills in lockstep, so all
  // of it is decoding from the same step on and the decode phase times full-batch steps.
  eo.max_num_batched_tokens = std::max<int32_t>(opt.prefill_chunk * max_batch, max_batch);
  eo.max_model_len = std::min<int64_t>(c.max_position_embeddings > 0 ? c.max_position_embeddings : (1 << 20),
                                       opt.prompt_len + opt.decode_tokens + 1);
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(*runner, nullptr, eo));

  BenchModelReport report;
  report.model = source.ToString();
  report.device = opt.device;
  report.matrix_dtype = opt.matrix_dtype;
  report.kv_cache_dtype = opt.kv_cache_dtype;
  // CUDA holds MXFP4 experts as stored (weights.h); the CPU widens every weight to F32.
  const bool mxfp4_as_stored = opt.device != "cpu" && c.quantization.routed_experts_mxfp4;
  report.weights = (mxfp4_as_stored ? "MXFP4 experts + " : "") + std::string(opt.matrix_dtype == DType::kBF16 ? "BF16" : "F32");
  KIMIRT_RETURN_IF_ERROR(CheckPipelineDegree(c.num_hidden_layers, opt.pp));
  report.weight_bytes_planned = PlannedWeightBytes(layout, opt.tp, ro.ep, opt.pp, opt.shard_latent_moe);
  report.weight_bytes_on_device = held_bytes;
  report.device_bytes_loading_took = loading_took;
  report.load_seconds = load_seconds;
  report.max_abs_logit = max_logit;
  report.tp = opt.tp;
  report.ep = ro.ep;
  report.pp = opt.pp;
  report.pp_micro_batches = opt.pp_micro_batches;
  report.prompt_len = opt.prompt_len;
  report.decode_tokens = opt.decode_tokens;
  report.prefill_chunk = opt.prefill_chunk;
  report.peak_gb_per_s = opt.peak_gb_per_s;
  report.communicator = opt.tp * opt.pp == 1    ? "none"
                         : opt.device == "cpu" ? "threads"
                                               : "nccl (all-gather + rank-ordered sum)";
  {
    // Warm-up, untimed: first-use costs (page faults, GPU clocks ramping up from idle, kernel
    // loading, the allocator's first blocks) stay out of the numbers.
    std::mutex mu;
    std::condition_variable cv;
    bool done = false;
    EngineRequest r;
    r.id = "bench-warmup";
    for (int64_t k = 0; k < opt.prompt_len; ++k) r.prompt.push_back(static_cast<int32_t>((k * 31 + 5) % c.vocab_size));
    r.params.temperature = 0;
    r.params.max_tokens = static_cast<int32_t>(std::min<int64_t>(opt.decode_tokens, 8));
    r.params.ignore_eos = true;
    r.on_output = [&](const RequestOutput& o) {
      if (o.finish == FinishReason::kNone) return;
      std::lock_guard<std::mutex> lock(mu);
      done = true;
      cv.notify_all();
    };
    KIMIRT_RETURN_IF_ERROR(engine->Submit(std::move(r)));
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return done; });
  }
  int round = 0;
  for (int batch : opt.batch_sizes) {
    std::mutex mu;
    std::condition_variable cv;
    int first_tokens = 0, finished = 0;
    Clock::time_point prefill_done;
    // Request 0's outputs (time, tokens so far), to time single steps.
    std::vector<std::pair<Clock::time_point, int64_t>> token_times;
    for (int i = 0; i < batch; ++i) {
      EngineRequest r;
      r.id = "bench-" + std::to_string(round) + "-" + std::to_string(i);
      for (int64_t k = 0; k < opt.prompt_len; ++k) r.prompt.push_back(static_cast<int32_t>((k * 7919 + i * 104729 + 13) % c.vocab_size));
      r.params.temperature = 0;
      r.params.max_tokens = static_cast<int32_t>(opt.decode_tokens);
      r.params.ignore_eos = true;
      r.on_output = [&, i](const RequestOutput& o) {
        std::lock_guard<std::mutex> lock(mu);
        if (i == 0 && !o.token_ids.empty()) token_times.emplace_back(Clock::now(), o.completion_tokens);
        if (o.completion_tokens == 1 && !o.token_ids.empty() && ++first_tokens == batch) prefill_done = Clock::now();
        if (o.finish != FinishReason::kNone) {
          ++finished;
          cv.notify_all();
        }
      };
      if (i == 0) report.points.push_back({});
      KIMIRT_RETURN_IF_ERROR(engine->Submit(std::move(r)));
    }
    const Clock::time_point start = Clock::now();
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return finished == batch; });
    }
    const Clock::time_point end = Clock::now();
    BenchModelPoint& p = report.points.back();
    p.batch = batch;
    p.prefill_seconds = std::chrono::duration<double>(prefill_done - start).count();
    p.prefill_tokens_per_s = static_cast<double>(batch * opt.prompt_len) / p.prefill_seconds;
    p.decode_seconds = std::chrono::duration<double>(end - prefill_done).count();
    const double steps = static_cast<double>(std::max<int64_t>(1, opt.decode_tokens - 1));
    p.decode_step_ms = 1e3 * p.decode_seconds / steps;
    p.decode_tokens_per_s = static_cast<double>(batch) * steps / p.decode_seconds;
    // The median step: one-off costs (a decode graph's capture on a shape's second step, the
    // first step after prefill) stay out of it, which the mean above keeps.
    std::vector<double> gaps;
    for (size_t t = 2; t < token_times.size(); ++t) {
      const int64_t n = token_times[t].second - token_times[t - 1].second;
      if (n < 1) continue;
      const double ms = std::chrono::duration<double, std::milli>(token_times[t].first - token_times[t - 1].first).count();
      for (int64_t j = 0; j < n; ++j) gaps.push_back(ms / static_cast<double>(n));
    }
    if (!gaps.empty()) {
      std::nth_element(gaps.begin(), gaps.begin() + static_cast<std::ptrdiff_t>(gaps.size() / 2), gaps.end());
      p.decode_step_ms_median = gaps[gaps.size() / 2];
    }
    // The latent cache's values as stored; weights as the loader holds them.
    p.decode_step_bytes = DecodeStepBytes(layout, opt.tp, batch, opt.prompt_len + opt.decode_tokens / 2,
                                          KvCacheValueBytes(opt.kv_cache_dtype),
                                          opt.matrix_dtype == DType::kBF16 ? 2 : 4, mxfp4_as_stored,
                                          opt.shard_latent_moe);
    p.decode_gb_per_s = static_cast<double>(p.decode_step_bytes) / (p.decode_step_ms * 1e-3) / 1e9;
    p.bandwidth_fraction = opt.peak_gb_per_s > 0 ? p.decode_gb_per_s / opt.peak_gb_per_s : 0.0;
    ++round;
  }
  engine->Shutdown(/*drain=*/true);
  report.graph_replays = runner->graph_replays();
  return report;
}

std::string BenchModelReport::ToText() const {
  std::string s = "bench model: " + model + ", TP" + std::to_string(tp) + (ep > 1 ? " EP" + std::to_string(ep) : "") +
                  (pp > 1 ? " PP" + std::to_string(pp) : "") +
                  (pp > 1 && pp_micro_batches > 0 ? " (" + std::to_string(pp_micro_batches) + " micro-batches)" : "") +
                  ", prompt " + std::to_string(prompt_len) +
                  " tokens, " + std::to_string(decode_tokens) + " decode tokens, device " + device + ", weights " + weights +
                  (tp * pp > 1 ? ", communicator " + communicator : "") + (graph_replays > 0 ? ", decode graphs" : "") + "\n";
  if (weight_bytes_planned > 0) {
    char held[160];
    std::snprintf(held, sizeof(held), "weight bytes: planned %.3f GB, on the device %.3f GB (%+.2f%%)\n",
                  static_cast<double>(weight_bytes_planned) / 1e9, static_cast<double>(weight_bytes_on_device) / 1e9,
                  weight_bytes_on_device > 0 ? 100.0 * (static_cast<double>(weight_bytes_on_device) /
                                                         static_cast<double>(weight_bytes_planned) - 1.0)
                                             : 0.0);
    s += held;
    if (device_bytes_loading_took > 0) {
      std::snprintf(held, sizeof(held), "the load took %.3f GB of the GPU by the driver's count (%+.2f%% of planned)\n",
                    static_cast<double>(device_bytes_loading_took) / 1e9,
                    100.0 * (static_cast<double>(device_bytes_loading_took) / static_cast<double>(weight_bytes_planned) - 1.0));
      s += held;
    }
  }
  char line[160];
  std::snprintf(line, sizeof(line), "load: %.1f s (backends, weights, caches); logits finite, max |logit| %.2f\n",
                load_seconds, max_abs_logit);
  s += line;
  std::snprintf(line, sizeof(line), "%8s %16s %16s %12s %16s %14s %12s\n", "batch", "prefill tok/s", "decode ms/step",
                "median ms", "decode tok/s", "MB/step", "GB/s");
  s += line;
  for (const BenchModelPoint& p : points) {
    std::snprintf(line, sizeof(line), "%8d %16.1f %16.2f %12.2f %16.1f %14.1f %12.2f", p.batch, p.prefill_tokens_per_s,
                  p.decode_step_ms, p.decode_step_ms_median, p.decode_tokens_per_s, static_cast<double>(p.decode_step_bytes) / 1e6,
                  p.decode_gb_per_s);
    s += line;
    if (peak_gb_per_s > 0) {
      std::snprintf(line, sizeof(line), " = %.3f of %.0f GB/s", p.bandwidth_fraction, peak_gb_per_s);
      s += line;
    }
    s += "\n";
  }
  return s;
}

std::string BenchModelReport::ToJson() const {
  nlohmann::ordered_json j;
  j["model"] = model;
  j["device"] = device;
  j["weights"] = weights;
  j["matrix_dtype"] = DTypeName(matrix_dtype);
  j["kv_cache_dtype"] = KvCacheDTypeName(kv_cache_dtype);
  j["weight_bytes_planned"] = weight_bytes_planned;
  j["weight_bytes_on_device"] = weight_bytes_on_device;
  j["device_bytes_loading_took"] = device_bytes_loading_took;
  j["load_seconds"] = load_seconds;
  j["max_abs_logit"] = max_abs_logit;
  j["tp"] = tp;
  j["pp"] = pp;
  j["pp_micro_batches"] = pp_micro_batches;
  j["ep"] = ep;
  j["prompt_len"] = prompt_len;
  j["decode_tokens"] = decode_tokens;
  j["prefill_chunk"] = prefill_chunk;
  j["peak_gb_per_s"] = peak_gb_per_s;
  j["cuda_graphs"] = graph_replays > 0;
  j["graph_replays"] = graph_replays;
  j["communicator"] = communicator;
  j["points"] = nlohmann::ordered_json::array();
  for (const BenchModelPoint& p : points) {
    j["points"].push_back({{"batch", p.batch},
                           {"prefill_seconds", p.prefill_seconds},
                           {"prefill_tokens_per_s", p.prefill_tokens_per_s},
                           {"decode_seconds", p.decode_seconds},
                           {"decode_step_ms", p.decode_step_ms},
                           {"decode_tokens_per_s", p.decode_tokens_per_s},
                           {"decode_step_bytes", p.decode_step_bytes},
                           {"decode_gb_per_s", p.decode_gb_per_s},
                           {"bandwidth_fraction", p.bandwidth_fraction},
                           {"decode_step_ms_median", p.decode_step_ms_median}});
  }
  return j.dump(2) + "\n";
}

}  // namespace kimirt
