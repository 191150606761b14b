// cpu::Gemm (gemm.h): each output the documented order of sums whatever the call (the batch
// invariance every CPU op rests on; plain cblas_sgemm is not, gemm.cpp says where), the AVX2 and
// portable kernels the same bits, and equal to a float64 product within F32 rounding.
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

// gemm.cpp's order, restated: eight lanes, lane l FMA-summing x[p]·w[p] for p ≡ l (mod 8) in
// increasing p (zeros past k), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
float Documented(const float* x, const float* w, int64_t k) {
  float lane[8] = {};
  for (int64_t p = 0; p < (k + 7) / 8 * 8; ++p) {
    lane[p % 8] = std::fma(p < k ? x[p] : 0.0f, p < k ? w[p] : 0.0f, lane[p % 8]);
  }
  return ((lane[0] + lane[4]) + (lane[2] + lane[6])) + ((lane[1] + lane[5]) + (lane[3] + lane[7]));
}

// Every output of calls of many shapes (rows and columns across the 3 × 4 tiles, the 48-row and
// L2-sized column blocks and the threading threshold; k with and without a partial lane group,
// below 8 too) is the documented order's bits, from both kernels.
TEST(CpuGemm, EveryOutputIsTheDocumentedOrderOfSums) {
  SplitMix64 rng(7);
  for (int64_t k : {1, 5, 8, 64, 257, 1030}) {
    for (int64_t n : {1, 3, 4, 33, 300}) {
      for (int64_t m : {1, 2, 4, 50, 97}) {
        if (m * n * k > 40'000'000) continue;
        SCOPED_TRACE("m " + std::to_string(m) + " n " + std::to_string(n) + " k " + std::to_string(k));
        const std::vector<float> x = Random(rng, m * k), w = Random(rng, n * k);
        std::vector<float> fast(static_cast<size_t>(m * n), NAN), portable(static_cast<size_t>(m * n), NAN);
        Gemm(x.data(), w.data(), fast.data(), m, n, k);
        Gemm(x.data(), w.data(), portable.data(), m, n, k, GemmKernel::kPortable);
        for (int64_t i = 0; i < m; ++i) {
          for (int64_t j = 0; j < n; ++j) {
            const float want = Documented(x.data() + i * k, w.data() + j * k, k);
            ASSERT_EQ(std::memcmp(&fast[i * n + j], &want, 4), 0) << "AVX2/auto, row " << i << " column " << j;
            ASSERT_EQ(std::memcmp(&portable[i * n + j], &want, 4), 0) << "portable, row " << i << " column " << j;
          }
        }
      }
    }
  }
}

// A row computed alone and the same row at every position among m − 1 others give the same bits
// (OpenBLAS, which this replaced, differed at rows 6-11 of every 12 in a 64-row call).
TEST(CpuGemm, ARowsBitsDoNotDependOnTheOtherRowsOrItsPosition) {
  SplitMix64 rng(9);
  for (int64_t n : {32, 100, 1000}) {
    for (int64_t k : {64, 96, 257}) {
      const std::vector<float> w = Random(rng, n * k), x0 = Random(rng, k);
      std::vector<float> alone(static_cast<size_t>(n));
      Gemm(x0.data(), w.data(), alone.data(), 1, n, k);
      for (int64_t m : {2, 17, 65, 130}) {
        std::vector<float> x = Random(rng, m * k), y(static_cast<size_t>(m * n));
        for (int64_t at = 0; at < m; ++at) {
          std::vector<float> xa = x;
          std::memcpy(xa.data() + at * k, x0.data(), static_cast<size_t>(k) * sizeof(float));
          Gemm(xa.data(), w.data(), y.data(), m, n, k);
          ASSERT_EQ(std::memcmp(y.data() + at * n, alone.data(), static_cast<size_t>(n) * sizeof(float)), 0)
              << "n " << n << " k " << k << " m " << m << " row " << at;
        }
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
