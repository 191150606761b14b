#include "kimirt/engine/model_runner.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <functional>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/check.h"
#include "kimirt/engine/kda_snapshot_budget.h"
#include "kimirt/engine/process_ranks_runner.h"
#include "kimirt/engine/runner_rank.h"
#include "kimirt/model/model.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {
namespace {

using runner::CacheSizes;
using runner::kInitialKdaSlots;
using runner::Rank;
using runner::SizeCaches;

// What a runner loaded from a directory owns; members end in reverse: the model before its
// communicator and backend.
struct LoadedModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Communicator> comm;
  std::unique_ptr<Model> model;
};

class SingleRankRunner final : public ModelRunner {
 public:
  // Drives `m`, which `owned` holds (ModelRunner::Create) or the caller keeps alive (ForModel).
  static Result<std::unique_ptr<ModelRunner>> Create(Model& m, const RunnerOptions& o, LoadedModel owned) {
    KIMIRT_ASSIGN_OR_RETURN(CacheSizes sizes, SizeCaches(m, o));
    auto r = std::unique_ptr<SingleRankRunner>(new SingleRankRunner());
    r->owned_ = std::move(owned);
    r->sizes_ = sizes;
    r->rank_.model = &m;
    r->rank_.kv = m.MakeKvCache(sizes.blocks, o.block_size, o.kv_cache_dtype, false);
    r->rank_.kda = m.MakeKdaStates(kInitialKdaSlots);
    return std::unique_ptr<ModelRunner>(std::move(r));
  }
  const ModelConfig& config() const override { return rank_.model->config(); }
  int64_t kv_blocks_total() const override { return rank_.kv->num_blocks(); }
  int64_t kv_blocks_free() const override { return rank_.kv->free_blocks(); }
  int64_t kv_blocks_for(int64_t tokens) const override { return rank_.kv->BlocksFor(tokens); }
  int64_t graph_replays() const override { return rank_.model->graph_replays(); }
  Handle NewSequence() override {
    rank_.seqs.emplace(next_, rank_.model->NewSequence(rank_.kv.get(), rank_.kda.get()));
    return next_++;
  }
  Status Reserve(Handle h, int64_t tokens) override { return rank_.Reserve(h, tokens); }
  Result<Tensor> Forward(Handle h, std::span<const int32_t> ids, bool last_only, ArgmaxRequest* argmax) override {
    return rank_.Forward(h, ids, last_only, argmax);
  }
  int64_t decode_batch_limit() const override { return runner::DecodeBatchLimit(*rank_.model); }
  Result<Tensor> ForwardDecode(std::span<const Handle> hs, std::span<const int32_t> ids,
                               ArgmaxRequest* argmax) override {
    return rank_.ForwardDecode(hs, ids, argmax);
  }
  void Release(Handle h) override { rank_.seqs.erase(h); }

  int kv_block_size() const override { return rank_.kv->block_size(); }
  KvCacheDType kv_cache_dtype() const override { return rank_.kv->dtype(); }
  std::vector<int32_t> BlockTable(Handle h) const override { return rank_.seqs.at(h).blocks; }
  int32_t kv_block_refs(int32_t b) const override { return rank_.kv->refs(b); }
  void RetainBlocks(std::span<const int32_t> blocks) override { rank_.kv->Share(blocks); }
  void ReleaseBlocks(std::span<const int32_t> blocks) override { rank_.kv->FreeBlocks(blocks); }
  void SharePrefix(Handle h, std::span<const int32_t> blocks, int64_t tokens) override {
    rank_.SharePrefix(h, blocks, tokens);
  }
  SnapshotId SnapshotKda(Handle h) override {
    rank_.SnapshotKda(h, next_snapshot_);
    return next_snapshot_++;
  }
  void RestoreKda(Handle h, SnapshotId id) override { rank_.RestoreKda(h, id); }
  void DropKdaSnapshot(SnapshotId id) override { rank_.snapshots.erase(id); }
  uint64_t kda_snapshot_bytes() const override { return sizes_.snapshot_bytes; }
  int64_t kda_snapshot_capacity() const override { return sizes_.snapshots; }

 private:
  SingleRankRunner() = default;

  LoadedModel owned_;  // declared first: outlives the rank's sequences and cache
  Rank rank_;
  CacheSizes sizes_;
  Handle next_ = 0;
  SnapshotId next_snapshot_ = 0;
};

// The smallest block and snapshot counts of the ranks (the largest snapshot): what every rank of
// a group allocates, so their allocators stay in lockstep.
CacheSizes LeastOf(const std::vector<CacheSizes>& sizes) {
  CacheSizes least = sizes[0];
  for (const CacheSizes& s : sizes) {
    least.blocks = std::min(least.blocks, s.blocks);
    least.snapshots = std::min(least.snapshots, s.snapshots);
    least.snapshot_bytes = std::max(least.snapshot_bytes, s.snapshot_bytes);
  }
  return least;
}

// N ranks on N threads. Every call is broadcast: each rank thread runs the same closure on its
// own Rank, every rank its queue of them in order (the model's collectives keep them in step).
// A forward waits for every rank; the lockstep calls (sequences, blocks, snapshots) and a
// submitted step (steps in flight) wait for rank 0's part only, their closures owning what they
// read, so the engine plans the next step while the later stages still run this one.
class ThreadRanksRunner final : public ModelRunner {
 public:
  ~ThreadRanksRunner() override {
    if (threads_.empty()) return;
    (void)Post([](Rank&, int) { return Status::Ok(); }, Wait::kEveryRank, /*quit=*/true);
    for (std::thread& t : threads_) t.join();
  }

  static Result<std::unique_ptr<ModelRunner>> Create(const ModelSource& source, RunnerOptions o) {
    auto r = std::unique_ptr<ThreadRanksRunner>(new ThreadRanksRunner());
    const int world = o.tp * o.pp;
    r->world_ = world;
    r->ranks_.resize(static_cast<size_t>(world));
    r->models_.resize(static_cast<size_t>(world));
    r->backends_.resize(static_cast<size_t>(world));
    r->queues_.resize(static_cast<size_t>(world));
    // Start-up handshake, shared with the rank threads (which outlive this function).
    struct Sync {
      std::mutex mu;
      std::condition_variable cv;
      int ready = 0;  // ranks that loaded (or failed to)
      int made = 0;   // ranks that made their caches
      std::vector<Status> load;
      std::vector<CacheSizes> sizes;
      bool all_ok() const {
        for (const Status& s : load) {
          if (!s.ok()) return false;
        }
        return true;
      }
    };
    auto sync = std::make_shared<Sync>();
    sync->load.resize(static_cast<size_t>(world));
    sync->sizes.resize(static_cast<size_t>(world));
    // The rank threads live as long as the runner: each runs its load, then its serve loop,
    // inside one RunOnThreadGrid (which owns the communicators: a TP group per stage, a pipeline
    // group per tp rank; world rank = stage · tp + tp rank).
    r->threads_.emplace_back([sync, source, o, world, raw = r.get()] {
      RunOnThreadGrid(o.tp, o.pp, [&](Communicator& comm, Communicator& pipeline) {
        const size_t k = static_cast<size_t>(pipeline.rank() * o.tp + comm.rank());
        Status st = [&]() -> Status {
          KIMIRT_ASSIGN_OR_RETURN(raw->backends_[k], MakeBackend(o.device));
          LoadOptions lo;
          lo.matrix_dtype = o.matrix_dtype;
          lo.ep = o.ep;
          lo.shard_latent_moe = o.shard_latent_moe;
          KIMIRT_ASSIGN_OR_RETURN(raw->models_[k], Model::Load(source, *raw->backends_[k], comm, lo, &pipeline));
          raw->models_[k]->set_pipeline_micro_batches(o.pp_micro_batches);
          KIMIRT_ASSIGN_OR_RETURN(sync->sizes[k], SizeCaches(*raw->models_[k], o));
          return Status::Ok();
        }();
        bool serve = false;
        {
          std::unique_lock<std::mutex> lock(sync->mu);
          sync->load[k] = std::move(st);
          ++sync->ready;
          sync->cv.notify_all();
          sync->cv.wait(lock, [&] { return sync->ready == world; });
          serve = sync->all_ok();  // serve only if every rank loaded
        }
        if (!serve) return;
        // Pipeline stages hold different layers, so a byte budget gives them different block and
        // snapshot counts: every rank takes the smallest, and the allocators stay in lockstep.
        const CacheSizes sizes = LeastOf(sync->sizes);
        if (k == 0) raw->sizes_ = sizes;
        raw->ranks_[k].model = raw->models_[k].get();
        raw->ranks_[k].kv = raw->models_[k]->MakeKvCache(sizes.blocks, o.block_size, o.kv_cache_dtype, false);
        raw->ranks_[k].kda = raw->models_[k]->MakeKdaStates(kInitialKdaSlots);
        if (k == 0) raw->steps_in_flight_ = runner::StepsInFlight(o);
        {
          std::lock_guard<std::mutex> lock(sync->mu);
          ++sync->made;
          sync->cv.notify_all();
        }
        raw->Serve(static_cast<int>(k));
      });
    });
    bool ok = false;
    Status first_error;
    {
      std::unique_lock<std::mutex> lock(sync->mu);
      sync->cv.wait(lock, [&] { return sync->ready == world; });
      ok = sync->all_ok();
      for (const Status& s : sync->load) {
        if (!s.ok()) {
          first_error = s;
          break;
        }
      }
    }
    if (!ok) {
      r->threads_[0].join();  // no rank serves: the group ends by itself
      r->threads_.clear();
      return first_error;
    }
    {
      std::unique_lock<std::mutex> lock(sync->mu);
      sync->cv.wait(lock, [&] { return sync->made == world; });
    }
    return std::unique_ptr<ModelRunner>(std::move(r));
  }

  const ModelConfig& config() const override { return models_[0]->config(); }
  int64_t kv_blocks_total() const override { return ranks_[0].kv->num_blocks(); }
  int64_t kv_blocks_free() const override { return ranks_[0].kv->free_blocks(); }
  int64_t kv_blocks_for(int64_t tokens) const override { return ranks_[0].kv->BlocksFor(tokens); }

  Handle NewSequence() override {
    const Handle h = next_++;
    OnEveryRank([h](Rank& r) { r.seqs.emplace(h, r.model->NewSequence(r.kv.get(), r.kda.get())); });
    return h;
  }
  Status Reserve(Handle h, int64_t tokens) override {
    return Post([h, tokens](Rank& r, int) { return r.Reserve(h, tokens); }, Wait::kRankZero);
  }
  Result<Tensor> Forward(Handle h, std::span<const int32_t> ids, bool last_only, ArgmaxRequest* argmax) override {
    return RankZeroLogits(
        [&](Rank& r, ArgmaxRequest* a) { return r.Forward(h, ids, last_only, a); }, argmax);
  }
  // Pipeline stages: each stage's thread runs its part of every micro-batch and goes on to the
  // next as soon as it has sent one on, so the stages' threads overlap (Model::ForwardDecode).
  int64_t decode_batch_limit() const override { return runner::DecodeBatchLimit(*models_[0]); }
  Result<Tensor> ForwardDecode(std::span<const Handle> hs, std::span<const int32_t> ids,
                               ArgmaxRequest* argmax) override {
    return RankZeroLogits([&](Rank& r, ArgmaxRequest* a) { return r.ForwardDecode(hs, ids, a); }, argmax);
  }
  // Pipeline stages: a step's decode micro-batches and prefill chunks in one flow.
  bool step_in_flight() const override { return models_[0]->stage().pp > 1; }
  Result<StepLogits> ForwardStep(const Decodes& decodes, std::span<const Chunk> chunks) override {
    StepLogits out;
    Status s = Post([&](Rank& r, int rank) -> Status {
      KIMIRT_ASSIGN_OR_RETURN(StepLogits logits, r.ForwardStep(decodes, chunks, rank == 0));
      if (rank == 0) out = std::move(logits);
      return Status::Ok();
    }, Wait::kEveryRank);
    if (!s.ok()) return s;
    return out;
  }
  // Steps in flight: every rank queues the step's launch (Model::LaunchStep); the caller waits
  // for rank 0's only — stage 0's part of the step — and collects rank 0's logits later, in a job
  // of its own (only rank 0 receives them: Model::gets_logits).
  int steps_in_flight() const override { return steps_in_flight_; }
  Status SubmitStep(const Decodes& decodes, std::span<const Chunk> chunks) override {
    if (steps_in_flight_ == 1) return ModelRunner::SubmitStep(decodes, chunks);
    auto launched = std::make_shared<StepInFlight>();
    Status s = Post([decodes, chunks = std::vector<Chunk>(chunks.begin(), chunks.end()), launched](
                        Rank& r, int rank) -> Status {
      KIMIRT_ASSIGN_OR_RETURN(StepInFlight step, r.LaunchStep(decodes, chunks, rank == 0));
      if (rank == 0) *launched = std::move(step);
      return Status::Ok();
    }, Wait::kRankZero);
    if (!s.ok()) return s;
    launched_.push_back(std::move(launched));
    return Status::Ok();
  }
  Result<StepLogits> CollectStep() override {
    if (steps_in_flight_ == 1) return ModelRunner::CollectStep();
    if (launched_.empty()) return Internal("CollectStep without a step in flight");
    std::shared_ptr<StepInFlight> step = std::move(launched_.front());
    launched_.pop_front();
    auto out = std::make_shared<StepLogits>();
    (void)Post([step, out](Rank& r, int) {
      *out = r.CollectStep(*step);
      return Status::Ok();
    }, Wait::kRankZero, /*quit=*/false, /*rank_zero_only=*/true);
    return std::move(*out);
  }
  void Release(Handle h) override {
    OnEveryRank([h](Rank& r) { r.seqs.erase(h); });
  }

  // Every rank does the same to its own shard, in the same order (lockstep).
  int kv_block_size() const override { return ranks_[0].kv->block_size(); }
  KvCacheDType kv_cache_dtype() const override { return ranks_[0].kv->dtype(); }
  std::vector<int32_t> BlockTable(Handle h) const override { return ranks_[0].seqs.at(h).blocks; }
  int32_t kv_block_refs(int32_t b) const override { return ranks_[0].kv->refs(b); }
  void RetainBlocks(std::span<const int32_t> blocks) override {
    OnEveryRank([blocks = std::vector<int32_t>(blocks.begin(), blocks.end())](Rank& r) { r.kv->Share(blocks); });
  }
  void ReleaseBlocks(std::span<const int32_t> blocks) override {
    OnEveryRank([blocks = std::vector<int32_t>(blocks.begin(), blocks.end())](Rank& r) { r.kv->FreeBlocks(blocks); });
  }
  void SharePrefix(Handle h, std::span<const int32_t> blocks, int64_t tokens) override {
    OnEveryRank([h, blocks = std::vector<int32_t>(blocks.begin(), blocks.end()), tokens](Rank& r) {
      r.SharePrefix(h, blocks, tokens);
    });
  }
  SnapshotId SnapshotKda(Handle h) override {
    const SnapshotId id = next_snapshot_++;
    OnEveryRank([h, id](Rank& r) { r.SnapshotKda(h, id); });
    return id;
  }
  void RestoreKda(Handle h, SnapshotId id) override {
    OnEveryRank([h, id](Rank& r) { r.RestoreKda(h, id); });
  }
  void DropKdaSnapshot(SnapshotId id) override {
    OnEveryRank([id](Rank& r) { r.snapshots.erase(id); });
  }
  uint64_t kda_snapshot_bytes() const override { return sizes_.snapshot_bytes; }
  int64_t kda_snapshot_capacity() const override { return sizes_.snapshots; }

 private:
  ThreadRanksRunner() = default;

  using Job = std::function<Status(Rank&, int)>;
  // What Post waits for: rank 0's run of a job, or every rank's.
  enum class Wait { kRankZero, kEveryRank };
  // One posted job, shared by the rank queues it is on.
  struct Task {
    Job job;
    bool quit = false;
    int pending = 0;  // ranks that have still to run it
    bool rank_zero_done = false;
    Status rank_zero;
  };

  // A lockstep call: every rank applies `f` to its own state, in order; the caller goes on once
  // rank 0 has (the other ranks apply it before their next job), so `f` must own what it reads.
  void OnEveryRank(std::function<void(Rank&)> f) {
    (void)Post([f = std::move(f)](Rank& r, int) {
      f(r);
      return Status::Ok();
    }, Wait::kRankZero);
  }

  // Runs `forward` on every rank (rank 0 with `argmax`); rank 0's logits.
  Result<Tensor> RankZeroLogits(const std::function<Result<Tensor>(Rank&, ArgmaxRequest*)>& forward,
                                ArgmaxRequest* argmax) {
    Tensor out;
    Status s = Post([&](Rank& r, int rank) -> Status {
      KIMIRT_ASSIGN_OR_RETURN(Tensor logits, forward(r, rank == 0 ? argmax : nullptr));
      if (rank == 0) out = std::move(logits);
      return Status::Ok();
    }, Wait::kEveryRank);
    if (!s.ok()) return s;
    return out;
  }

  // Queues `job` behind every rank's earlier ones (rank 0's only: `rank_zero_only`) and waits as
  // `wait` says; returns rank 0's status (ranks agree: same inputs, same order). A job that the
  // caller does not wait for on every rank must own what it reads.
  Status Post(Job job, Wait wait, bool quit = false, bool rank_zero_only = false) {
    auto task = std::make_shared<Task>();
    task->job = std::move(job);
    task->quit = quit;
    std::unique_lock<std::mutex> lock(mu_);
    task->pending = rank_zero_only ? 1 : world_;
    for (int r = 0; r < (rank_zero_only ? 1 : world_); ++r) queues_[static_cast<size_t>(r)].push_back(task);
    cv_.notify_all();
    cv_done_.wait(lock, [&] { return wait == Wait::kEveryRank ? task->pending == 0 : task->rank_zero_done; });
    return task->rank_zero;
  }

  // A rank thread's loop: run its queue's jobs in order, report each.
  void Serve(int rank) {
    std::deque<std::shared_ptr<Task>>& queue = queues_[static_cast<size_t>(rank)];
    for (;;) {
      std::shared_ptr<Task> task;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return !queue.empty(); });
        task = std::move(queue.front());
        queue.pop_front();
      }
      Status s = task->quit ? Status::Ok() : task->job(ranks_[static_cast<size_t>(rank)], rank);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (rank == 0) {
          task->rank_zero = std::move(s);
          task->rank_zero_done = true;
        }
        --task->pending;
        cv_done_.notify_all();
      }
      if (task->quit) return;
    }
  }

  std::vector<std::unique_ptr<Backend>> backends_;
  std::vector<std::unique_ptr<Model>> models_;
  std::vector<Rank> ranks_;
  std::vector<std::thread> threads_;
  int world_ = 0;  // ranks: tp × pp
  int steps_in_flight_ = 1;
  Handle next_ = 0;
  SnapshotId next_snapshot_ = 0;
  CacheSizes sizes_;
  std::deque<std::shared_ptr<StepInFlight>> launched_;  // rank 0's steps in flight, oldest first

  std::mutex mu_;
  std::condition_variable cv_, cv_done_;
  std::vector<std::deque<std::shared_ptr<Task>>> queues_;  // each rank's jobs, in order
};

}  // namespace

Result<Tensor> ModelRunner::ForwardDecode(std::span<const Handle>, std::span<const int32_t>, ArgmaxRequest*) {
  return Unsupported("this runner forwards each sequence alone (decode_batch_limit 1)");
}

Result<ModelRunner::StepLogits> ModelRunner::ForwardStep(const Decodes& decodes, std::span<const Chunk> chunks) {
  StepLogits out;
  if (!decodes.hs.empty()) {
    KIMIRT_ASSIGN_OR_RETURN(out.decode, ForwardDecode(decodes.hs, decodes.ids, decodes.argmax));
  }
  for (const Chunk& c : chunks) {
    KIMIRT_ASSIGN_OR_RETURN(Tensor logits, Forward(c.h, c.ids, c.last_only, c.argmax));
    out.chunks.push_back(std::move(logits));
  }
  return out;
}

Status ModelRunner::SubmitStep(const Decodes& decodes, std::span<const Chunk> chunks) {
  KIMIRT_ASSIGN_OR_RETURN(StepLogits logits, ForwardStep(decodes, chunks));
  submitted_.push_back(std::move(logits));
  return Status::Ok();
}

Result<ModelRunner::StepLogits> ModelRunner::CollectStep() {
  if (submitted_.empty()) return Internal("CollectStep without a step in flight");
  StepLogits out = std::move(submitted_.front());
  submitted_.pop_front();
  return out;
}

Result<std::vector<Tensor>> ModelRunner::ForwardChunks(std::span<const Chunk> chunks) {
  KIMIRT_ASSIGN_OR_RETURN(StepLogits step, ForwardStep(Decodes{}, chunks));
  return std::move(step.chunks);
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::ForModel(Model& model, RunnerOptions o) {
  return SingleRankRunner::Create(model, o, {});
}

Result<std::unique_ptr<ModelRunner>> ModelRunner::Create(const ModelSource& source, RunnerOptions o) {
  if (o.tp < 1) return InvalidArgument("-tp must be >= 1");
  if (o.pp < 1) return InvalidArgument("-pp must be >= 1");
  if (o.pp_micro_batches < 0) return InvalidArgument("--pp-micro-batches must be >= 0 (0: one per stage)");
  if (o.steps_in_flight < 0) return InvalidArgument("--steps-in-flight must be >= 0 (0: one per stage)");
  if (o.device == "cpu" && o.matrix_dtype != DType::kF32) {
    return Unsupported("the CPU backend computes with F32 weights (--dtype float32)");
  }
  if (o.ep != 1 && o.ep != o.tp) {
    return InvalidArgument("expert parallelism spans the TP group: ep must be 1 or -tp " + std::to_string(o.tp) +
                           ", got " + std::to_string(o.ep));
  }
  if (o.tp == 1 && o.pp == 1) {
    LoadedModel owned;
    KIMIRT_ASSIGN_OR_RETURN(owned.backend, MakeBackend(o.device));
    owned.comm = MakeSingleRankCommunicator();
    LoadOptions lo;
    lo.matrix_dtype = o.matrix_dtype;
    KIMIRT_ASSIGN_OR_RETURN(owned.model, Model::Load(source, *owned.backend, *owned.comm, lo));
    owned.model->set_decode_graphs(!o.enforce_eager);
    KIMIRT_RETURN_IF_ERROR(runner::SizeFromGpuMemory(*owned.backend, &o).status());
    Model& model = *owned.model;
    return SingleRankRunner::Create(model, o, std::move(owned));
  }
  // GPUs: one process per GPU always (each rank its own CUDA context, talking over NCCL).
  if (o.process_ranks || o.device != "cpu") return CreateProcessRanksRunner(source, o);
  return ThreadRanksRunner::Create(source, o);
}

}  // namespace kimirt
