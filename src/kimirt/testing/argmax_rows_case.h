// Rows of logits that probe greedy decoding's rules (core/argmax.h) where an implementation
// could get them wrong: ties (the lowest index wins), +0 against -0, NaN (never the argmax),
// rows of only -inf or NaN (no argmax), +inf, and the maximum in the first, the last and a
// middle column. Header-only; nothing in the product includes it.
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "kimirt/core/random.h"

namespace kimirt::testing {

// Rows of width V (V >= 8): row 0 is plain random; the others each plant one case into random
// values below the planted ones.
inline std::vector<std::vector<float>> ArgmaxProbeRows(int64_t V, uint64_t seed = 7) {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  SplitMix64 rng(seed);
  auto random_row = [&] {
    std::vector<float> r(static_cast<size_t>(V));
    for (float& v : r) v = 3.0f * rng.FastNormal();
    return r;
  };
  const size_t n = static_cast<size_t>(V), mid = n / 2 + 3;
  std::vector<std::vector<float>> rows;
  rows.push_back(random_row());
  auto planted = [&](auto plant) {
    std::vector<float> r = random_row();
    plant(r);
    rows.push_back(std::move(r));
  };
  planted([&](std::vector<float>& r) { r[n - 1] = 100.0f, r[mid] = 100.0f; });          // tie: mid wins
  planted([&](std::vector<float>& r) { r[0] = 100.0f, r[n - 1] = 100.0f; });            // tie: 0 wins
  planted([&](std::vector<float>& r) { r[n - 1] = 100.0f; });                           // last column
  planted([&](std::vector<float>& r) { r[mid] = nan, r[mid + 1] = 100.0f, r[1] = nan; });  // NaN skipped
  planted([&](std::vector<float>& r) { r[5] = inf, r[mid] = inf; });                    // +inf tie
  rows.push_back(std::vector<float>(n, -inf));                                          // none
  rows.push_back(std::vector<float>(n, nan));                                           // none
  {
    std::vector<float> r(n, -1.0f);  // zeros of both signs are the maximum: the first one wins
    r[n - 2] = 0.0f, r[mid] = -0.0f, r[3] = nan;
    rows.push_back(std::move(r));
  }
  {
    std::vector<float> r(n, nan);  // one finite value among NaN and -inf
    r[2] = -inf, r[n - 3] = -1e30f;
    rows.push_back(std::move(r));
  }
  return rows;
}

}  // namespace kimirt::testing
