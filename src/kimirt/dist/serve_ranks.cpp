#include "kimirt/dist/serve_ranks.h"

namespace kimirt {

ServeRanks PlanServeRanks(const LaunchEnv& env) {
  ServeRanks out;
  if (env.is_rank) {
    // One process per rank: the launcher starts every rank, so rank 0 spawns none.
    out.role = env.rank == 0 ? ServeRole::kRankZero : ServeRole::kFollower;
  } else {
    // This process launches its node's ranks first_rank ..; node 0's first is rank 0, this
    // process itself, which starts the rest of its node.
    out.role = env.first_rank == 0 ? ServeRole::kRankZero : ServeRole::kNodeLauncher;
    if (out.role == ServeRole::kRankZero) out.spawn_followers = env.local_world_size - 1;
  }
  // When this node launches every rank (one host: no launcher, --nnodes 1, or a Slurm / OpenMPI
  // allocation of one node), only its own children connect: any free port, so two servers on one
  // host never clash. Otherwise the master port the other nodes were told.
  if (out.role == ServeRole::kRankZero) {
    const bool alone = !env.is_rank && env.local_world_size == env.world_size;
    out.listen_port = alone ? 0 : env.master_port;
  }
  return out;
}

}  // namespace kimirt
