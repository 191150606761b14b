// Spawning and supervising one process per local rank: `kimirt serve -tp N` on one host (or one
// node's share of a multi-node run: launch_env.h's node-launcher mode) starts its ranks as child
// processes of the same binary, each with the torchrun-style environment a launcher would give it
// (so a rank cannot tell who started it: launch_env.h reads it back):
//   RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (the node), MASTER_ADDR, MASTER_PORT,
//   NCCL_NVLS_ENABLE=0 (NVLink multicast stays off in every process we start: issue 15 item 5).
// CUDA_VISIBLE_DEVICES is passed through untouched; a rank's device index is its LOCAL_RANK.
//
// Supervision: if any rank exits non-zero or is killed (or exits at all before `exit_expected`),
// the others get SIGTERM, then SIGKILL after `grace`, and the call returns an error naming the
// rank and its exit status or signal. Each
// child also gets SIGKILL if the supervisor itself dies (PR_SET_PDEATHSIG), so ranks never
// outlive it.
#pragma once

#include <atomic>
#include <chrono>
#include <string>
#include <utility>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

struct SpawnOptions {
  std::vector<std::string> argv;  // the rank's command line; argv[0] is looked up in PATH
  int local_ranks = 1;            // children to start
  int first_rank = 0;             // global rank of the first child
  // Local rank of the first child: 0 when this process only supervises; 1 when it is local rank
  // 0 itself and starts the others (process ranks: rank 0 serves in the calling process, so the
  // child of rank 1 takes GPU 1). LOCAL_WORLD_SIZE counts the caller then too.
  int first_local_rank = 0;
  int world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free port on this host (one host only)
  std::vector<std::pair<std::string, std::string>> extra_env;  // set last: win over the above
  std::chrono::milliseconds grace{5000};                        // SIGTERM, then SIGKILL
  // When set (e.g. by the supervisor's SIGINT/SIGTERM handler), the ranks are stopped the same
  // way and the call returns OK.
  const std::atomic<bool>* stop = nullptr;
  // For ranks that run until they are told to end (a server's followers exit 0 only on rank 0's
  // quit): while this is set and false, a rank exiting with status 0 has failed too ("before the
  // group was told to stop"). The caller sets it true just before telling the ranks to end.
  const std::atomic<bool>* exit_expected = nullptr;
};

// The environment of local rank `local_rank`: `base` (NAME=value strings, e.g. environ) with the
// rank variables above replacing any inherited ones.
std::vector<std::string> RankEnvironment(const SpawnOptions& o, int local_rank, const std::vector<std::string>& base);

// Starts the ranks and returns when all have exited 0 (OK), when one failed (an error naming it;
// the others are stopped first), or when *stop became true (OK, all stopped).
Status SpawnAndSupervise(SpawnOptions options);

}  // namespace kimirt
