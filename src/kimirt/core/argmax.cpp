#include "kimirt/core/argmax.h"

#include <algorithm>
#include <limits>

namespace kimirt {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
// Blocks of kLanes with one accumulator per lane: GCC's -O2 vectoriser takes loops with a fixed
// inner trip count (engine/sampler.cpp says more).
constexpr size_t kLanes = 16;

}  // namespace

float MaxOf(const float* __restrict x, size_t n) {
  float lane[kLanes];
  std::fill(lane, lane + kLanes, kNegInf);
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  float m = kNegInf;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  for (size_t j = 0; j < kLanes; ++j) m = lane[j] > m ? lane[j] : m;
  return m;
}

// Two passes (max, then its first position) beat one that tracks positions per lane.
int32_t ArgmaxOf(const float* __restrict x, size_t n) {
  const float m = MaxOf(x, n);
  if (m == kNegInf) return -1;
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    uint32_t any = 0;
    for (size_t j = 0; j < kLanes; ++j) any |= x[i + j] == m ? 1u : 0u;
    if (any != 0) break;
  }
  for (; i < n; ++i) {
    if (x[i] == m) return static_cast<int32_t>(i);
  }
  return -1;  // unreachable: m is one of the values
}

}  // namespace kimirt
