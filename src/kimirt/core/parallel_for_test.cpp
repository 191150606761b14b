#include "kimirt/core/parallel_for.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

namespace kimirt {
namespace {

TEST(ParallelFor, RunsEveryIndexExactlyOnce) {
  for (int64_t n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    ParallelFor(n, [&](int64_t i) { hits[static_cast<size_t>(i)].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1) << i;
  }
}

TEST(ParallelFor, ConcurrentCallersAndNestedUseDoNotDeadlock) {
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        ParallelFor(16, [&](int64_t) {
          ParallelFor(3, [&](int64_t) { total.fetch_add(1); });  // the caller always helps
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  EXPECT_EQ(total.load(), 4 * 50 * 16 * 3);
}

}  // namespace
}  // namespace kimirt
