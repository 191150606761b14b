#include "kimirt/core/random.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kimirt {
namespace {

TEST(Random, FastNormalHasUnitVarianceAndBoundedTails) {
  SplitMix64 r(42);
  const int n = 1'000'000;
  double s = 0, s2 = 0, s4 = 0;
  for (int i = 0; i < n; ++i) {
    const double x = r.FastNormal();
    ASSERT_LE(std::fabs(x), 2.0 * std::sqrt(3.0) + 1e-6);
    s += x;
    s2 += x * x;
    s4 += x * x * x * x;
  }
  // Standard errors at n = 1e6: mean 0.001, variance ~0.0013.
  EXPECT_NEAR(s / n, 0.0, 0.005);
  EXPECT_NEAR(s2 / n, 1.0, 0.01);
  // Irwin-Hall(4) kurtosis is 3 - 6/(5·4) = 2.7, close to the normal's 3 and far from a
  // uniform's 1.8: the values are bell-shaped, not flat.
  EXPECT_NEAR(s4 / n, 2.7, 0.05);
}

TEST(Random, StreamsAreDeterministicPerSeed) {
  SplitMix64 a(7), b(7), c(8);
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.Next();
    EXPECT_EQ(x, b.Next());
    EXPECT_NE(x, c.Next());
  }
  EXPECT_NE(HashName("layers.0.q"), HashName("layers.0.k"));
}

}  // namespace
}  // namespace kimirt
