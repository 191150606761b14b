// cpu::Gemm (gemm.h): row-invariant whatever the row count (the batch invariance every CPU op
// rests on; plain cblas_sgemm is not, gemm.cpp says where), and equal to a float64 product within
// F32 rounding.
#include "kimirt/backend/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kimirt/core/random.h"

namespace kimirt::cpu {
namespace {

std::vector<float> Random(SplitMix64& rng, int64_t count) {
  std::vector<float> v(static_cast<size_t>(count));
  for (float& x : v) x = rng.FastNormal();
  return v;
}

// A row computed alone and the same row at a position among m − 1 others (m across, below and
// above the row block) give the same bits, for widths that are and are not multiples of the
// BLAS kernels' unrolls.
TEST(CpuGemm, ARowsBitsDoNotDependOnTheOtherRows) {
  SplitMix64 rng(7);
  for (int64_t n : {32, 100, 512, 1000}) {
    for (int64_t k : {64, 96, 257}) {
      const std::vector<float> w = Random(rng, n * k), x0 = Random(rng, k);
      std::vector<float> alone(static_cast<size_t>(n));
      Gemm(x0.data(), w.data(), alone.data(), 1, n, k);
      for (int64_t m : {2, 3, 17, 63, 64, 65, 130}) {
        SCOPED_TRACE("n " + std::to_string(n) + " k " + std::to_string(k) + " m " + std::to_string(m));
        std::vector<float> x = Random(rng, m * k), y(static_cast<size_t>(m * n));
        const int64_t at = (m * 7 + 3) % m;
        std::memcpy(x.data() + at * k, x0.data(), static_cast<size_t>(k) * sizeof(float));
        Gemm(x.data(), w.data(), y.data(), m, n, k);
        EXPECT_EQ(std::memcmp(y.data() + at * n, alone.data(), static_cast<size_t>(n) * sizeof(float)), 0)
            << "row " << at;
      }
    }
  }
}

TEST(CpuGemm, MatchesAFloat64Product) {
  SplitMix64 rng(8);
  const int64_t m = 70, n = 33, k = 129;
  const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
  std::vector<float> y(static_cast<size_t>(m * n), -1.0f);
  Gemm(x.data(), w.data(), y.data(), m, n, k);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        want += static_cast<double>(x[i * k + p]) * w[j * k + p];
        mag += std::fabs(static_cast<double>(x[i * k + p]) * w[j * k + p]);
      }
      ASSERT_NEAR(y[i * n + j], want, 1e-6 * mag + 1e-30) << "row " << i << " column " << j;
    }
  }
  std::vector<float> zero_k(static_cast<size_t>(2 * 3), 5.0f);
  Gemm(x.data(), w.data(), zero_k.data(), 2, 3, 0);
  for (float v : zero_k) EXPECT_EQ(v, 0.0f);
}

}  // namespace
}  // namespace kimirt::cpu
