// TMA boxes land in shared memory exactly where our wgmma descriptors look (tma.h, wgmma.cuh):
// a BF16 matrix shaped like a layer's latent rows (576 columns, rows 1,152 bytes apart), boxes of
// 64 or 16 rows × 64 columns at any first row, each element at SwizzledOffset(row, chunk) of its
// panel; rows past the matrix zeros. A box that landed unswizzled, shifted or short fails.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kimirt/backend/cuda/tma.h"

namespace kimirt {
namespace {

constexpr uint64_t kRows = 200, kCols = 576;

// The byte offset of (row, 16-byte chunk) in a 128-byte-swizzled panel (wgmma.cuh's
// SwizzledOffset, restated: chunk c of row r at chunk c ^ (r mod 8)).
uint32_t Swizzled(uint32_t row, uint32_t chunk) { return row * 128u + ((chunk ^ (row & 7u)) << 4); }

class TmaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    src_.resize(kRows * kCols);
    for (uint64_t i = 0; i < src_.size(); ++i) src_[i] = static_cast<uint16_t>(0x1000 + i * 7919u % 0xe000u);
    ASSERT_EQ(cudaMalloc(&dev_, src_.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(dev_, src_.data(), src_.size() * 2, cudaMemcpyHostToDevice), cudaSuccess);
  }
  void TearDown() override { cudaFree(dev_); }

  // Loads `panels` boxes of box_rows at row y and checks every element of every panel.
  void Check(int32_t y, uint32_t box_rows, int panels) {
    SCOPED_TRACE("row " + std::to_string(y) + ", boxes of " + std::to_string(box_rows) + " rows");
    CUtensorMap map;
    std::string error;
    ASSERT_TRUE(cuda::MakeTensorMapBf16Swizzled(&map, dev_, kRows, kCols, kCols * 2, box_rows, &error)) << error;
    const size_t n = static_cast<size_t>(panels) * box_rows * 64;
    uint16_t* out = nullptr;
    ASSERT_EQ(cudaMalloc(&out, n * 2), cudaSuccess);
    ASSERT_EQ(cudaMemset(out, 0xff, n * 2), cudaSuccess);  // a word the copy never writes fails below
    cuda::TmaLoadPanelsForTest(map, y, panels, box_rows, out, nullptr);
    std::vector<uint16_t> got(n);
    ASSERT_EQ(cudaMemcpy(got.data(), out, n * 2, cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(out);
    for (int p = 0; p < panels; ++p) {
      for (uint32_t r = 0; r < box_rows; ++r) {
        for (uint32_t chunk = 0; chunk < 8; ++chunk) {
          for (uint32_t e = 0; e < 8; ++e) {
            const uint64_t row = static_cast<uint64_t>(y) + r, col = 64u * p + 8 * chunk + e;
            const uint16_t want = row < kRows ? src_[row * kCols + col] : 0;
            const size_t at = static_cast<size_t>(p) * box_rows * 64 + Swizzled(r, chunk) / 2 + e;
            ASSERT_EQ(got[at], want) << "panel " << p << " row " << r << " column " << 8 * chunk + e;
          }
        }
      }
    }
  }

  std::vector<uint16_t> src_;
  void* dev_ = nullptr;
};

// A 64-position tile of all nine panels (latent 512 + rope 64) from an odd first row.
TEST_F(TmaTest, BoxesLandInTheSwizzledPanelsTheWgmmasRead) { Check(37, 64, 9); }

// A paged block of 16 rows; and a box crossing the matrix's last row, whose rows past it land as
// zeros.
TEST_F(TmaTest, SixteenRowBoxesAndRowsPastTheEndAsZeros) {
  Check(5, 16, 9);
  Check(170, 64, 3);
}

}  // namespace
}  // namespace kimirt
