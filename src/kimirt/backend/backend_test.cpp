// Backend's base ops (backend.cpp) on the CPU backend: LinearGroup is Linear per problem.
#include "kimirt/backend/backend.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

Tensor RandomHost(Shape shape, uint64_t seed) {
  Tensor t = Tensor::Host(std::move(shape));
  SplitMix64 r(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = static_cast<float>(r.Uniform() * 2.0 - 1.0);
  return t;
}

Tensor Poisoned(Shape shape) {
  Tensor t = Tensor::Host(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = std::numeric_limits<float>::quiet_NaN();
  return t;
}

// Problems that share x, one with its own x (the KDA's f_b / g_b), widths 1 and odd: every
// output has Linear's bits, and those are x · wᵀ (a float64 sum, so a no-op or a swapped
// output cannot pass).
TEST(BackendLinearGroup, EachOutputIsItsLinear) {
  std::unique_ptr<Backend> be = MakeCpuBackend();
  const int64_t T = 3;
  const Tensor x = RandomHost({T, 40}, 1), x2 = RandomHost({T, 7}, 2);
  const std::vector<Tensor> w = {RandomHost({33, 40}, 3), RandomHost({1, 40}, 4), RandomHost({5, 7}, 5)};
  const std::vector<const Tensor*> xs = {&x, &x, &x2};
  std::vector<Tensor> y, alone;
  std::vector<Backend::LinearProblem> problems;
  for (size_t i = 0; i < w.size(); ++i) y.push_back(Poisoned({T, w[i].dim(0)}));
  for (size_t i = 0; i < w.size(); ++i) problems.push_back({xs[i], &w[i], &y[i]});
  be->LinearGroup(problems);
  for (size_t i = 0; i < w.size(); ++i) {
    alone.push_back(Poisoned({T, w[i].dim(0)}));
    be->Linear(*xs[i], w[i], &alone[i]);
    ASSERT_EQ(std::memcmp(y[i].raw(), alone[i].raw(), y[i].nbytes()), 0) << "problem " << i;
    const int64_t N = w[i].dim(0), K = w[i].dim(1);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t n = 0; n < N; ++n) {
        double want = 0.0;
        for (int64_t k = 0; k < K; ++k) want += double{xs[i]->f32()[t * K + k]} * w[i].f32()[n * K + k];
        EXPECT_NEAR(y[i].f32()[t * N + n], want, 1e-5) << "problem " << i << " row " << t << " col " << n;
      }
    }
  }
}

}  // namespace
}  // namespace kimirt
