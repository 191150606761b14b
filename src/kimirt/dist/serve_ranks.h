// What one `kimirt serve` process is in a run of process ranks (docs/distributed.md
// "Multi-node"), from its resolved launch environment (launch_env.h). Issue 15: "Rank 0 serves
// HTTP and schedules; the others follow its step plan."
//   rank zero      serves HTTP; its followers connect to `listen_port` (0: a free port, one host
//                  only); it spawns the followers of its own node, ranks 1 .. spawn_followers.
//   follower       the launcher started this process as one rank > 0 (torchrun, srun or mpirun
//                  with one task per rank): it becomes that rank's follower, connecting to rank 0.
//   node launcher  a node other than node 0 (--nnodes/--node-rank, or one Slurm / OpenMPI task per
//                  node): serves no HTTP, spawns and supervises its node's ranks as followers.
#pragma once

#include "kimirt/dist/launch_env.h"

namespace kimirt {

enum class ServeRole { kRankZero, kFollower, kNodeLauncher };

struct ServeRanks {
  ServeRole role = ServeRole::kRankZero;
  int listen_port = 0;      // kRankZero
  int spawn_followers = 0;  // kRankZero: ranks 1 .. spawn_followers are this node's, started here
};

ServeRanks PlanServeRanks(const LaunchEnv& env);

}  // namespace kimirt
