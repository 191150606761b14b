// Tests of SpawnAndSupervise with /bin/sh children: the rank environment each child sees, and the
// failure paths — a rank exiting non-zero, a rank killed by a signal, a rank ignoring SIGTERM, a
// missing binary, a requested stop — each ending promptly with the other ranks gone.
#include "kimirt/dist/rank_spawner.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "kimirt/dist/tcp_socket.h"

namespace kimirt {
namespace {

namespace fs = std::filesystem;

class RankSpawner : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("kimirt-spawn-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  SpawnOptions Sh(const std::string& script, int ranks) {
    SpawnOptions o;
    o.argv = {"/bin/sh", "-c", script};
    o.local_ranks = ranks;
    o.world_size = ranks;
    o.extra_env = {{"OUT", dir_.string()}};
    return o;
  }

  std::string Read(const std::string& name) {
    std::ifstream f(dir_ / name);
    std::stringstream s;
    s << f.rdbuf();
    return s.str();
  }

  // Every pid the children wrote to $OUT/pid.<rank> is gone (reaped, not running).
  void ExpectGone(int ranks) {
    for (int r = 0; r < ranks; ++r) {
      const std::string pid = Read("pid." + std::to_string(r));
      ASSERT_FALSE(pid.empty()) << "rank " << r << " wrote no pid";
      errno = 0;
      EXPECT_NE(kill(std::stoi(pid), 0), 0) << "rank " << r << " still runs";
      EXPECT_EQ(errno, ESRCH);
    }
  }

  fs::path dir_;
};

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

TEST_F(RankSpawner, EachRankGetsItsEnvironment) {
  setenv("NCCL_NVLS_ENABLE", "1", 1);  // the supervisor's own setting must not reach the ranks
  setenv("RANK", "77", 1);             // nor an outer launcher's
  SpawnOptions o = Sh(
      "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT "
      "$NCCL_NVLS_ENABLE\" > \"$OUT/env.$LOCAL_RANK\"",
      3);
  o.first_rank = 3;
  o.world_size = 6;
  o.node_rank = 1;
  o.master_addr = "10.2.3.4";
  o.master_port = 4321;
  Status s = SpawnAndSupervise(o);
  unsetenv("NCCL_NVLS_ENABLE");
  unsetenv("RANK");
  ASSERT_TRUE(s.ok()) << s.ToString();
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(Read("env." + std::to_string(i)),
              std::to_string(3 + i) + " 6 " + std::to_string(i) + " 3 1 10.2.3.4 4321 0\n");
  }
}

// Process ranks: the caller is local rank 0 itself (rank 0 serves in-process), so its children
// are local ranks 1..n-1 of a host of n, and rank r's device index (its LOCAL_RANK) is r.
TEST_F(RankSpawner, ChildrenAfterTheCallersOwnLocalRankCountFromIt) {
  SpawnOptions o = Sh("echo \"$RANK $LOCAL_RANK $LOCAL_WORLD_SIZE\" > \"$OUT/env.$RANK\"", 3);
  o.first_rank = 1;
  o.first_local_rank = 1;
  o.world_size = 4;
  ASSERT_TRUE(SpawnAndSupervise(o).ok());
  for (int r = 1; r <= 3; ++r) EXPECT_EQ(Read("env." + std::to_string(r)), std::to_string(r) + " " + std::to_string(r) + " 4\n");
}

TEST_F(RankSpawner, PicksAFreeMasterPortForOneHost) {
  ASSERT_TRUE(SpawnAndSupervise(Sh("echo $MASTER_PORT > \"$OUT/port.$LOCAL_RANK\"", 2)).ok());
  const std::string p0 = Read("port.0");
  EXPECT_EQ(p0, Read("port.1"));
  EXPECT_GT(std::stoi(p0), 0);
}

TEST_F(RankSpawner, FailingRankStopsTheOthersAndIsNamed) {
  const auto t0 = Clock::now();
  Status s = SpawnAndSupervise(Sh(
      "echo $$ > \"$OUT/pid.$RANK\"; if [ $RANK = 2 ]; then sleep 0.3; exit 3; fi; exec sleep 60", 4));
  EXPECT_LT(Seconds(t0), 10.0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 2 (local rank 2, pid "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("exited with status 3"), std::string::npos) << s.message();
  ExpectGone(4);
}

TEST_F(RankSpawner, KilledRankIsNamedWithItsSignal) {
  Status s = SpawnAndSupervise(
      Sh("echo $$ > \"$OUT/pid.$RANK\"; if [ $RANK = 0 ]; then sleep 0.3; kill -9 $$; fi; exec sleep 60", 2));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 0 "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("killed by signal 9"), std::string::npos) << s.message();
  ExpectGone(2);
}

TEST_F(RankSpawner, RankIgnoringSigtermIsKilledAfterTheGrace) {
  SpawnOptions o = Sh(
      "echo $$ > \"$OUT/pid.$RANK\"; if [ $RANK = 1 ]; then sleep 0.3; exit 1; fi; trap '' TERM; exec sleep 60", 2);
  o.grace = std::chrono::milliseconds(500);
  const auto t0 = Clock::now();
  Status s = SpawnAndSupervise(o);
  EXPECT_LT(Seconds(t0), 10.0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("exited with status 1"), std::string::npos) << s.message();
  ExpectGone(2);
}

// A server's ranks run until told to end: with `exit_expected` still false, a rank that exits 0
// has failed, is named, and the others are stopped; once it is set, exits 0 are the normal end.
TEST_F(RankSpawner, RankExitingZeroBeforeItIsExpectedIsAFailure) {
  std::atomic<bool> expected{false};
  SpawnOptions o = Sh("echo $$ > \"$OUT/pid.$RANK\"; if [ $RANK = 1 ]; then sleep 0.3; exit 0; fi; exec sleep 60", 3);
  o.exit_expected = &expected;
  const auto t0 = Clock::now();
  Status s = SpawnAndSupervise(o);
  EXPECT_LT(Seconds(t0), 10.0);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("rank 1 (local rank 1, pid "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("exited with status 0 before the group was told to stop"), std::string::npos)
      << s.message();
  ExpectGone(3);

  expected = true;
  EXPECT_TRUE(SpawnAndSupervise(Sh("sleep 0.2", 3)).ok());  // no flag: exits 0 are the end
  SpawnOptions done = Sh("sleep 0.2", 2);
  done.exit_expected = &expected;
  EXPECT_TRUE(SpawnAndSupervise(done).ok());
}

TEST_F(RankSpawner, MissingBinaryIsAStartError) {
  SpawnOptions o = Sh("", 2);
  o.argv = {(dir_ / "no-such-kimirt").string()};
  Status s = SpawnAndSupervise(o);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("cannot start rank 0"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("No such file"), std::string::npos) << s.message();
}

TEST_F(RankSpawner, StopRequestEndsEveryRank) {
  std::atomic<bool> stop{false};
  SpawnOptions o = Sh("echo $$ > \"$OUT/pid.$RANK\"; exec sleep 60", 3);
  o.stop = &stop;
  std::thread t([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
    stop = true;
  });
  const auto t0 = Clock::now();
  Status s = SpawnAndSupervise(o);
  t.join();
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_LT(Seconds(t0), 10.0);
  ExpectGone(3);
}

TEST_F(RankSpawner, BadOptions) {
  SpawnOptions o = Sh("true", 2);
  o.world_size = 1;
  EXPECT_NE(SpawnAndSupervise(o).message().find("do not fit a world of 1"), std::string::npos);
  o.argv.clear();
  EXPECT_NE(SpawnAndSupervise(o).message().find("empty command line"), std::string::npos);
}

}  // namespace
}  // namespace kimirt
