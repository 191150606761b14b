// One rank's state as a ModelRunner drives it (model_runner.cpp's runners, and each process of
// the process-ranks runner): shared so every runner applies a call to a rank the same way.
// Internal to engine/.
#pragma once

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kimirt/core/check.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/model/model.h"

namespace kimirt::runner {

// One rank's model, latent cache, KDA state slots, sequences and KDA snapshots.
struct Rank {
  Model* model = nullptr;
  std::unique_ptr<LatentKvCache> kv;
  std::unique_ptr<KdaStateSlots> kda;
  std::unordered_map<ModelRunner::Handle, SequenceState> seqs;
  std::unordered_map<ModelRunner::SnapshotId, std::vector<KdaStatePool>> snapshots;

  void SharePrefix(ModelRunner::Handle h, std::span<const int32_t> blocks, int64_t tokens) {
    SequenceState& st = seqs.at(h);
    KIMIRT_CHECK(st.blocks.empty() && st.length == 0);
    kv->Share(blocks);
    st.blocks.assign(blocks.begin(), blocks.end());
    st.length = tokens;
  }
  // The copy lives in pools of its own (KdaStateSlots::Snapshot): the sequence's slot is never
  // aliased, since the forward updates it in place.
  void SnapshotKda(ModelRunner::Handle h, ModelRunner::SnapshotId id) {
    snapshots.emplace(id, kda->Snapshot(seqs.at(h).kda_slot));
  }
  void RestoreKda(ModelRunner::Handle h, ModelRunner::SnapshotId id) {
    kda->Restore(seqs.at(h).kda_slot, snapshots.at(id));
  }

  Status Reserve(ModelRunner::Handle h, int64_t tokens) { return kv->Reserve(&seqs.at(h).blocks, tokens); }
  Result<Tensor> Forward(ModelRunner::Handle h, std::span<const int32_t> ids, bool last_only,
                         ArgmaxRequest* argmax = nullptr) {
    ForwardOptions o;
    o.all_logits = !last_only;
    o.argmax = argmax;
    return model->Forward(&seqs.at(h), ids, o);
  }
  Result<Tensor> ForwardDecode(std::span<const ModelRunner::Handle> hs, std::span<const int32_t> ids,
                               ArgmaxRequest* argmax = nullptr) {
    std::vector<SequenceState*> states;
    for (ModelRunner::Handle h : hs) states.push_back(&seqs.at(h));
    ForwardOptions o;
    o.argmax = argmax;
    return model->ForwardDecode(states, ids, o);
  }
  // Model::ForwardStep of the decodes and chunks; their argmax requests only where `with_argmax`
  // (rank 0).
  Result<ModelRunner::StepLogits> ForwardStep(const ModelRunner::Decodes& d, std::span<const ModelRunner::Chunk> chunks,
                                              bool with_argmax) {
    const StepArgs a = ArgsOf(d, chunks, with_argmax);
    KIMIRT_ASSIGN_OR_RETURN(StepLogits step, model->ForwardStep(a.decode(), a.chunks));
    return ModelRunner::StepLogits{std::move(step.decode), std::move(step.chunks)};
  }
  // Steps in flight: Model::LaunchStep of the same, and the first stage's Model::CollectStep.
  Result<StepInFlight> LaunchStep(const ModelRunner::Decodes& d, std::span<const ModelRunner::Chunk> chunks,
                                  bool with_argmax) {
    const StepArgs a = ArgsOf(d, chunks, with_argmax);
    return model->LaunchStep(a.decode(), a.chunks);
  }
  ModelRunner::StepLogits CollectStep(const StepInFlight& launched) {
    StepLogits step = model->CollectStep(launched);
    return ModelRunner::StepLogits{std::move(step.decode), std::move(step.chunks)};
  }

 private:
  // A step's arguments as the model takes them (pointers into `states` and `chunks`).
  struct StepArgs {
    std::vector<SequenceState*> states;
    std::vector<PrefillChunk> chunks;
    std::span<const int32_t> ids;
    ArgmaxRequest* argmax = nullptr;
    DecodeRows decode() const { return DecodeRows{states, ids, argmax}; }
  };
  StepArgs ArgsOf(const ModelRunner::Decodes& d, std::span<const ModelRunner::Chunk> chunks, bool with_argmax) {
    StepArgs a;
    for (ModelRunner::Handle h : d.hs) a.states.push_back(&seqs.at(h));
    for (const ModelRunner::Chunk& c : chunks) {
      a.chunks.push_back(PrefillChunk{&seqs.at(c.h), c.ids, !c.last_only, with_argmax ? c.argmax : nullptr});
    }
    a.ids = d.ids;
    a.argmax = with_argmax ? d.argmax : nullptr;
    return a;
  }
};

// ModelRunner::decode_batch_limit of a runner driving `m` on each of its ranks: the rows the
// backend keeps invariant; with pipeline stages, every decode of a step in one call (the model
// splits it into micro-batches that overlap the stages, each row its own bits).
inline int64_t DecodeBatchLimit(const Model& m) {
  return m.stage().pp > 1 ? std::numeric_limits<int32_t>::max() : m.backend().RowInvariantRows();
}

// ModelRunner::steps_in_flight of a runner under `o` (docs/distributed.md "Steps in flight"):
// under -pp, CPU ranks keep one per stage unless told (0); GPUs only when asked for more than 1 —
// their logits then take an NCCL communicator and stream of their own (not yet run on GPUs).
inline int StepsInFlight(const RunnerOptions& o) {
  if (o.pp == 1) return 1;
  if (o.device != "cpu") return std::max(1, o.steps_in_flight);
  return o.steps_in_flight > 0 ? o.steps_in_flight : o.pp;
}

// How the cache budget splits: latent blocks, and KDA snapshots for the prefix cache (one
// snapshot is every KDA layer's state of one sequence on this rank).
struct CacheSizes {
  int64_t blocks = 0;
  int64_t snapshots = 0;
  uint64_t snapshot_bytes = 0;
};

// KDA state slots a rank starts with; they double as more sequences run at once (the
// scheduler's max_num_seqs bounds them), so memory follows the concurrency actually reached.
constexpr int64_t kInitialKdaSlots = 8;
Result<CacheSizes> SizeCaches(Model& model, const RunnerOptions& o);

// GPU memory as vLLM's --gpu-memory-utilization sizes it: with o->gpu_memory_utilization > 0 and
// no num_kv_blocks, o->kv_cache_bytes becomes what that fraction of the device's memory leaves
// after the weights (and whatever else is on the GPU); returns whether it did (no change for
// host memory). Call after loading the weights.
Result<bool> SizeFromGpuMemory(Backend& backend, RunnerOptions* o);

// The smallest of every rank's `bytes`, to the MiB below, the same on all: ranks of one group
// size their caches alike, so their block allocators stay in lockstep. Collective, through the
// backend's memory (the communicator may take device pointers only).
uint64_t MinOverRanks(Communicator& comm, Backend& backend, uint64_t bytes);

}  // namespace kimirt::runner
