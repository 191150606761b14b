#include "kimirt/eval/request_schedule.h"

#include <gtest/gtest.h>

#include <limits>

namespace kimirt::eval {
namespace {

TEST(RequestSchedule, MatchesVllmGetRequest) {
  // vLLM get_request with np.random.seed(0), rate 4, 6 requests: cumulative gamma(1, 1/4)
  // draws, rescaled so the last lands at 6 / 4 = 1.5 s (values printed by NumPy).
  const std::vector<double> t = PoissonArrivals(6, 4.0, 0);
  const std::vector<double> expected = {0.2230824511221632, 0.5751179921131646, 0.8338960785906834,
                                        1.0545474008581102, 1.2090054803918748, 1.5};
  ASSERT_EQ(t.size(), expected.size());
  for (size_t i = 0; i < t.size(); ++i) EXPECT_NEAR(t[i], expected[i], 1e-15) << i;
}

TEST(RequestSchedule, DeterministicPerSeedAndMonotone) {
  const std::vector<double> a = PoissonArrivals(1000, 10, 42), b = PoissonArrivals(1000, 10, 42),
                            c = PoissonArrivals(1000, 10, 43);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (size_t i = 1; i < a.size(); ++i) ASSERT_LE(a[i - 1], a[i]);
  EXPECT_DOUBLE_EQ(a.back(), 100.0);
  // Mean gap 1/rate: 999 gaps spanning 100 s minus the first arrival.
  EXPECT_NEAR((a.back() - a.front()) / 999.0, 0.1, 0.01);
}

TEST(RequestSchedule, InfiniteRateSendsEverythingAtOnce) {
  EXPECT_EQ(PoissonArrivals(3, std::numeric_limits<double>::infinity(), 0), (std::vector<double>{0, 0, 0}));
  EXPECT_TRUE(PoissonArrivals(0, 1, 0).empty());
}

}  // namespace
}  // namespace kimirt::eval
