// Tests of ResolveLaunchEnv and FirstSlurmHost: each launcher's variables as that launcher sets
// them, precedence between launchers, flags against the environment, and bad values (every error
// must name the variable or flag at fault).
#include "kimirt/dist/launch_env.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "kimirt/dist/slurm_nodelist.h"

namespace kimirt {
namespace {

using Vars = std::map<std::string, std::string>;

EnvLookup Env(const Vars& vars) {
  return [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  };
}

LaunchEnv Ok(int world, const Vars& vars, const LaunchFlags& flags = {}) {
  Result<LaunchEnv> r = ResolveLaunchEnv(world, flags, Env(vars));
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : LaunchEnv{};
}

// The error's message, which must contain every one of `needles`.
void ExpectError(int world, const Vars& vars, const LaunchFlags& flags, std::initializer_list<const char*> needles) {
  Result<LaunchEnv> r = ResolveLaunchEnv(world, flags, Env(vars));
  ASSERT_FALSE(r.ok()) << "expected an error";
  EXPECT_EQ(r.status().code(), ErrorCode::kInvalidArgument);
  for (const char* n : needles) EXPECT_NE(r.status().message().find(n), std::string::npos) << r.status().message();
}

const Vars kTorchrun = {{"RANK", "5"},        {"WORLD_SIZE", "8"},  {"LOCAL_RANK", "1"},
                        {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node-a"},
                        {"MASTER_PORT", "29400"}};

TEST(LaunchEnv, NothingSetIsOneHostSpawningEveryRank) {
  LaunchEnv e = Ok(4, {});
  EXPECT_EQ(e.source, LaunchSource::kLocal);
  EXPECT_FALSE(e.is_rank);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.first_rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 0);
}

TEST(LaunchEnv, Torchrun) {
  LaunchEnv e = Ok(8, kTorchrun);
  EXPECT_EQ(e.source, LaunchSource::kTorchrun);
  EXPECT_TRUE(e.is_rank);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.master_addr, "node-a");
  EXPECT_EQ(e.master_port, 29400);
}

TEST(LaunchEnv, FlagsWinForTheMasterAndMustAgreeOnNodes) {
  LaunchFlags f;
  f.master_addr = "10.0.0.7";
  f.master_port = 12345;
  f.nnodes = 2;
  f.node_rank = 1;
  LaunchEnv e = Ok(8, kTorchrun, f);
  EXPECT_EQ(e.master_addr, "10.0.0.7");
  EXPECT_EQ(e.master_port, 12345);
  f.node_rank = 0;
  ExpectError(8, kTorchrun, f, {"--node-rank 0", "GROUP_RANK=1"});
  f.node_rank = -1;
  f.nnodes = 4;
  ExpectError(8, kTorchrun, f, {"--nnodes 4"});
}

TEST(LaunchEnv, TorchrunBadAndMissingValues) {
  auto with = [](const char* k, const char* v) {
    Vars vars = kTorchrun;
    if (v == nullptr) {
      vars.erase(k);
    } else {
      vars[k] = v;
    }
    return vars;
  };
  ExpectError(8, with("RANK", "8"), {}, {"RANK=8", "out of range [0, 7]"});
  ExpectError(8, with("RANK", "-1"), {}, {"RANK=-1"});
  ExpectError(8, with("RANK", "two"), {}, {"RANK='two'", "not an integer"});
  ExpectError(8, with("RANK", ""), {}, {"RANK=''"});
  ExpectError(8, with("RANK", "99999999999999999999"), {}, {"RANK=", "not an integer"});
  ExpectError(8, with("RANK", nullptr), {}, {"RANK is not set"});
  ExpectError(8, with("LOCAL_RANK", nullptr), {}, {"LOCAL_RANK is not set"});
  ExpectError(8, with("LOCAL_RANK", "4"), {}, {"LOCAL_RANK=4", "[0, 3]"});
  ExpectError(8, with("WORLD_SIZE", "4"), {}, {"WORLD_SIZE=4", "asks for 8 ranks"});
  ExpectError(8, with("WORLD_SIZE", "0"), {}, {"WORLD_SIZE=0"});
  ExpectError(8, with("MASTER_ADDR", nullptr), {}, {"MASTER_ADDR is not set"});
  ExpectError(8, with("MASTER_PORT", nullptr), {}, {"MASTER_PORT is not set"});
  ExpectError(8, with("MASTER_PORT", "70000"), {}, {"MASTER_PORT=70000", "[1, 65535]"});
  // RANK alone (a stray variable) is still torchrun's, and incomplete.
  ExpectError(2, {{"RANK", "0"}}, {}, {"WORLD_SIZE is not set"});
}

const Vars kSlurm = {{"SLURM_PROCID", "9"},  {"SLURM_NTASKS", "16"}, {"SLURM_LOCALID", "1"},
                     {"SLURM_NODEID", "1"},  {"SLURM_NNODES", "2"},
                     {"SLURM_STEP_NODELIST", "gpu[007-008]"}, {"SLURM_JOB_NODELIST", "gpu[001-100]"}};

TEST(LaunchEnv, SlurmOneTaskPerRank) {
  LaunchEnv e = Ok(16, kSlurm);
  EXPECT_EQ(e.source, LaunchSource::kSlurm);
  EXPECT_TRUE(e.is_rank);
  EXPECT_EQ(e.rank, 9);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.master_addr, "gpu007");  // the step's first node, not the job's
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  Vars v = kSlurm;
  v.erase("SLURM_STEP_NODELIST");
  EXPECT_EQ(Ok(16, v).master_addr, "gpu001");
  v["MASTER_ADDR"] = "head";
  v["MASTER_PORT"] = "4000";
  EXPECT_EQ(Ok(16, v).master_addr, "head");
  EXPECT_EQ(Ok(16, v).master_port, 4000);
}

TEST(LaunchEnv, SlurmOneTaskPerNodeLaunchesItsNodesRanks) {
  Vars v = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"}, {"SLURM_NODEID", "1"},
            {"SLURM_JOB_NODELIST", "a01,b02"}};
  LaunchEnv e = Ok(16, v);
  EXPECT_FALSE(e.is_rank);
  EXPECT_EQ(e.nnodes, 2);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.first_rank, 8);
  EXPECT_EQ(e.master_addr, "a01");
  v["SLURM_LOCALID"] = "1";  // two launcher tasks on one node would share its GPUs
  ExpectError(16, v, {}, {"SLURM_NTASKS=2", "SLURM_LOCALID=1"});
  v["SLURM_LOCALID"] = "0";
  ExpectError(6, {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"}}, {}, {"SLURM_NTASKS=4"});
}

TEST(LaunchEnv, SlurmBadValues) {
  Vars v = kSlurm;
  v["SLURM_PROCID"] = "16";
  ExpectError(16, v, {}, {"SLURM_PROCID=16"});
  v = kSlurm;
  v.erase("SLURM_LOCALID");
  ExpectError(16, v, {}, {"SLURM_LOCALID is not set"});
  v = kSlurm;
  v["SLURM_STEP_NODELIST"] = "gpu[007-008";
  ExpectError(16, v, {}, {"SLURM_STEP_NODELIST", "without ']'"});
  v = kSlurm;
  v.erase("SLURM_STEP_NODELIST");
  v.erase("SLURM_JOB_NODELIST");
  ExpectError(16, v, {}, {"MASTER_ADDR is not set", "NODELIST"});
  LaunchFlags f;
  f.node_rank = 0;
  ExpectError(16, kSlurm, f, {"--node-rank 0", "SLURM_NODEID=1"});
}

TEST(LaunchEnv, OpenMpi) {
  const Vars v = {{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                  {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}, {"MASTER_ADDR", "h0"}};
  LaunchEnv e = Ok(4, v);
  EXPECT_EQ(e.source, LaunchSource::kOpenMpi);
  EXPECT_TRUE(e.is_rank);
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "h0");
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  Vars no_master = v;
  no_master.erase("MASTER_ADDR");
  ExpectError(4, no_master, {}, {"MASTER_ADDR is not set", "-x MASTER_ADDR"});
  LaunchFlags f;
  f.master_addr = "h9";
  EXPECT_EQ(Ok(4, no_master, f).master_addr, "h9");
  Vars bad = v;
  bad["OMPI_COMM_WORLD_LOCAL_RANK"] = "2";
  ExpectError(4, bad, {}, {"OMPI_COMM_WORLD_LOCAL_RANK=2", "OMPI_COMM_WORLD_LOCAL_SIZE=2"});
  bad = v;
  bad["OMPI_COMM_WORLD_SIZE"] = "x";
  ExpectError(4, bad, {}, {"OMPI_COMM_WORLD_SIZE='x'"});
}

TEST(LaunchEnv, InnermostLauncherWins) {
  // torchrun started by srun: torchrun's ranks, not Slurm's per-node task.
  Vars v = kTorchrun;
  v.insert(kSlurm.begin(), kSlurm.end());
  EXPECT_EQ(Ok(8, v).source, LaunchSource::kTorchrun);
  // mpirun inside an sbatch script.
  Vars m = {{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2"}, {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
            {"MASTER_ADDR", "h0"}, {"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"}};
  LaunchEnv e = Ok(2, m);
  EXPECT_EQ(e.source, LaunchSource::kOpenMpi);
  EXPECT_EQ(e.rank, 1);
}

TEST(LaunchEnv, ExplicitFlags) {
  LaunchFlags f;
  f.nnodes = 2;
  f.node_rank = 1;
  f.master_addr = "10.1.1.1";
  LaunchEnv e = Ok(16, {}, f);
  EXPECT_EQ(e.source, LaunchSource::kFlags);
  EXPECT_FALSE(e.is_rank);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.first_rank, 8);
  EXPECT_EQ(e.master_addr, "10.1.1.1");
  EXPECT_EQ(e.master_port, kDefaultMasterPort);
  EXPECT_EQ(Ok(16, {{"MASTER_PORT", "777"}}, f).master_port, 777);
  LaunchFlags g = f;
  g.node_rank = -1;
  ExpectError(16, {}, g, {"--node-rank is required", "--nnodes 2"});
  g = f;
  g.node_rank = 2;
  ExpectError(16, {}, g, {"--node-rank 2", "[0, 1]"});
  g = f;
  g.master_addr.clear();
  ExpectError(16, {}, g, {"MASTER_ADDR is not set", "--master-addr"});
  g.node_rank = 0;  // node 0 is the master's host: it needs no address
  EXPECT_EQ(Ok(16, {}, g).master_addr, "127.0.0.1");
  EXPECT_EQ(Ok(16, {}, g).first_rank, 0);
  g = f;
  g.nnodes = 3;
  ExpectError(16, {}, g, {"16 ranks", "--nnodes 3"});
  g = f;
  g.master_port = 0;
  ExpectError(16, {}, g, {"--master-port 0"});
  g = f;
  g.nnodes = 0;
  ExpectError(16, {}, g, {"--nnodes 0"});
  // One node with only a port: this host is the master.
  LaunchFlags p;
  p.master_port = 5000;
  e = Ok(2, {}, p);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 5000);
  EXPECT_EQ(e.local_world_size, 2);
  ExpectError(0, {}, {}, {"world size 0"});
}

TEST(SlurmNodelist, FirstHost) {
  EXPECT_EQ(*FirstSlurmHost("host[1-3,5]"), "host1");
  EXPECT_EQ(*FirstSlurmHost("host[5,1-3]"), "host5");
  EXPECT_EQ(*FirstSlurmHost("node[007-009]"), "node007");
  EXPECT_EQ(*FirstSlurmHost("a01,b02"), "a01");
  EXPECT_EQ(*FirstSlurmHost("single"), "single");
  EXPECT_EQ(*FirstSlurmHost("n[1-2]-ib,m3"), "n1-ib");
  EXPECT_EQ(*FirstSlurmHost("rack[1-2]-n[3-4]"), "rack1-n3");
  EXPECT_EQ(*FirstSlurmHost("gpu[10-11],cpu[1-9]"), "gpu10");
  for (const char* bad : {"", ",a", "host[1-3", "host1-3]", "h[]", "h[[1]]", "h[a-b]"}) {
    Result<std::string> r = FirstSlurmHost(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos);
  }
}

}  // namespace
}  // namespace kimirt
