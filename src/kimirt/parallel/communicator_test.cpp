// Tests of the communicators (communicator.h): exact llm.c-style answers (rank r contributes
// r + 1, so sums are n(n+1)/2 exactly), bitwise agreement with a rank-order reference on random
// floats, AllGather layout, a long run of mixed collectives, and failures that must end in an
// exception rather than a hang. Results are collected per rank and checked on the main thread.
#include "kimirt/parallel/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <iterator>
#include <memory>
#include <stdexcept>
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

}  // namespace
}  // namespace kimirt
