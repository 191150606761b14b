#include "kimirt/eval/request_schedule.h"

#include <cmath>

#include "kimirt/eval/mt19937.h"

namespace kimirt::eval {

std::vector<double> PoissonArrivals(size_t n, double rate, uint32_t seed) {
  std::vector<double> t(n, 0.0);
  if (n == 0 || !(rate > 0) || std::isinf(rate)) return t;
  Mt19937 rng = Mt19937::NumpySeeded(seed);
  const double theta = 1.0 / rate;  // scale of gamma(shape = burstiness = 1)
  for (size_t i = 0; i < n; ++i) t[i] = rng.NumpyStandardExponential() * theta;
  for (size_t i = 1; i < n; ++i) t[i] += t[i - 1];
  if (t.back() != 0) {
    const double factor = (static_cast<double>(n) / rate) / t.back();
    for (double& x : t) x *= factor;
  }
  return t;
}

}  // namespace kimirt::eval
