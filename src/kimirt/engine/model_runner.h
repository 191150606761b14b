// ModelRunner: one model replica as the engine drives it — on one rank, or on N tensor-parallel
// ranks (DESIGN.md "Multi-GPU and multi-node": the scheduler runs once and broadcasts; every
// rank runs the same forward on its shard). Sequences are handles; each rank keeps its own
// SequenceState and latent cache for a handle. Ranks receive the same calls in the same order,
// so their block allocators stay in lockstep and a reservation fails on all or none.
//
// Thread safety: one caller thread (the engine's step loop).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "kimirt/backend/tensor.h"
#include "kimirt/core/status.h"
#include "kimirt/model/config.h"
#include "kimirt/model/latent_kv_cache.h"

namespace kimirt {

class Model;

struct RunnerOptions {
  std::string device = "cpu";  // "cpu" or "cuda" (backend_factory.h)
  DType matrix_dtype = DType::kF32;  // GEMM weights as held on the device (weights.h LoadOptions)
  int tp = 1;                // ranks (CPU: in-process threads; CUDA: 1 for now)
  int64_t num_kv_blocks = 0; // latent cache blocks per rank; 0: from kv_cache_bytes
  uint64_t kv_cache_bytes = 0;
  // GPU devices: when > 0, the latent cache gets what this fraction of the GPU's memory leaves
  // after the weights (and whatever else is on the GPU), as vLLM's --gpu-memory-utilization.
  double gpu_memory_utilization = 0;
  int block_size = 128;
  KvCacheDType kv_cache_dtype = KvCacheDType::kF32;
};

class ModelRunner {
 public:
  using Handle = int64_t;
  virtual ~ModelRunner() = default;

  // Loads DIR on `options.tp` ranks of `options.device`. CUDA runs one rank (one GPU) so far;
  // more is an Unsupported error that says so.
  static Result<std::unique_ptr<ModelRunner>> Create(const std::string& model_dir, RunnerOptions options);
  // Drives an already loaded single-rank model (tests, tools). The model must outlive the runner.
  static Result<std::unique_ptr<ModelRunner>> ForModel(Model& model, RunnerOptions options);

  virtual const ModelConfig& config() const = 0;
  virtual int64_t kv_blocks_total() const = 0;
  virtual int64_t kv_blocks_free() const = 0;
  virtual int64_t kv_blocks_for(int64_t tokens) const = 0;

  virtual Handle NewSequence() = 0;
  // Makes the sequence's latent blocks cover `tokens` positions; ResourceExhausted (and no
  // change) if the pool is short.
  virtual Status Reserve(Handle h, int64_t tokens) = 0;
  // Forwards `ids` as the sequence's next tokens; rank 0's logits [T or 1, vocab].
  virtual Result<Tensor> Forward(Handle h, std::span<const int32_t> ids, bool last_only) = 0;
  // Frees the sequence's blocks and state.
  virtual void Release(Handle h) = 0;

  // How many sequences one ForwardDecode may take: more than 1 only where the backend computes
  // each row of a batch exactly as alone (Backend::RowInvariantRows), so batching keeps batch
  // invariance. 1: the engine forwards each sequence alone.
  virtual int64_t decode_batch_limit() const { return 1; }
  // One next token for each of `hs` (distinct, reserved); rank 0's logits [B, vocab], row b for hs[b].
  virtual Result<Tensor> ForwardDecode(std::span<const Handle> hs, std::span<const int32_t> ids);
};

}  // namespace kimirt
