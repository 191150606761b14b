// The cache-budget helpers GPU ranks share (runner_rank.h): every rank of a group gets the
// smallest budget, to the MiB below; host memory is never sized from a GPU.
#include "kimirt/engine/runner_rank.h"

#include <gtest/gtest.h>

#include <vector>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {
namespace {

TEST(RunnerRank, MinOverRanksGivesEveryRankTheSmallestBudgetInWholeMiB) {
  // Rank 2 has the least, and not a whole MiB of it: every rank gets its whole MiB.
  const std::vector<uint64_t> bytes = {uint64_t{80} << 30, (uint64_t{81} << 30) + 7, (uint64_t{79} << 30) + 12345,
                                       uint64_t{80} << 30};
  std::vector<uint64_t> got(bytes.size());
  RunOnThreadRanks(4, [&](Communicator& comm) {
    auto be = MakeCpuBackend();
    const size_t r = static_cast<size_t>(comm.rank());
    got[r] = runner::MinOverRanks(comm, *be, bytes[r]);
  });
  for (uint64_t g : got) EXPECT_EQ(g, uint64_t{79} << 30);
}

TEST(RunnerRank, HostMemoryIsNotSizedFromAGpu) {
  auto be = MakeCpuBackend();
  RunnerOptions o;
  o.gpu_memory_utilization = 0.9;
  o.kv_cache_bytes = 12345;
  auto sized = runner::SizeFromGpuMemory(*be, &o);
  ASSERT_TRUE(sized.ok());
  EXPECT_FALSE(*sized);
  EXPECT_EQ(o.kv_cache_bytes, 12345u);
}

}  // namespace
}  // namespace kimirt
