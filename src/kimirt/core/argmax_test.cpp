#include "kimirt/core/argmax.h"

#include <gtest/gtest.h>

#include <limits>
#include <vector>

#include "kimirt/testing/argmax_rows_case.h"

namespace kimirt {
namespace {

TEST(Argmax, LowestIndexOfTheMaxNanIgnoredNoneWhenAllNegInfOrNan) {
  // At a width that is not a multiple of the 16 lanes, and at the real vocabulary's.
  for (int64_t V : {37, 163840}) {
    const std::vector<std::vector<float>> rows = testing::ArgmaxProbeRows(V);
    const size_t n = static_cast<size_t>(V), mid = n / 2 + 3;
    // What each probe row's rule says, written out (row 0: the max found by a plain scan).
    int32_t plain = 0;
    for (size_t i = 1; i < n; ++i) plain = rows[0][i] > rows[0][static_cast<size_t>(plain)] ? static_cast<int32_t>(i) : plain;
    const std::vector<int32_t> want = {plain, static_cast<int32_t>(mid), 0, static_cast<int32_t>(n - 1),
                                       static_cast<int32_t>(mid + 1), 5, -1, -1, static_cast<int32_t>(mid),
                                       static_cast<int32_t>(n - 3)};
    ASSERT_EQ(rows.size(), want.size());
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(ArgmaxOf(rows[r].data(), n), want[r]) << "V " << V << " row " << r;
    }
    EXPECT_EQ(MaxOf(rows[6].data(), n), -std::numeric_limits<float>::infinity());
    EXPECT_EQ(MaxOf(rows[7].data(), n), -std::numeric_limits<float>::infinity());
  }
  EXPECT_EQ(ArgmaxOf(nullptr, 0), -1);
}

}  // namespace
}  // namespace kimirt
