// ModelRunner: one model replica as the engine drives it — on one rank, or on N tensor-parallel
// ranks (times M pipeline stages) (DESIGN.md "Multi-GPU and multi-node": the scheduler runs once and broadcasts; every
// rank runs the same forward on its shard). Sequences are handles; each rank keeps its own
// SequenceState and latent cache for a handle. Ranks receive the same calls in the same order,
// so their block allocators stay in lockstep and a reservation fails on all or none.
//
// Thread safety: one caller thread (the engine's step loop).
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kimirt/backend/tensor.h"
#include "kimirt/core/status.h"
#include "kimirt/model/config.h"
#include "kimirt/model/latent_kv_cache.h"
#include "kimirt/model/model_source.h"

namespace kimirt {

class Model;
struct ArgmaxRequest;

struct RunnerOptions {
  std::string device = "cpu";  // "cpu" or "cuda" (backend_factory.h)
  DType matrix_dtype = DType::kF32;  // GEMM weights as held on the device (weights.h LoadOptions)
  int tp = 1;                // ranks (CPU: threads, or processes; CUDA: one process per GPU)
  // Pipeline stages (-pp; docs/distributed.md "Pipeline parallelism"): tp × pp ranks, numbered
  // stage-major (rank = stage · tp + tp rank), each stage's tp ranks a TP group holding its
  // layers (model/pipeline_stages.h). Rank 0 (stage 0) schedules and gets the logits.
  int pp = 1;
  // Pipeline stages: micro-batches a decode step asks for (Model::set_pipeline_micro_batches;
  // 0: one per stage). More where the backend's RowInvariantRows needs them (the CPU: one per
  // sequence).
  int pp_micro_batches = 0;
  // Pipeline stages: steps the engine may keep in flight (docs/distributed.md "Steps in flight"):
  // the next step enters the first stage while the later stages still run this one. 0: one per
  // stage; 1: a step at a time. GPUs: 1 unless asked for more (the logits then cross on an NCCL side
  // stream of their own; not yet run on GPUs).
  int steps_in_flight = 0;
  // Expert parallelism: 1, or tp (vLLM's --enable-expert-parallel): each rank holds E / tp
  // routed experts whole instead of a slice of every one (weights.h LoadOptions::ep).
  int ep = 1;
  // LatentMoE's latent projections split over the TP ranks (weights.h LoadOptions).
  bool shard_latent_moe = false;
  int64_t num_kv_blocks = 0; // latent cache blocks per rank; 0: from kv_cache_bytes
  uint64_t kv_cache_bytes = 0;
  // GPU devices: when > 0, the latent cache gets what this fraction of the GPU's memory leaves
  // after the weights (and whatever else is on the GPU), as vLLM's --gpu-memory-utilization.
  double gpu_memory_utilization = 0;
  int block_size = 128;
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;
  // KDA snapshots for the prefix cache (docs/prefix-caching.md). With num_kv_blocks given,
  // max_kda_snapshots is the count; when the cache is sized from bytes, kda_snapshot_fraction
  // of those bytes goes to snapshots and the rest to latent blocks, so both share one budget.
  int64_t max_kda_snapshots = 0;
  double kda_snapshot_fraction = 0;
  // No decode graphs: every step op by op (vLLM's --enforce-eager; Model::set_decode_graphs).
  bool enforce_eager = false;
  // CPU, tp > 1: one process per rank instead of one thread per rank (vLLM's
  // --distributed-executor-backend mp; docs/distributed.md "Process ranks"). Rank 0 stays in
  // this process; ranks 1..tp-1 are `rank_worker_binary rank-worker` children. CUDA with tp > 1
  // always runs so (rank r on GPU r, collectives over NCCL).
  bool process_ranks = false;
  std::string rank_worker_binary = "/proc/self/exe";
  // Process ranks: the longest any rank waits for another (a load, a collective, a command's
  // reply); a rank that dies ends the wait at once (its socket closes).
  int rank_timeout_ms = 300000;
  // Process ranks: each follower's CPU backend threads (SetCpuBackendThreads; 0: all cores), as
  // serve --threads sets them in rank 0's process.
  int follower_cpu_threads = 0;
  // Process ranks across nodes (docs/distributed.md "Multi-node"; dist/serve_ranks.h): the port
  // rank 0's followers connect to, on every interface (0: a free one, one host only), and how
  // many of them rank 0 starts itself — ranks 1..local_followers, its node's share (-1: all
  // tp - 1). The others are started on their nodes and connect on their own.
  int master_port = 0;
  int local_followers = -1;
};

class ModelRunner {
 public:
  using Handle = int64_t;
  virtual ~ModelRunner() = default;

  // Loads `source` (a model directory, or a config with random weights) on `options.tp` ranks of
  // `options.device`; every rank reads or makes only its own slices. CUDA with tp > 1: one
  // process per GPU (process_ranks_runner.h); fewer visible GPUs than ranks is an error naming
  // the rank.
  static Result<std::unique_ptr<ModelRunner>> Create(const ModelSource& source, RunnerOptions options);
  static Result<std::unique_ptr<ModelRunner>> Create(const std::string& model_dir, RunnerOptions options) {
    return Create(ModelSource::Directory(model_dir), std::move(options));
  }
  // Drives an already loaded single-rank model (tests, tools). The model must outlive the runner.
  static Result<std::unique_ptr<ModelRunner>> ForModel(Model& model, RunnerOptions options);

  virtual const ModelConfig& config() const = 0;
  virtual int64_t kv_blocks_total() const = 0;
  virtual int64_t kv_blocks_free() const = 0;
  virtual int64_t kv_blocks_for(int64_t tokens) const = 0;

  // OK while every rank can run; once a rank has died or failed, the error naming it (every
  // later Forward returns it too). Runners whose ranks share this process are always healthy.
  // Unlike the other calls, any thread may ask (the server's /health does).
  virtual Status health() const { return Status::Ok(); }

  virtual Handle NewSequence() = 0;
  // Makes the sequence's latent blocks cover `tokens` positions; ResourceExhausted (and no
  // change) if the pool is short.
  virtual Status Reserve(Handle h, int64_t tokens) = 0;
  // Forwards `ids` as the sequence's next tokens; rank 0's logits [T or 1, vocab]. With
  // `argmax`, rows it marks may come back as their argmax only (model.h ArgmaxRequest).
  virtual Result<Tensor> Forward(Handle h, std::span<const int32_t> ids, bool last_only,
                                 ArgmaxRequest* argmax = nullptr) = 0;
  // Frees the sequence's blocks and state.
  virtual void Release(Handle h) = 0;

  // --- Prefix caching (engine/prefix_cache.h). Block ids are rank 0's; ranks allocate in
  // lockstep, so every rank's table holds the same ids.
  using SnapshotId = int64_t;
  virtual int kv_block_size() const = 0;
  virtual KvCacheDType kv_cache_dtype() const = 0;
  // The sequence's latent block table.
  virtual std::vector<int32_t> BlockTable(Handle h) const = 0;
  // References of a block (LatentKvCache::refs): held by the prefix cache only when 1.
  virtual int32_t kv_block_refs(int32_t block) const = 0;
  // One more / one less reference to each block (the prefix cache's own).
  virtual void RetainBlocks(std::span<const int32_t> blocks) = 0;
  virtual void ReleaseBlocks(std::span<const int32_t> blocks) = 0;
  // A fresh sequence (no blocks, no tokens) takes `blocks` as the first of its table, shared,
  // and continues at position `tokens` (= blocks.size() * kv_block_size()).
  virtual void SharePrefix(Handle h, std::span<const int32_t> blocks, int64_t tokens) = 0;
  // A copy of every KDA layer's recurrent state and conv windows on every rank (Backend ops, on
  // the device), and putting one back: a sequence restored from a snapshot continues exactly as
  // the sequence it was taken from did at that point.
  virtual SnapshotId SnapshotKda(Handle h) = 0;
  virtual void RestoreKda(Handle h, SnapshotId snapshot) = 0;
  virtual void DropKdaSnapshot(SnapshotId snapshot) = 0;
  // Device bytes of one snapshot on one rank, and how many the budget holds.
  virtual uint64_t kda_snapshot_bytes() const = 0;
  virtual int64_t kda_snapshot_capacity() const = 0;

  // How many sequences one ForwardDecode may take: more than 1 only where the backend computes
  // each row of a batch exactly as alone (Backend::RowInvariantRows), so batching keeps batch
  // invariance. 1: the engine forwards each sequence alone. Pipeline stages take the whole
  // step: the model splits it into micro-batches of row-invariant size (Model::ForwardDecode).
  virtual int64_t decode_batch_limit() const { return 1; }
  // One next token for each of `hs` (distinct, reserved); rank 0's logits [B, vocab], row b for hs[b].
  virtual Result<Tensor> ForwardDecode(std::span<const Handle> hs, std::span<const int32_t> ids,
                                       ArgmaxRequest* argmax = nullptr);

  // One prefill chunk of a step (ForwardStep): Forward's arguments.
  struct Chunk {
    Handle h = 0;
    std::span<const int32_t> ids;
    bool last_only = true;
    ArgmaxRequest* argmax = nullptr;
  };
  // A step's decode rows (ForwardStep): ForwardDecode's arguments.
  struct Decodes {
    std::span<const Handle> hs;
    std::span<const int32_t> ids;
    ArgmaxRequest* argmax = nullptr;
  };
  // ForwardStep's logits: the decode rows' (ForwardDecode's; undefined without decode rows) and
  // each chunk's (Forward's).
  struct StepLogits {
    Tensor decode;
    std::vector<Tensor> chunks;
  };
  // Whether ForwardStep overlaps a step's work (pipeline stages: its decode micro-batches and its
  // prefill chunks flow through the stages as one, each stage going on to the next call as soon
  // as it has sent one on; Model::ForwardStep). Otherwise the engine forwards the decodes in
  // batches of decode_batch_limit and each chunk alone.
  virtual bool step_in_flight() const { return false; }
  // Rank 0's decode steps run as graph replays so far (Model::graph_replays; 0 without graphs):
  // a test's or a bench's proof that graphs ran.
  virtual int64_t graph_replays() const { return 0; }
  // A step's decode rows and prefill chunks, of distinct, reserved sequences, in one call: the
  // decode logits exactly ForwardDecode's, chunk i's exactly Forward's for it. Any of them failing
  // fails the call, and on pipeline stages before any runs (all or nothing). The default: the
  // decodes' ForwardDecode, then each chunk's Forward.
  virtual Result<StepLogits> ForwardStep(const Decodes& decodes, std::span<const Chunk> chunks);
  // A step's prefill chunks only: ForwardStep's chunk logits.
  Result<std::vector<Tensor>> ForwardChunks(std::span<const Chunk> chunks);

  // Steps in flight (docs/distributed.md "Steps in flight"): how many steps the engine may have
  // submitted (SubmitStep) before it collects the oldest (CollectStep). More than 1 only where
  // the runner overlaps consecutive steps (pipeline stages: the next step's first
  // stage runs while the later stages finish this one); 1: each step submitted, then collected.
  virtual int steps_in_flight() const { return 1; }
  // Starts a step: ForwardStep's arguments, which (their spans, the argmax requests) must stay
  // valid until its CollectStep returns, and none of whose sequences may be in a step still in
  // flight. An error means nothing of the step ran; the runner's other calls (Reserve, Release,
  // the prefix cache's) may come between a submit and its collect, in the order they apply.
  // The default: ForwardStep at once, its logits kept for CollectStep.
  virtual Status SubmitStep(const Decodes& decodes, std::span<const Chunk> chunks);
  // The oldest submitted step's logits, exactly what its ForwardStep gives.
  virtual Result<StepLogits> CollectStep();

 private:
  std::deque<StepLogits> submitted_;  // the default SubmitStep's results, oldest first
};

}  // namespace kimirt
