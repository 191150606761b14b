// Tests of the communicators (communicator.h): exact llm.c-style answers (rank r contributes
// r + 1, so sums are n(n+1)/2 exactly), bitwise agreement with a rank-order reference on random
// floats, AllGather layout, a long run of mixed collectives, and failures that must end in an
// exception rather than a hang. Results are collected per rank and checked on the main thread.
#include "kimirt/parallel/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <functional>
#include <string>
#include <vector>

#include "kimirt/core/random.h"

namespace kimirt {
namespace {

constexpr int kRankCounts[] = {1, 2, 3, 4, 8};

TEST(Communicator, SingleRank) {
  std::unique_ptr<Communicator> comm = MakeSingleRankCommunicator();
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  std::vector<float> x = {1.5f, -0.0f, 3.0f};
  comm->AllReduceSum(x.data(), x.size());
  EXPECT_EQ(x, (std::vector<float>{1.5f, -0.0f, 3.0f}));
  EXPECT_TRUE(std::signbit(x[1]));
  std::vector<float> recv(3, 0.0f);
  comm->AllGather(x.data(), x.size(), recv.data());
  EXPECT_EQ(recv, x);
  comm->AllGather(recv.data(), recv.size(), recv.data());  // in place
  EXPECT_EQ(recv, x);
  comm->AllReduceSum(nullptr, 0);
  comm->AllGather(nullptr, 0, nullptr);
  comm->Barrier();
}

TEST(ThreadRanks, RankAndSize) {
  for (int n : kRankCounts) {
    std::vector<int> seen_rank(n, -1), seen_size(n, -1);
    RunOnThreadRanks(n, [&](Communicator& c) {
      seen_rank[c.rank()] = c.rank();
      seen_size[c.rank()] = c.size();
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(seen_rank[r], r);
      EXPECT_EQ(seen_size[r], n);
    }
  }
}

TEST(ThreadRanks, AllReduceExactSums) {
  for (int n : kRankCounts) {
    for (size_t len : {size_t{1}, size_t{7}, size_t{4096}}) {
      std::vector<std::vector<float>> out(n);
      RunOnThreadRanks(n, [&](Communicator& c) {
        std::vector<float> x(len, static_cast<float>(c.rank() + 1));
        c.AllReduceSum(x.data(), x.size());
        out[c.rank()] = x;
      });
      const float want = static_cast<float>(n * (n + 1) / 2);
      for (int r = 0; r < n; ++r) {
        EXPECT_EQ(out[r], std::vector<float>(len, want)) << "n=" << n << " len=" << len;
      }
    }
  }
}

// Random floats spanning many binades, so that summation order changes the rounding: every rank
// must hold exactly the bits of ((x0 + x1) + x2) + ... .
TEST(ThreadRanks, AllReduceBitwiseRankOrder) {
  constexpr size_t kLen = 2000;
  for (int n : kRankCounts) {
    std::vector<std::vector<float>> in(n, std::vector<float>(kLen));
    SplitMix64 rng(1000 + n);
    for (auto& x : in) {
      for (float& e : x) {
        const int binade = static_cast<int>(rng.Next() % 41) - 20;
        e = static_cast<float>(std::ldexp(rng.Normal(), binade));
      }
    }
    std::vector<float> ref = in[0];
    for (int r = 1; r < n; ++r) {
      for (size_t i = 0; i < kLen; ++i) ref[i] += in[r][i];
    }
    if (n >= 3) {
      // The test can tell orders apart: summing in reverse rank order gives other bits somewhere.
      size_t differ = 0;
      for (size_t i = 0; i < kLen; ++i) {
        float rev = in[n - 1][i];
        for (int r = n - 2; r >= 0; --r) rev += in[r][i];
        differ += std::bit_cast<uint32_t>(rev) != std::bit_cast<uint32_t>(ref[i]);
      }
      EXPECT_GT(differ, 0u) << "n=" << n;
    }
    std::vector<std::vector<float>> out(n);
    RunOnThreadRanks(n, [&](Communicator& c) {
      std::vector<float> x = in[c.rank()];
      c.AllReduceSum(x.data(), x.size());
      out[c.rank()] = x;
    });
    for (int r = 0; r < n; ++r) {
      size_t mismatches = 0;
      for (size_t i = 0; i < kLen; ++i) {
        mismatches += std::bit_cast<uint32_t>(out[r][i]) != std::bit_cast<uint32_t>(ref[i]);
      }
      EXPECT_EQ(mismatches, 0u) << "n=" << n << " rank " << r;
    }
  }
}

TEST(ThreadRanks, AllGatherLayout) {
  constexpr size_t kLen = 5;
  for (int n : kRankCounts) {
    std::vector<float> want(n * kLen);
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < kLen; ++i) want[r * kLen + i] = static_cast<float>(100 * r + i);
    }
    std::vector<std::vector<float>> out(n), out_in_place(n);
    RunOnThreadRanks(n, [&](Communicator& c) {
      const int r = c.rank();
      std::vector<float> send(kLen);
      for (size_t i = 0; i < kLen; ++i) send[i] = static_cast<float>(100 * r + i);
      std::vector<float> recv(n * kLen, -1.0f);
      c.AllGather(send.data(), kLen, recv.data());
      out[r] = recv;
      // In place: this rank's contribution already sits in its own slot of recv.
      std::vector<float> buf(n * kLen, -1.0f);
      std::copy(send.begin(), send.end(), buf.begin() + r * kLen);
      c.AllGather(buf.data() + r * kLen, kLen, buf.data());
      out_in_place[r] = buf;
    });
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(out[r], want) << "n=" << n << " rank " << r;
      EXPECT_EQ(out_in_place[r], want) << "n=" << n << " rank " << r;
    }
  }
}

// 1000 back-to-back collectives of varying sizes (0 and 1 included) on one group: the group is
// reusable, no deadlock, and every answer is exact. The sizes and ops follow a fixed sequence so
// every rank calls the same ones. Runs in ~0.1 s per group size; the time is recorded, not
// asserted, so a loaded CI machine cannot make it flaky.
TEST(ThreadRanks, ThousandMixedCollectives) {
  constexpr int kCollectives = 1000;
  constexpr size_t kSizes[] = {0, 1, 2, 3, 17, 64, 0, 1, 255, 1024};
  for (int n : {2, 3, 8}) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<int> bad(n, 0);
    RunOnThreadRanks(n, [&](Communicator& c) {
      const int r = c.rank();
      std::vector<float> x, recv;
      for (int k = 0; k < kCollectives; ++k) {
        const size_t len = kSizes[k % std::size(kSizes)];
        switch (k % 3) {
          case 0: {  // rank r sends r + 1 + k: the sum is n(n+1)/2 + n·k
            x.assign(len, static_cast<float>(r + 1 + k));
            c.AllReduceSum(x.data(), len);
            const float want = static_cast<float>(n * (n + 1) / 2 + n * k);
            for (float e : x) bad[r] += e != want;
            break;
          }
          case 1: {
            x.assign(len, static_cast<float>(r * 1000 + k));
            recv.assign(len * n, -1.0f);
            c.AllGather(x.data(), len, recv.data());
            for (int q = 0; q < n; ++q) {
              for (size_t i = 0; i < len; ++i) bad[r] += recv[q * len + i] != q * 1000 + k;
            }
            break;
          }
          default:
            c.Barrier();
        }
      }
    });
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (int r = 0; r < n; ++r) EXPECT_EQ(bad[r], 0) << "n=" << n << " rank " << r;
    ::testing::Test::RecordProperty("seconds_n" + std::to_string(n), std::to_string(secs));
  }
}

// A rank that throws: its peers, blocked in a collective, give up, and RunOnThreadRanks rethrows
// the original exception (not the peers' echoes).
TEST(ThreadRanks, RankExceptionPropagates) {
  try {
    RunOnThreadRanks(4, [](Communicator& c) {
      if (c.rank() == 2) throw std::runtime_error("boom on rank 2");
      float x = 1.0f;
      c.AllReduceSum(&x, 1);
      c.Barrier();
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on rank 2");
  }
}

// A rank that returns while its peers wait (e.g. after a failed gtest ASSERT in fn) is a
// mismatch of collective counts: an exception, not a hang.
TEST(ThreadRanks, EarlyReturnThrowsInsteadOfDeadlock) {
  EXPECT_THROW(RunOnThreadRanks(3,
                                [](Communicator& c) {
                                  if (c.rank() == 1) return;
                                  c.Barrier();
                                }),
               std::logic_error);
}

TEST(ThreadRanks, MismatchedCollectivesThrow) {
  // Different sizes.
  EXPECT_THROW(RunOnThreadRanks(2,
                                [](Communicator& c) {
                                  std::vector<float> x(4 + c.rank());
                                  c.AllReduceSum(x.data(), x.size());
                                }),
               std::logic_error);
  // Different ops.
  EXPECT_THROW(RunOnThreadRanks(3,
                                [](Communicator& c) {
                                  float x = 0.0f, recv[3];
                                  if (c.rank() == 0) {
                                    c.Barrier();
                                  } else {
                                    c.AllGather(&x, 1, recv);
                                  }
                                }),
               std::logic_error);
}

// A tp × pp grid: world rank = stage · tp + tp rank; each rank's TP group is its stage's ranks,
// its pipeline group the ranks of its tp rank, and the groups' collectives stay apart (each
// stage's all-reduce sums its own members only).
TEST(ThreadGrid, GroupsAreStagesAndPipelinesNumberedStageMajor) {
  for (auto [tp, pp] : {std::pair{2, 2}, std::pair{1, 3}, std::pair{3, 2}, std::pair{2, 1}}) {
    const int n = tp * pp;
    std::vector<int> tp_rank(n, -1), tp_size(n, -1), pp_rank(n, -1), pp_size(n, -1);
    std::vector<float> stage_sum(n, 0), pipe_sum(n, 0);
    std::atomic<int> next{0};
    std::vector<int> world_of_thread(n, -1);
    RunOnThreadGrid(tp, pp, [&](Communicator& t, Communicator& p) {
      const int w = p.rank() * tp + t.rank();  // what the numbering promises
      tp_rank[w] = t.rank();
      tp_size[w] = t.size();
      pp_rank[w] = p.rank();
      pp_size[w] = p.size();
      float x = static_cast<float>(w + 1);
      t.AllReduceSum(&x, 1);
      stage_sum[w] = x;
      float y = static_cast<float>(w + 1);
      p.AllReduceSum(&y, 1);
      pipe_sum[w] = y;
      world_of_thread[next++] = w;
    });
    std::vector<int> seen = world_of_thread;
    std::sort(seen.begin(), seen.end());
    for (int w = 0; w < n; ++w) {
      EXPECT_EQ(seen[w], w) << "each world rank once";
      EXPECT_EQ(tp_rank[w], w % tp);
      EXPECT_EQ(tp_size[w], tp);
      EXPECT_EQ(pp_rank[w], w / tp);
      EXPECT_EQ(pp_size[w], pp);
      const int s = w / tp, k = w % tp;
      float want_stage = 0, want_pipe = 0;
      for (int j = 0; j < tp; ++j) want_stage += static_cast<float>(s * tp + j + 1);
      for (int j = 0; j < pp; ++j) want_pipe += static_cast<float>(j * tp + k + 1);
      EXPECT_EQ(stage_sum[w], want_stage) << "tp " << tp << " pp " << pp << " rank " << w;
      EXPECT_EQ(pipe_sum[w], want_pipe) << "tp " << tp << " pp " << pp << " rank " << w;
    }
  }
}

// Point to point round a pipeline ring (stage s to s+1, the last back to 0), several messages
// in flight per pair: each arrives whole, in the order sent, bit for bit.
TEST(ThreadGrid, SendRecvRoundTheRingInOrder) {
  for (auto [tp, pp] : {std::pair{1, 2}, std::pair{1, 3}, std::pair{2, 3}}) {
    const int n = tp * pp;
    std::vector<std::vector<float>> got(n);
    RunOnThreadGrid(tp, pp, [&](Communicator& t, Communicator& p) {
      const int w = p.rank() * tp + t.rank();
      const int next = (p.rank() + 1) % pp, prev = (p.rank() + pp - 1) % pp;
      for (int m = 0; m < 3; ++m) {  // three messages before any is received
        std::vector<float> msg(5 + m);
        for (size_t i = 0; i < msg.size(); ++i) msg[i] = static_cast<float>(w * 100 + m * 10) + 0.1f * i;
        p.Send(msg.data(), msg.size(), next);
      }
      for (int m = 0; m < 3; ++m) {
        std::vector<float> in(5 + m, -1.0f);
        p.Recv(in.data(), in.size(), prev);
        got[w].insert(got[w].end(), in.begin(), in.end());
      }
    });
    for (int w = 0; w < n; ++w) {
      const int s = w / tp, k = w % tp, from = ((s + pp - 1) % pp) * tp + k;
      std::vector<float> want;
      for (int m = 0; m < 3; ++m) {
        for (int i = 0; i < 5 + m; ++i) want.push_back(static_cast<float>(from * 100 + m * 10) + 0.1f * i);
      }
      EXPECT_EQ(got[w], want) << "tp " << tp << " pp " << pp << " rank " << w;
    }
  }
}

// The message of the std::logic_error RunOnThreadGrid(tp, pp, body) throws; a test failure
// (and "") if it returns.
std::string GridLogicError(int tp, int pp, const std::function<void(Communicator&, Communicator&)>& body) {
  try {
    RunOnThreadGrid(tp, pp, body);
  } catch (const std::logic_error& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

TEST(ThreadGrid, PointToPointMisuseThrowsInsteadOfHanging) {
  // A size other than the one sent.
  std::string what = GridLogicError(1, 2, [](Communicator&, Communicator& p) {
    std::vector<float> x(4, 1.0f);
    if (p.rank() == 0) p.Send(x.data(), 4, 1);
    if (p.rank() == 1) p.Recv(x.data(), 3, 0);
  });
  EXPECT_NE(what.find("receives 3 floats from rank 0, which sent 4"), std::string::npos) << what;
  // A sender that returns without sending.
  what = GridLogicError(1, 2, [](Communicator&, Communicator& p) {
    float x = 0;
    if (p.rank() == 1) p.Recv(&x, 1, 0);
  });
  EXPECT_NE(what.find("rank 0 returned while rank 1 waits in Recv"), std::string::npos) << what;
  // Stages waiting on each other (each Recv before its Send): a deadlock, named, not a hang.
  what = GridLogicError(1, 3, [](Communicator&, Communicator& p) {
    float x = 0;
    p.Recv(&x, 1, (p.rank() + 2) % 3);
    p.Send(&x, 1, (p.rank() + 1) % 3);
  });
  EXPECT_NE(what.find("thread ranks deadlocked"), std::string::npos) << what;
  EXPECT_NE(what.find("in Recv from rank"), std::string::npos) << what;
  // A peer that is not there, or oneself.
  EXPECT_THROW(RunOnThreadGrid(1, 2, [](Communicator&, Communicator& p) {
                 float x = 0;
                 p.Send(&x, 1, p.rank());
               }),
               std::logic_error);
  EXPECT_THROW(MakeSingleRankCommunicator()->Send(nullptr, 0, 1), std::logic_error);
  // A failing rank ends the waits of its stage's TP peer in a collective and of stage 0 in Recv
  // (across groups: the failure ends every group), and is the error reported.
  try {
    RunOnThreadGrid(2, 2, [](Communicator& t, Communicator& p) {
      if (p.rank() == 1 && t.rank() == 1) throw std::runtime_error("boom on stage 1");
      float x = 0;
      if (p.rank() == 1) t.Barrier();
      if (p.rank() == 0) p.Recv(&x, 1, 1);
    });
    FAIL() << "expected an exception";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "boom on stage 1");
  }
}

}  // namespace
}  // namespace kimirt
