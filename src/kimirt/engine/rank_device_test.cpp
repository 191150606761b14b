// Which GPU a rank takes (rank_device.h), with the visible GPU count given: its LOCAL_RANK, and
// a clear error naming the rank, the device index and the count when it is not there. And the
// runner's CUDA path when the ranks cannot run: an error at once, before any process starts.
#include "kimirt/engine/rank_device.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdlib>
#include <chrono>
#include <string>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

TEST(RankDevice, IsTheLocalRank) {
  EXPECT_EQ(*RankCudaDevice(1, "1", 2), 1);
  EXPECT_EQ(*RankCudaDevice(5, "0", 1), 0);  // rank 5 of a multi-node run, first GPU of its host
  EXPECT_EQ(*RankCudaDevice(3, "3", 8), 3);
}

TEST(RankDevice, AMissingGpuNamesTheRankTheDeviceAndTheCount) {
  unsetenv("CUDA_VISIBLE_DEVICES");
  Result<int> d = RankCudaDevice(2, "2", 2);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(),
            "rank 2 needs CUDA device 2 (its local rank), but 2 GPUs are visible: -tp N on one host takes N GPUs");
  setenv("CUDA_VISIBLE_DEVICES", "3", 1);
  d = RankCudaDevice(1, "1", 1);
  unsetenv("CUDA_VISIBLE_DEVICES");
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().message(), "rank 1 needs CUDA device 1 (its local rank), but 1 GPU is visible "
                                  "(CUDA_VISIBLE_DEVICES=3): -tp N on one host takes N GPUs");
  EXPECT_NE(RankCudaDevice(1, "1", 0).status().message().find("but 0 GPUs are visible"), std::string::npos);
}

// KIMIRT_RANKS_SHARE_GPU=1: every rank on device 0 where one GPU is visible; none visible is
// still an error, and a bad LOCAL_RANK still named.
TEST(RankDevice, SharingOneGpuPutsEveryRankOnDeviceZero) {
  const char* was = std::getenv("KIMIRT_RANKS_SHARE_GPU");
  const std::string saved = was != nullptr ? was : "";
  setenv("KIMIRT_RANKS_SHARE_GPU", "1", 1);
  EXPECT_TRUE(RanksShareGpu());
  EXPECT_EQ(*RankCudaDevice(1, "1", 1), 0);
  EXPECT_EQ(*RankCudaDevice(3, "3", 2), 0);
  EXPECT_TRUE(CheckGpusForRanks(4, 1).ok());
  EXPECT_FALSE(CheckGpusForRanks(2, 0).ok());
  EXPECT_NE(RankCudaDevice(1, "1", 0).status().message().find("but 0 GPUs are visible"), std::string::npos);
  EXPECT_EQ(RankCudaDevice(1, "x1", 1).status().message(), "rank 1: LOCAL_RANK is \"x1\", not a device index");
  setenv("KIMIRT_RANKS_SHARE_GPU", "0", 1);
  EXPECT_FALSE(RanksShareGpu());
  EXPECT_FALSE(RankCudaDevice(1, "1", 1).ok());
  EXPECT_FALSE(CheckGpusForRanks(2, 1).ok());
  was != nullptr ? setenv("KIMIRT_RANKS_SHARE_GPU", saved.c_str(), 1) : unsetenv("KIMIRT_RANKS_SHARE_GPU");
}

TEST(RankDevice, ABadLocalRankIsNamed) {
  EXPECT_EQ(RankCudaDevice(1, nullptr, 2).status().message(), "rank 1: LOCAL_RANK is not set");
  EXPECT_EQ(RankCudaDevice(1, "x1", 2).status().message(), "rank 1: LOCAL_RANK is \"x1\", not a device index");
  EXPECT_FALSE(RankCudaDevice(1, "", 2).ok());
  EXPECT_FALSE(RankCudaDevice(1, "-1", 2).ok());
  EXPECT_FALSE(RankCudaDevice(1, "1 ", 2).ok());
}

TEST(RankDevice, AHostNeedsAGpuPerRankAndTheFirstWithoutOneIsNamed) {
  unsetenv("CUDA_VISIBLE_DEVICES");
  EXPECT_TRUE(CheckGpusForRanks(2, 2).ok());
  EXPECT_TRUE(CheckGpusForRanks(2, 8).ok());
  Status s = CheckGpusForRanks(4, 2);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.message(), "rank 2 needs CUDA device 2 (its local rank), but 2 GPUs are visible: -tp N on one host takes N GPUs");
  EXPECT_NE(CheckGpusForRanks(2, 0).message().find("rank 0 needs CUDA device 0"), std::string::npos);
}

// GPU ranks that cannot run fail at once, before a follower starts (nothing waits): in a build
// without CUDA, saying so; in a CUDA build, more ranks than visible GPUs, naming the first rank
// without one, its device index and the count.
TEST(RankDevice, CudaRanksThatCannotRunAreAnErrorAtOnce) {
  KIMIRT_REQUIRE_FILE(testing::TestDataPath("fixtures/tiny-a/config.json"));
  unsetenv("CUDA_VISIBLE_DEVICES");
  const int visible = VisibleCudaDevices();
  RunnerOptions o;
  o.device = "cuda";
  o.tp = std::max(2, visible + 1);
  o.num_kv_blocks = 8;
  o.block_size = 8;
  o.rank_worker_binary = "/nonexistent/kimirt";  // would fail otherwise if a follower started
  const auto t0 = std::chrono::steady_clock::now();
  auto r = ModelRunner::Create(testing::TestDataPath("fixtures/tiny-a"), o);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  ASSERT_FALSE(r.ok());
  const std::string want =
      !CudaBackendBuilt() ? "built without the CUDA backend"
                          : "rank " + std::to_string(visible) + " needs CUDA device " + std::to_string(visible) +
                                " (its local rank), but " + std::to_string(visible) + " GPU";
  EXPECT_NE(r.status().message().find(want), std::string::npos) << r.status().message();
}

}  // namespace
}  // namespace kimirt
