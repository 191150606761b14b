#include "kimirt/dist/launch_env.h"

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <optional>

#include "kimirt/dist/slurm_nodelist.h"

namespace kimirt {
namespace {

// An optional integer variable in [lo, hi]: nullopt when unset (or when the launcher has no such
// variable: name == nullptr); an error naming it when set to anything else.
Result<std::optional<int>> EnvInt(const EnvLookup& env, const char* name, int lo, int hi) {
  const char* v = name == nullptr ? nullptr : env(name);
  if (v == nullptr) return std::optional<int>();
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  if (*v == '\0' || *end != '\0' || errno == ERANGE) {
    return InvalidArgument(std::string(name) + "='" + v + "' is not an integer");
  }
  if (x < lo || x > hi) {
    return InvalidArgument(std::string(name) + "=" + v + " is out of range [" + std::to_string(lo) +
                           ", " + std::to_string(hi) + "]");
  }
  return std::optional<int>(static_cast<int>(x));
}

// The same, required: `why` says which launcher needs it.
Result<int> RequiredEnvInt(const EnvLookup& env, const char* name, int lo, int hi, const char* why) {
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> v, EnvInt(env, name, lo, hi));
  if (!v) return InvalidArgument(std::string(name) + " is not set (" + why + ")");
  return *v;
}

// A flag, when given, must agree with what the launcher says.
Status Agree(const char* flag, int flag_value, const char* var, int env_value) {
  if (flag_value < 0 || env_value < 0 || flag_value == env_value) return Status::Ok();
  return InvalidArgument(std::string(flag) + " " + std::to_string(flag_value) + " conflicts with " + var + "=" +
                         std::to_string(env_value));
}

Status CheckWorld(const char* var, int launcher_world, int world_size) {
  if (launcher_world == world_size) return Status::Ok();
  return InvalidArgument(std::string(var) + "=" + std::to_string(launcher_world) + " but the command line asks for " +
                         std::to_string(world_size) + " ranks (tp × pp)");
}

// Master address and port: flag, else MASTER_ADDR / MASTER_PORT, else `fallback_addr` (empty:
// required, `hint` says how to set it) and torchrun's default port (or an error if !port_default).
Status ResolveMaster(const LaunchFlags& flags, const EnvLookup& env, const std::string& fallback_addr,
                     bool port_default, const std::string& hint, LaunchEnv* out) {
  if (!flags.master_addr.empty()) {
    out->master_addr = flags.master_addr;
  } else if (const char* a = env("MASTER_ADDR"); a != nullptr && *a != '\0') {
    out->master_addr = a;
  } else if (!fallback_addr.empty()) {
    out->master_addr = fallback_addr;
  } else {
    return InvalidArgument("MASTER_ADDR is not set and --master-addr is not given (" + hint + ")");
  }
  if (flags.master_port > 0) {
    out->master_port = flags.master_port;
    return Status::Ok();
  }
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> port, EnvInt(env, "MASTER_PORT", 1, 65535));
  if (!port && !port_default) {
    return InvalidArgument("MASTER_PORT is not set and --master-port is not given (" + hint + ")");
  }
  out->master_port = port ? *port : kDefaultMasterPort;
  return Status::Ok();
}

Status CheckFlags(const LaunchFlags& f) {
  if (f.nnodes == 0 || f.nnodes < -1) return InvalidArgument("--nnodes " + std::to_string(f.nnodes) + " must be >= 1");
  if (f.node_rank < -1) return InvalidArgument("--node-rank " + std::to_string(f.node_rank) + " must be >= 0");
  if (f.master_port == 0 || f.master_port < -1 || f.master_port > 65535) {
    return InvalidArgument("--master-port " + std::to_string(f.master_port) + " is out of range [1, 65535]");
  }
  return Status::Ok();
}

// Node-launcher mode: `nnodes` nodes share world_size ranks evenly; this is node `node_rank`.
Status SplitOverNodes(int world_size, int nnodes, int node_rank, const char* nnodes_name, const char* node_name,
                      LaunchEnv* out) {
  if (world_size % nnodes != 0) {
    return InvalidArgument(std::to_string(world_size) + " ranks (tp × pp) do not split evenly over " +
                           nnodes_name + " " + std::to_string(nnodes));
  }
  if (node_rank >= nnodes) {
    return InvalidArgument(std::string(node_name) + " " + std::to_string(node_rank) + " is out of range [0, " +
                           std::to_string(nnodes - 1) + "] (" + nnodes_name + " " + std::to_string(nnodes) + ")");
  }
  out->is_rank = false;
  out->nnodes = nnodes;
  out->node_rank = node_rank;
  out->local_world_size = world_size / nnodes;
  out->first_rank = node_rank * out->local_world_size;
  return Status::Ok();
}

Result<LaunchEnv> FromTorchrun(int world_size, const LaunchFlags& flags, const EnvLookup& env) {
  LaunchEnv e;
  e.source = LaunchSource::kTorchrun;
  const char* why = "torchrun sets it; RANK or WORLD_SIZE is set";
  KIMIRT_ASSIGN_OR_RETURN(int world, RequiredEnvInt(env, "WORLD_SIZE", 1, INT_MAX, why));
  KIMIRT_RETURN_IF_ERROR(CheckWorld("WORLD_SIZE", world, world_size));
  KIMIRT_ASSIGN_OR_RETURN(e.rank, RequiredEnvInt(env, "RANK", 0, world - 1, why));
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> local_world, EnvInt(env, "LOCAL_WORLD_SIZE", 1, world));
  KIMIRT_ASSIGN_OR_RETURN(e.local_rank, RequiredEnvInt(env, "LOCAL_RANK", 0, local_world.value_or(world) - 1, why));
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> group, EnvInt(env, "GROUP_RANK", 0, world - 1));
  e.is_rank = true;
  e.world_size = world;
  e.local_world_size = local_world.value_or(-1);
  e.nnodes = local_world && world % *local_world == 0 ? world / *local_world : -1;
  e.node_rank = group.value_or(-1);
  KIMIRT_RETURN_IF_ERROR(Agree("--nnodes", flags.nnodes, "WORLD_SIZE/LOCAL_WORLD_SIZE", e.nnodes));
  KIMIRT_RETURN_IF_ERROR(Agree("--node-rank", flags.node_rank, "GROUP_RANK", e.node_rank));
  KIMIRT_RETURN_IF_ERROR(ResolveMaster(flags, env, "", false, "torchrun sets both", &e));
  return e;
}

// Slurm and OpenMPI: a task is one rank, or (one task per node, fewer tasks than ranks) one
// node's launcher.
struct TaskVars {
  LaunchSource source;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;  // nullptr: the launcher has none
  const char* node_rank;
  const char* nnodes;
};

Result<LaunchEnv> FromTasks(const TaskVars& v, int world_size, const LaunchFlags& flags, const EnvLookup& env,
                            const std::string& fallback_addr, const std::string& hint) {
  LaunchEnv e;
  e.source = v.source;
  const std::string why = std::string(LaunchSourceName(v.source)) + " sets it; " + v.rank + " is set";
  KIMIRT_ASSIGN_OR_RETURN(int tasks, RequiredEnvInt(env, v.size, 1, INT_MAX, why.c_str()));
  KIMIRT_ASSIGN_OR_RETURN(int task, RequiredEnvInt(env, v.rank, 0, tasks - 1, why.c_str()));
  KIMIRT_ASSIGN_OR_RETURN(int local, RequiredEnvInt(env, v.local_rank, 0, tasks - 1, why.c_str()));
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> local_size, EnvInt(env, v.local_size, 1, tasks));
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> node_rank, EnvInt(env, v.node_rank, 0, tasks - 1));
  KIMIRT_ASSIGN_OR_RETURN(std::optional<int> nnodes, EnvInt(env, v.nnodes, 1, tasks));
  if (local_size && local >= *local_size) {
    return InvalidArgument(std::string(v.local_rank) + "=" + std::to_string(local) + " is out of range [0, " +
                           std::to_string(*local_size - 1) + "] (" + v.local_size + "=" + std::to_string(*local_size) +
                           ")");
  }
  if (tasks == world_size) {
    e.is_rank = true;
    e.world_size = world_size;
    e.rank = task;
    e.local_rank = local;
    e.local_world_size = local_size.value_or(-1);
    e.node_rank = node_rank.value_or(-1);
    e.nnodes = nnodes.value_or(-1);
    KIMIRT_RETURN_IF_ERROR(Agree("--nnodes", flags.nnodes, v.nnodes ? v.nnodes : v.size, e.nnodes));
    KIMIRT_RETURN_IF_ERROR(Agree("--node-rank", flags.node_rank, v.node_rank ? v.node_rank : v.rank, e.node_rank));
  } else {
    // One launcher task per node: its local id must be 0, or two tasks on one host would spawn
    // ranks on the same GPUs.
    if (tasks > world_size || world_size % tasks != 0 || local != 0) {
      return InvalidArgument(std::string(v.size) + "=" + std::to_string(tasks) + " but the command line asks for " +
                             std::to_string(world_size) + " ranks (tp × pp): start one task per rank, or one task " +
                             "per node (" + v.local_rank + "=" + std::to_string(local) + ")");
    }
    KIMIRT_RETURN_IF_ERROR(Agree("--nnodes", flags.nnodes, v.size, tasks));
    KIMIRT_RETURN_IF_ERROR(Agree("--node-rank", flags.node_rank, v.rank, task));
    KIMIRT_RETURN_IF_ERROR(SplitOverNodes(world_size, tasks, task, v.size, v.rank, &e));
    e.world_size = world_size;
  }
  KIMIRT_RETURN_IF_ERROR(ResolveMaster(flags, env, fallback_addr, true, hint, &e));
  return e;
}

Result<LaunchEnv> FromSlurm(int world_size, const LaunchFlags& flags, const EnvLookup& env) {
  // rank 0 runs on the first node of the step (srun's block distribution).
  std::string first;
  for (const char* list : {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST"}) {
    const char* v = env(list);
    if (v == nullptr || *v == '\0') continue;
    Result<std::string> host = FirstSlurmHost(v);
    if (!host.ok()) return host.status().WithContext(list);
    first = *host;
    break;
  }
  const TaskVars vars{LaunchSource::kSlurm, "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", nullptr,
                      "SLURM_NODEID", "SLURM_NNODES"};
  return FromTasks(vars, world_size, flags, env, first,
                   "neither SLURM_STEP_NODELIST nor SLURM_JOB_NODELIST names a host");
}

Result<LaunchEnv> FromOpenMpi(int world_size, const LaunchFlags& flags, const EnvLookup& env) {
  const TaskVars vars{LaunchSource::kOpenMpi, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                      "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", nullptr, nullptr};
  return FromTasks(vars, world_size, flags, env, "",
                   "mpirun does not name a master: pass -x MASTER_ADDR=<host of rank 0> or --master-addr");
}

}  // namespace

const char* LaunchSourceName(LaunchSource source) {
  switch (source) {
    case LaunchSource::kLocal:
      return "local";
    case LaunchSource::kFlags:
      return "flags";
    case LaunchSource::kTorchrun:
      return "torchrun";
    case LaunchSource::kSlurm:
      return "Slurm";
    case LaunchSource::kOpenMpi:
      return "OpenMPI";
  }
  return "?";
}

EnvLookup ProcessEnv() {
  return [](const char* name) -> const char* { return std::getenv(name); };
}

Result<LaunchEnv> ResolveLaunchEnv(int world_size, const LaunchFlags& flags, const EnvLookup& env) {
  if (world_size < 1) return InvalidArgument("world size " + std::to_string(world_size) + " must be >= 1");
  KIMIRT_RETURN_IF_ERROR(CheckFlags(flags));
  if (env("RANK") != nullptr || env("WORLD_SIZE") != nullptr) return FromTorchrun(world_size, flags, env);
  if (env("OMPI_COMM_WORLD_RANK") != nullptr) return FromOpenMpi(world_size, flags, env);
  if (env("SLURM_PROCID") != nullptr) return FromSlurm(world_size, flags, env);
  LaunchEnv e;
  e.world_size = world_size;
  const bool any_flag = flags.nnodes > 0 || flags.node_rank >= 0 || !flags.master_addr.empty() || flags.master_port > 0;
  if (!any_flag) {
    e.local_world_size = world_size;
    return e;  // kLocal: one host, a free port
  }
  e.source = LaunchSource::kFlags;
  const int nnodes = flags.nnodes > 0 ? flags.nnodes : 1;
  if (nnodes > 1 && flags.node_rank < 0) {
    return InvalidArgument("--node-rank is required with --nnodes " + std::to_string(nnodes));
  }
  KIMIRT_RETURN_IF_ERROR(
      SplitOverNodes(world_size, nnodes, flags.node_rank < 0 ? 0 : flags.node_rank, "--nnodes", "--node-rank", &e));
  // Node 0 is the master's own host: its ranks reach rank 0 there without being told its name.
  const bool on_master_host = nnodes == 1 || flags.node_rank <= 0;
  KIMIRT_RETURN_IF_ERROR(ResolveMaster(flags, env, on_master_host ? "127.0.0.1" : "", true,
                                       "every node but node 0 must name the host of node 0", &e));
  return e;
}

}  // namespace kimirt
