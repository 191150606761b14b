// TcpCommunicator (tcp_communicator.h) with its ranks on threads over socket pairs (the same
// framing a process rank's TCP link carries): sums bit-identical to the rank-ordered sum the
// thread communicator computes, all-gather layout (in place too), and misuse or a closed peer
// ending in an error naming the ranks instead of a hang.
#include "kimirt/parallel/tcp_communicator.h"

#include <gtest/gtest.h>
#include <sys/socket.h>

#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace kimirt {
namespace {

// `n` ranks' links: rank 0 holds a socket pair end for each follower.
std::vector<StarLinks> Star(int n) {
  std::vector<StarLinks> links(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    links[r].rank = r;
    links[r].size = n;
    links[r].peers.resize(r == 0 ? static_cast<size_t>(n) : 1);
    links[r].timeout = std::chrono::milliseconds(3000);
  }
  for (int r = 1; r < n; ++r) {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    links[0].peers[static_cast<size_t>(r)] = Socket(fds[0]);
    links[r].peers[0] = Socket(fds[1]);
  }
  return links;
}

// Runs fn(comm) on one thread per rank; returns each rank's exception text ("" if none). A rank
// closes its links when fn ends, as a process's exit would.
std::vector<std::string> RunRanks(std::vector<StarLinks>& links, const std::function<void(Communicator&)>& fn) {
  std::vector<std::string> errors(links.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < links.size(); ++r) {
    threads.emplace_back([&, r] {
      auto comm = MakeTcpCommunicator(links[r]);
      try {
        fn(*comm);
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
      links[r].peers.clear();
    });
  }
  for (std::thread& t : threads) t.join();
  return errors;
}

// Values whose float sum depends on the order of addition.
float Value(int rank, size_t i) { return (rank % 2 ? 1e8f : 1.0f) * (0.3f + static_cast<float>(i * 7 + rank * 13) * 1e-3f) * (rank == 2 ? -1.0f : 1.0f); }

TEST(TcpCommunicator, AllReduceIsTheRankOrderedSumOnEveryRankBitForBit) {
  const int n = 4;
  const size_t len = 1000;
  std::vector<float> want(len);
  for (size_t i = 0; i < len; ++i) {
    float s = Value(0, i);
    for (int r = 1; r < n; ++r) s += Value(r, i);
    want[i] = s;
  }
  std::vector<std::vector<float>> got(n);
  auto links = Star(n);
  auto errors = RunRanks(links, [&](Communicator& c) {
    std::vector<float> x(len);
    for (size_t i = 0; i < len; ++i) x[i] = Value(c.rank(), i);
    c.AllReduceSum(x.data(), len);
    c.Barrier();
    got[static_cast<size_t>(c.rank())] = x;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    ASSERT_EQ(got[r].size(), len);
    EXPECT_EQ(std::memcmp(got[r].data(), want.data(), len * sizeof(float)), 0) << "rank " << r;
  }
}

TEST(TcpCommunicator, AllGatherPutsRankRInSlotRAlsoInPlace) {
  const int n = 3;
  const size_t len = 5;
  auto links = Star(n);
  std::vector<std::vector<float>> got(n), in_place(n);
  auto errors = RunRanks(links, [&](Communicator& c) {
    std::vector<float> send(len), recv(len * n, -1.0f);
    for (size_t i = 0; i < len; ++i) send[i] = Value(c.rank(), i);
    c.AllGather(send.data(), len, recv.data());
    got[static_cast<size_t>(c.rank())] = recv;
    std::vector<float> buf(len * n, -1.0f);
    std::memcpy(buf.data() + c.rank() * len, send.data(), len * sizeof(float));
    c.AllGather(buf.data() + c.rank() * len, len, buf.data());
    in_place[static_cast<size_t>(c.rank())] = buf;
  });
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(errors[r], "");
    for (int s = 0; s < n; ++s) {
      for (size_t i = 0; i < len; ++i) {
        EXPECT_EQ(got[r][s * len + i], Value(s, i));
        EXPECT_EQ(in_place[r][s * len + i], Value(s, i));
      }
    }
  }
}

TEST(TcpCommunicator, DifferentCollectivesAreAnErrorNamingBothRanks) {
  auto links = Star(2);
  auto errors = RunRanks(links, [&](Communicator& c) {
    std::vector<float> x(8, 1.0f);
    c.AllReduceSum(x.data(), c.rank() == 0 ? 8 : 4);
  });
  EXPECT_NE(errors[0].find("rank 0 called AllReduceSum(n=8), rank 1 called AllReduceSum(n=4)"), std::string::npos)
      << errors[0];
  EXPECT_NE(errors[1].find("rank 0"), std::string::npos) << errors[1];  // its link closed: rank 0 failed
}

TEST(TcpCommunicator, APeerThatLeavesEndsTheCollectiveAtOnceNamingIt) {
  auto links = Star(3);
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = RunRanks(links, [&](Communicator& c) {
    if (c.rank() == 2) return;  // leaves without its collective (as if its process died)
    float x = 1.0f;
    c.AllReduceSum(&x, 1);
  });
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  EXPECT_NE(errors[0].find("with rank 2: rank 2 failed or died"), std::string::npos) << errors[0];
}

// Point to point: rank 0 with a follower on the star; every pair on a mesh (a pipeline group's
// links), messages in the order sent; a follower-to-follower Send on the star and a size other
// than the one sent are errors naming the ranks.
TEST(TcpCommunicator, SendRecvOnTheStarAndOnAMesh) {
  auto star = Star(3);
  std::vector<float> got0(2, -1), got2(3, -1);
  std::string no_link;
  auto errors = RunRanks(star, [&](Communicator& c) {
    const float a[2] = {1.5f, -2.0f}, b[3] = {3, 4, 5};
    if (c.rank() == 1) {
      c.Send(a, 2, 0);
      try {
        c.Send(b, 3, 2);
      } catch (const CommunicatorError& e) {
        no_link = e.what();
      }
    }
    if (c.rank() == 0) {
      c.Recv(got0.data(), 2, 1);
      c.Send(b, 3, 2);
    }
    if (c.rank() == 2) c.Recv(got2.data(), 3, 0);
  });
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(got0, (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(got2, (std::vector<float>{3, 4, 5}));
  EXPECT_NE(no_link.find("process rank 1 of 3: Send: no link to rank 2"), std::string::npos) << no_link;

  // A mesh of three: round the ring twice, each rank sending both messages first.
  std::vector<StarLinks> mesh(3);
  for (int r = 0; r < 3; ++r) {
    mesh[r].rank = r;
    mesh[r].size = 3;
    mesh[r].peers.resize(3);
    mesh[r].timeout = std::chrono::milliseconds(3000);
  }
  for (int i = 0; i < 3; ++i) {
    for (int j = i + 1; j < 3; ++j) {
      int fds[2];
      ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
      mesh[i].peers[static_cast<size_t>(j)] = Socket(fds[0]);
      mesh[j].peers[static_cast<size_t>(i)] = Socket(fds[1]);
    }
  }
  std::vector<std::vector<float>> ring(3);
  errors = RunRanks(mesh, [&](Communicator& c) {
    for (int m = 0; m < 2; ++m) {
      const float x[2] = {Value(c.rank(), static_cast<size_t>(m)), static_cast<float>(m)};
      c.Send(x, 2, (c.rank() + 1) % 3);
    }
    for (int m = 0; m < 2; ++m) {
      float y[2];
      c.Recv(y, 2, (c.rank() + 2) % 3);
      ring[static_cast<size_t>(c.rank())].insert(ring[static_cast<size_t>(c.rank())].end(), y, y + 2);
    }
    float z = 0;
    if (c.rank() == 1) c.Send(&z, 1, 2);
    if (c.rank() == 2) c.Recv(&z, 2, 1);  // two floats expected, one sent
  });
  for (int r = 0; r < 3; ++r) {
    const int from = (r + 2) % 3;
    EXPECT_EQ(ring[r], (std::vector<float>{Value(from, 0), 0, Value(from, 1), 1})) << "rank " << r;
  }
  EXPECT_NE(errors[2].find("receives 2 floats from rank 1, which sent Send/Recv(n=1)"), std::string::npos)
      << errors[2];
}

}  // namespace
}  // namespace kimirt
