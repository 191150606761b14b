// Tests of the rendezvous store over loopback: ranks as threads with their own stores (separate
// sockets, as separate processes would have), and one rank as a forked process that dies
// mid-way. Every failure must come within the timeout, naming the rank at fault.
#include "kimirt/dist/rendezvous_store.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/core/random.h"

namespace kimirt {
namespace {

using std::chrono::milliseconds;

RendezvousOptions Opts(int port, int rank, int world, milliseconds timeout = milliseconds(20000)) {
  RendezvousOptions o;
  o.master_port = port;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

// Runs fn(rank) for ranks [0, world) on threads and returns each one's Status.
std::vector<Status> OnRanks(int world, const std::vector<int>& ranks, const std::function<Status(int)>& fn) {
  std::vector<Status> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r : ranks) threads.emplace_back([&, r] { out[r] = fn(r); });
  for (std::thread& t : threads) t.join();
  return out;
}

std::vector<int> Iota(int n) {
  std::vector<int> v;
  for (int i = 0; i < n; ++i) v.push_back(i);
  return v;
}

double Seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

void ExpectMessage(const Status& s, const std::string& needle) {
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
}

TEST(Rendezvous, RanksExchangeBlobsAndPassBarriers) {
  const int world = 4;
  const int port = *PickFreePort();
  // An NCCL unique id is 128 arbitrary bytes, zeros included.
  std::string id(128, '\0');
  SplitMix64 rng(7);
  for (char& c : id) c = static_cast<char>(rng.Next() & 0xff);
  id[5] = '\0';
  const std::string big(1 << 20, 'x');
  std::vector<std::string> got_id(world);
  std::vector<std::string> seen(world);
  std::vector<Status> st = OnRanks(world, Iota(world), [&](int r) -> Status {
    KIMIRT_ASSIGN_OR_RETURN(auto store, RendezvousStore::Join(Opts(port, r, world)));
    if (r == 0) KIMIRT_RETURN_IF_ERROR(store->Set("nccl-id", id));
    KIMIRT_ASSIGN_OR_RETURN(got_id[r], store->Get("nccl-id"));
    KIMIRT_RETURN_IF_ERROR(store->Set("from/" + std::to_string(r), "rank " + std::to_string(r)));
    KIMIRT_RETURN_IF_ERROR(store->Barrier("published"));
    for (int p = 0; p < world; ++p) {
      KIMIRT_ASSIGN_OR_RETURN(std::string v, store->Get("from/" + std::to_string(p)));
      seen[r] += v + ";";
    }
    if (r == world - 1) KIMIRT_RETURN_IF_ERROR(store->Set("big", big));
    KIMIRT_ASSIGN_OR_RETURN(std::string b, store->Get("big"));
    if (b != big) return Internal("big blob differs");
    for (int i = 0; i < 20; ++i) KIMIRT_RETURN_IF_ERROR(store->Barrier("loop"));
    return store->Barrier("end");  // rank 0's store (the server) must outlive the others' calls
  });
  for (int r = 0; r < world; ++r) {
    EXPECT_TRUE(st[r].ok()) << r << ": " << st[r].ToString();
    EXPECT_EQ(got_id[r], id) << r;
    EXPECT_EQ(seen[r], "rank 0;rank 1;rank 2;rank 3;") << r;
  }
}

TEST(Rendezvous, MissingRankFailsEveryOtherRankNamingIt) {
  const int port = *PickFreePort();
  const auto t0 = Clock::now();
  std::vector<Status> st = OnRanks(3, {0, 1}, [&](int r) {
    return RendezvousStore::Join(Opts(port, r, 3, milliseconds(1000))).status();
  });
  EXPECT_LT(Seconds(t0), 8.0);
  ExpectMessage(st[0], "rank 2 did not join");
  ExpectMessage(st[1], "rank 2 did not join");
}

TEST(Rendezvous, RankMissingABarrierIsNamed) {
  const int port = *PickFreePort();
  std::vector<Status> st = OnRanks(3, Iota(3), [&](int r) -> Status {
    KIMIRT_ASSIGN_OR_RETURN(auto store, RendezvousStore::Join(Opts(port, r, 3, milliseconds(1000))));
    if (r == 1) {
      // Rank 1 hangs (alive, connected) instead of arriving; then leaves after the others failed.
      std::this_thread::sleep_for(milliseconds(2500));
      return Status::Ok();
    }
    Status s = store->Barrier("step");
    // Keep rank 0's server up until rank 2 has its answer.
    std::this_thread::sleep_for(milliseconds(r == 0 ? 1000 : 0));
    return s;
  });
  ExpectMessage(st[0], "rank 1 did not arrive");
  ExpectMessage(st[2], "rank 1 did not arrive");
  ExpectMessage(st[2], "barrier '0:step' timed out after 1000 ms");
}

TEST(Rendezvous, UnreachableMasterIsAStartupError) {
  const int port = *PickFreePort();  // nobody listens there
  const auto t0 = Clock::now();
  Status s = RendezvousStore::Join(Opts(port, 1, 2, milliseconds(700))).status();
  EXPECT_LT(Seconds(t0), 5.0);
  ExpectMessage(s, "rank 1 could not reach the master (rank 0) at 127.0.0.1:" + std::to_string(port));
  ExpectMessage(s, "within 700 ms");
}

TEST(Rendezvous, WrongWorldSizeAndDuplicateRanksAreRefused) {
  const int port = *PickFreePort();
  std::vector<Status> st(3);
  std::thread master([&] { st[0] = RendezvousStore::Join(Opts(port, 0, 2, milliseconds(1500))).status(); });
  st[1] = RendezvousStore::Join(Opts(port, 1, 3, milliseconds(1500))).status();
  master.join();
  ExpectMessage(st[1], "rank 1 has a world of 3 ranks, but rank 0 has 2");
  ExpectMessage(st[0], "rank 1 did not join");

  const int port2 = *PickFreePort();
  std::vector<Status> dup = OnRanks(3, Iota(3), [&](int r) {
    return RendezvousStore::Join(Opts(port2, r == 2 ? 1 : r, 3, milliseconds(1500))).status();
  });
  // One of the two "rank 1" processes is refused as a duplicate; rank 2 never came.
  const bool refused = dup[1].message().find("joined twice") != std::string::npos ||
                       dup[2].message().find("joined twice") != std::string::npos;
  EXPECT_TRUE(refused) << dup[1].message() << " | " << dup[2].message();
  ExpectMessage(dup[0], "rank 2 did not join");
  ExpectMessage(RendezvousStore::Join(Opts(0, 1, 2)).status(), "master port 0");
  ExpectMessage(RendezvousStore::Join(Opts(port, 2, 2)).status(), "rank 2 is out of range [0, 1]");
}

TEST(Rendezvous, RankThatDiesMidwayIsDetectedAtOnce) {
  const int world = 3;
  const int port = *PickFreePort();
  // Rank 2 is a real process (forked before any thread of this test exists): it joins, publishes
  // a key, then dies by SIGKILL before the barrier — its socket closes without a goodbye.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = RendezvousStore::Join(Opts(port, 2, world));
    if (store.ok()) (void)(*store)->Set("rank2", "here");
    raise(SIGKILL);
    _exit(1);
  }
  const auto t0 = Clock::now();
  std::vector<std::string> got(world);
  std::vector<Status> st = OnRanks(world, {0, 1}, [&](int r) -> Status {
    // A long timeout: the death must be seen from the closed socket, not from the deadline.
    KIMIRT_ASSIGN_OR_RETURN(auto store, RendezvousStore::Join(Opts(port, r, world, milliseconds(60000))));
    KIMIRT_ASSIGN_OR_RETURN(got[r], store->Get("rank2"));
    Status s = store->Barrier("after");
    if (r == 0) std::this_thread::sleep_for(milliseconds(300));  // rank 1 gets its answer first
    return s;
  });
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  EXPECT_TRUE(WIFSIGNALED(wstatus));
  EXPECT_LT(Seconds(t0), 20.0);
  for (int r : {0, 1}) {
    EXPECT_EQ(got[r], "here");
    ExpectMessage(st[r], "rank 2 died");
    ExpectMessage(st[r], "before barrier '0:after'");
  }
}

TEST(Rendezvous, RankDyingWhileOthersJoinFailsTheJoin) {
  const int port = *PickFreePort();
  // Rank 2 (forked first, before any thread exists) says hello and waits for the others; it is
  // killed before rank 1 arrives, so the group can never be whole.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    (void)RendezvousStore::Join(Opts(port, 2, 3));
    _exit(0);
  }
  std::vector<Status> st(3);
  std::thread master([&] { st[0] = RendezvousStore::Join(Opts(port, 0, 3, milliseconds(30000))).status(); });
  std::this_thread::sleep_for(milliseconds(1500));  // rank 2 has connected and said hello
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  st[1] = RendezvousStore::Join(Opts(port, 1, 3, milliseconds(30000))).status();
  master.join();
  ExpectMessage(st[0], "rank 2 died");
  ExpectMessage(st[1], "rank 2 died");
  ExpectMessage(st[1], "joining the rendezvous");
}

TEST(Rendezvous, MasterDeathIsNamed) {
  const int port = *PickFreePort();
  // Rank 0 (the server) is a forked process that joins, then dies by SIGKILL.
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    auto store = RendezvousStore::Join(Opts(port, 0, 2));
    // Rank 1's join answer is still being sent when rank 0's own arrives: let it go out first.
    usleep(300 * 1000);
    raise(SIGKILL);
    _exit(1);
  }
  const auto t0 = Clock::now();
  Result<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Join(Opts(port, 1, 2, milliseconds(60000)));
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  const Status s = (*store)->Barrier("never");
  int wstatus = 0;
  waitpid(child, &wstatus, 0);
  EXPECT_LT(Seconds(t0), 20.0);  // from the closed socket, not the 60 s deadline
  ExpectMessage(s, "rank 1 lost the master (rank 0 at 127.0.0.1:" + std::to_string(port) + "): connection closed");
  // The store stays broken with the first error.
  EXPECT_EQ((*store)->Set("k", "v").message(), s.message());
}

}  // namespace
}  // namespace kimirt
