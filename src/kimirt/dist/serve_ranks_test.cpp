// Tests of PlanServeRanks: what a `kimirt serve` process is, for each way it can be started
// (docs/distributed.md "Multi-node"), from ResolveLaunchEnv's answer for real launcher variables.
#include "kimirt/dist/serve_ranks.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

namespace kimirt {
namespace {

using Vars = std::map<std::string, std::string>;

ServeRanks Plan(int world, const Vars& vars, const LaunchFlags& flags = {}) {
  Result<LaunchEnv> env = ResolveLaunchEnv(world, flags, [vars](const char* name) -> const char* {
    auto it = vars.find(name);
    return it == vars.end() ? nullptr : it->second.c_str();
  });
  EXPECT_TRUE(env.ok()) << env.status().ToString();
  return env.ok() ? PlanServeRanks(*env) : ServeRanks{ServeRole::kFollower, -7, -7};
}

TEST(ServeRanks, OneHostSpawnsEveryFollowerOnAFreePort) {
  const ServeRanks p = Plan(4, {});
  EXPECT_EQ(p.role, ServeRole::kRankZero);
  EXPECT_EQ(p.listen_port, 0);
  EXPECT_EQ(p.spawn_followers, 3);
}

TEST(ServeRanks, OneNodeOfALauncherStillTakesAFreePort) {
  // `serve -tp 2` inside a one-task Slurm allocation (salloc): this node has every rank.
  const Vars salloc = {{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}, {"SLURM_LOCALID", "0"},
                       {"SLURM_JOB_NODELIST", "gpu7"}};
  const ServeRanks p = Plan(2, salloc);
  EXPECT_EQ(p.role, ServeRole::kRankZero);
  EXPECT_EQ(p.listen_port, 0);
  EXPECT_EQ(p.spawn_followers, 1);
  LaunchFlags one;
  one.nnodes = 1;
  one.master_port = 29613;
  EXPECT_EQ(Plan(2, {}, one).listen_port, 0);
}

TEST(ServeRanks, NodeZeroByFlagsListensOnTheMasterPortAndSpawnsItsOwnNodeOnly) {
  LaunchFlags f;
  f.nnodes = 2;
  f.node_rank = 0;
  f.master_port = 29613;
  const ServeRanks p = Plan(8, {}, f);
  EXPECT_EQ(p.role, ServeRole::kRankZero);
  EXPECT_EQ(p.listen_port, 29613);
  EXPECT_EQ(p.spawn_followers, 3);  // ranks 1..3; 4..7 are node 1's
}

TEST(ServeRanks, OtherNodesByFlagsLaunchTheirRanks) {
  LaunchFlags f;
  f.nnodes = 4;
  f.node_rank = 3;
  f.master_addr = "node-a";
  EXPECT_EQ(Plan(8, {}, f).role, ServeRole::kNodeLauncher);
}

TEST(ServeRanks, TorchrunRanksFollowAndRankZeroSpawnsNobody) {
  const Vars rank0 = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_ADDR", "h"}, {"MASTER_PORT", "29777"}};
  const ServeRanks p0 = Plan(2, rank0);
  EXPECT_EQ(p0.role, ServeRole::kRankZero);
  EXPECT_EQ(p0.listen_port, 29777);
  EXPECT_EQ(p0.spawn_followers, 0);
  Vars rank1 = rank0;
  rank1["RANK"] = "1";
  rank1["LOCAL_RANK"] = "1";
  EXPECT_EQ(Plan(2, rank1).role, ServeRole::kFollower);
}

TEST(ServeRanks, SlurmOneTaskPerNodeIsANodeLauncherOneTaskPerRankIsARank) {
  // srun --ntasks-per-node=1 over 2 nodes of 4 ranks each: task 1 launches ranks 4..7.
  const Vars per_node = {{"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}, {"SLURM_LOCALID", "0"},
                         {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "gpu[1-2]"}};
  EXPECT_EQ(Plan(8, per_node).role, ServeRole::kNodeLauncher);
  Vars node0 = per_node;
  node0["SLURM_PROCID"] = "0";
  node0["SLURM_NODEID"] = "0";
  const ServeRanks p = Plan(8, node0);
  EXPECT_EQ(p.role, ServeRole::kRankZero);
  EXPECT_EQ(p.spawn_followers, 3);
  EXPECT_EQ(p.listen_port, kDefaultMasterPort);
  // One task per rank: task 5 is rank 5.
  const Vars per_rank = {{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                         {"SLURM_NODEID", "1"}, {"SLURM_NNODES", "2"}, {"SLURM_JOB_NODELIST", "gpu[1-2]"}};
  EXPECT_EQ(Plan(8, per_rank).role, ServeRole::kFollower);
}

}  // namespace
}  // namespace kimirt
