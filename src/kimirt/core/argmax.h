// The greedy choice over a row of logits. The sampler (engine/sampler.cpp) and every backend's
// ArgmaxRows (backend.h) take it by these rules, so a token picked where the logits lie (a GPU)
// is the token the sampler would have picked from the downloaded row.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kimirt {

// Largest value, NaN ignored (so NaN counts as -inf); -inf when there is none.
float MaxOf(const float* __restrict x, size_t n);

// Lowest index holding the maximum (NaN as -inf; +0 and -0 are equal); -1 when every value is
// -inf or NaN.
int32_t ArgmaxOf(const float* __restrict x, size_t n);

}  // namespace kimirt
