// The launch environment: how this process takes part in a run of `world_size` ranks (one
// process per GPU; docs/distributed.md), read from the launcher that started it:
//   torchrun   RANK, WORLD_SIZE, LOCAL_RANK [, LOCAL_WORLD_SIZE, GROUP_RANK], MASTER_ADDR, MASTER_PORT
//   Slurm      SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID [, SLURM_NODEID, SLURM_NNODES]; the master
//              is MASTER_ADDR or the first host of SLURM_STEP_NODELIST / SLURM_JOB_NODELIST
//   OpenMPI    OMPI_COMM_WORLD_RANK, OMPI_COMM_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_RANK
//              [, OMPI_COMM_WORLD_LOCAL_SIZE]; the master is MASTER_ADDR (mpirun -x MASTER_ADDR)
//   flags      --nnodes, --node-rank, --master-addr, --master-port (torchrun's spelling)
// or none of them: one host, this process spawns every rank (rank_spawner.h).
//
// Precedence: torchrun's variables, then OpenMPI's, then Slurm's — a launcher started inside
// another's allocation (torchrun under srun, mpirun in an sbatch script) sets its own variables
// on top of the outer one's, so the innermost wins. Flags win over the environment for the master
// address and port, and must agree with it on node counts: a conflict is an error naming both.
//
// A launcher task is either one rank (task count = world size) or one node's launcher (Slurm or
// OpenMPI with one task per node and fewer tasks than ranks, e.g. `srun --ntasks-per-node=1`):
// then it spawns world_size / tasks local ranks, as `--nnodes/--node-rank` does.
#pragma once

#include <functional>
#include <string>

#include "kimirt/core/status.h"

namespace kimirt {

enum class LaunchSource { kLocal, kFlags, kTorchrun, kSlurm, kOpenMpi };
const char* LaunchSourceName(LaunchSource source);

// torchrun's default rendezvous port, used when neither a flag nor MASTER_PORT names one.
inline constexpr int kDefaultMasterPort = 29500;

// Explicit flags; a negative number or an empty string means "not given".
struct LaunchFlags {
  int nnodes = -1;
  int node_rank = -1;
  std::string master_addr;
  int master_port = -1;
};

struct LaunchEnv {
  LaunchSource source = LaunchSource::kLocal;
  int world_size = 1;        // ranks in the run (tp × pp)
  int nnodes = 1;            // -1 when the launcher does not say (torchrun without LOCAL_WORLD_SIZE)
  int node_rank = 0;         // -1 when the launcher does not say
  int local_world_size = 1;  // ranks on this node; -1 when the launcher does not say
  // true: the launcher started this process as rank `rank`, on local device `local_rank`.
  // false: this process launches its node's ranks first_rank .. first_rank + local_world_size - 1
  // (local ranks 0 .. local_world_size - 1) and supervises them.
  bool is_rank = false;
  int rank = -1;
  int local_rank = -1;
  int first_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0 (kLocal only): the spawner picks a free port
};

// Looks up an environment variable; nullptr when unset.
using EnvLookup = std::function<const char*(const char*)>;
EnvLookup ProcessEnv();  // std::getenv

// world_size: the ranks the command line asks for (tp × pp), >= 1. Errors name the variable or
// flag and its value: not an integer, out of range, missing where the launcher needs it,
// disagreeing with world_size or with a flag.
Result<LaunchEnv> ResolveLaunchEnv(int world_size, const LaunchFlags& flags, const EnvLookup& env);

}  // namespace kimirt
