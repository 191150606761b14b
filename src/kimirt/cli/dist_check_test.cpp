// `kimirt dist-check` in real processes, as a cluster user starts it (docs/distributed.md): one
// host spawning its ranks, two processes started by torchrun-style variables (the multi-node path
// on one host), a rank failing, a rank never started, a wrong WORLD_SIZE — each ending with the
// exit code and a message naming the rank or variable at fault, well within the deadline.
#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "kimirt/dist/tcp_socket.h"
#include "kimirt/testing/run_command.h"

namespace kimirt {
namespace {

using kimirt::testing::CommandResult;

CommandResult Kimirt(const std::string& args) {
  return kimirt::testing::RunCommand(std::string(KIMIRT_BINARY) + " " + args + " 2>&1");
}

// The torchrun-style environment of rank `rank` of `world` on this host.
std::string RankEnv(int rank, int world, int port) {
  return "RANK=" + std::to_string(rank) + " WORLD_SIZE=" + std::to_string(world) +
         " LOCAL_RANK=" + std::to_string(rank) + " MASTER_ADDR=127.0.0.1 MASTER_PORT=" + std::to_string(port) + " ";
}

void ExpectIn(const CommandResult& r, const std::string& needle) {
  EXPECT_NE(r.output.find(needle), std::string::npos) << "missing \"" << needle << "\" in:\n" << r.output;
}

TEST(DistCheck, OneHostSpawnsAndSupervisesItsRanks) {
  CommandResult r = Kimirt("dist-check -tp 3");
  EXPECT_EQ(r.exit_code, 0) << r.output;
  ExpectIn(r, "starts ranks 0..2 of 3");
  ExpectIn(r, "rank 2: ");
  ExpectIn(r, "local rank 2 (torchrun)");  // the spawned ranks read the torchrun-style variables
  ExpectIn(r, "3 ranks ok");
}

TEST(DistCheck, FailingRankEndsTheGroupNamingIt) {
  const auto t0 = std::chrono::steady_clock::now();
  CommandResult r = Kimirt("dist-check -tp 3 --fail-rank 1 --timeout-s 60");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 30.0);
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ExpectIn(r, "rank 1 (local rank 1, pid ");
  ExpectIn(r, "exited with status 3");
}

TEST(DistCheck, TwoProcessesStartedByEnvironmentVariables) {
  const int port = *PickFreePort();
  const std::string bin = std::string(KIMIRT_BINARY) + " dist-check -tp 2";
  CommandResult r = kimirt::testing::RunCommand(
      RankEnv(1, 2, port) + bin + " > /dev/null 2>&1 & " + RankEnv(0, 2, port) + bin +
      " 2>&1; r0=$?; wait $!; echo \"exits $r0 $?\"");
  ExpectIn(r, "exits 0 0");
  ExpectIn(r, "2 ranks ok");
}

TEST(DistCheck, TwoNodeLaunchersByFlags) {
  // The multi-node spelling on one host: each "node" spawns its two ranks of four.
  const int port = *PickFreePort();
  const std::string node = std::string(KIMIRT_BINARY) + " dist-check -tp 4 --nnodes 2 --master-addr 127.0.0.1 " +
                           "--master-port " + std::to_string(port) + " --node-rank ";
  CommandResult r = kimirt::testing::RunCommand(node + "1 > /dev/null 2>&1 & " + node +
                                                "0 2>&1; r0=$?; wait $!; echo \"exits $r0 $?\"");
  ExpectIn(r, "node 0 of 2 (flags) starts ranks 0..1 of 4");
  ExpectIn(r, "rank 3: ");
  ExpectIn(r, "local rank 1 (torchrun)");
  ExpectIn(r, "4 ranks ok");
  ExpectIn(r, "exits 0 0");
}

TEST(DistCheck, RankNeverStartedIsNamed) {
  const int port = *PickFreePort();
  CommandResult r = kimirt::testing::RunCommand(RankEnv(0, 2, port) + KIMIRT_BINARY +
                                                " dist-check -tp 2 --timeout-s 1 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ExpectIn(r, "rank 1 did not join");
}

TEST(DistCheck, WrongWorldSizeAndUnreachableMasterAreStartupErrors) {
  const int port = *PickFreePort();
  CommandResult r = kimirt::testing::RunCommand(RankEnv(0, 3, port) + KIMIRT_BINARY + " dist-check -tp 2 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ExpectIn(r, "WORLD_SIZE=3 but the command line asks for 2 ranks");
  r = kimirt::testing::RunCommand(RankEnv(1, 2, port) + KIMIRT_BINARY + " dist-check -tp 2 --timeout-s 1 2>&1");
  EXPECT_EQ(r.exit_code, 1) << r.output;
  ExpectIn(r, "rank 1 could not reach the master (rank 0) at 127.0.0.1:" + std::to_string(port));
}

}  // namespace
}  // namespace kimirt
