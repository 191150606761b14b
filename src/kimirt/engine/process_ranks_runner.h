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

#include <memory>
#include <string>

#include "kimirt/core/status.h"
#include "kimirt/engine/model_runner.h"

namespace kimirt {

Result<std::unique_ptr<ModelRunner>> CreateProcessRanksRunner(const std::string& model_dir, const RunnerOptions& options);

// The body of `kimirt rank-worker`: one follower rank, from the environment the spawner sets
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). Returns the process's exit code.
int RunProcessRankWorker();

}  // namespace kimirt
