// ProcessRanksRunner: tensor-parallel ranks as processes (issue 15 item 1, CPU first;
// docs/distributed.md "Process ranks"). Rank 0 lives in the calling process and answers the
// ModelRunner calls; ranks 1..tp-1 are children started and supervised by dist's rank spawner
// (`<binary> rank-worker` with the torchrun-style environment). Every call that changes or runs
// the model is sent to each follower as a small command frame, in call order, on the same TCP
// link the collectives use (parallel/tcp_communicator.h); each follower applies it to its own
// shard, so all ranks stay in lockstep exactly as the thread ranks do, and the logits are bit for
// bit the thread ranks' (same rank-ordered sums).
//
// Failure: a follower that dies or fails makes rank 0's next Forward / Reserve (and health())
// return an error naming the rank, never a hang: every read has a deadline and a dead process's
// socket closes at once. The runner stays failed; the surviving followers are stopped.
#pragma once

#include <atomic>
#include <memory>
#include <string>

#include "kimirt/core/status.h"
#include "kimirt/dist/launch_env.h"
#include "kimirt/engine/model_runner.h"

namespace kimirt {

// Loads `source` on options.tp process ranks; each follower is sent the source (a directory, or a
// config and seed: it makes its own random slices) with the options.
Result<std::unique_ptr<ModelRunner>> CreateProcessRanksRunner(const ModelSource& source, const RunnerOptions& options);

// One follower rank: connects to rank 0 at master_addr:master_port (retrying until
// connect_timeout_ms), then loads its shard and follows rank 0's commands until told to quit.
// local_rank (its CUDA device; -1: not given) matters on GPUs only. Returns the process's exit code.
struct FollowerStart {
  int rank = -1;
  int world_size = -1;
  int local_rank = -1;
  std::string master_addr;
  int master_port = -1;
  int connect_timeout_ms = 60000;
};
int RunProcessRankWorker(const FollowerStart& start);

// The body of `kimirt rank-worker`: the follower the spawner's environment describes (RANK,
// WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT; KIMIRT_RANK_CONNECT_TIMEOUT_MS, default 60 s).
int RunProcessRankWorker();

// A node other than rank 0's (docs/distributed.md "Multi-node"): spawns and supervises this
// node's ranks env.first_rank .. as `rank-worker` followers connecting to env's master; an error
// names the rank that failed (the others are stopped). OK when they all quit as rank 0 told them,
// or *stop became true.
Status RunFollowerNode(const LaunchEnv& env, int connect_timeout_ms, const std::atomic<bool>* stop);

}  // namespace kimirt
