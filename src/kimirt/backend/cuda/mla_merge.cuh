// The fixed order in which a sequence's MLA decode splits meet (spec §6.6; issue 12): the splits
// (MlaDecodeSplitLen, a function of the context alone) go in groups of kMergeGroup consecutive
// ones; a group's results are chained in split order,
//
//   (m, l, ō) := (m₀, l₀, ō₀);  then for each next split j:  m' = max(m, m_j),
//   a = e^(m − m'), b = e^(m_j − m'),  ō := b·ō_j + a·ō,  l := b·l_j + a·l,  m := m'
//
// and the combine sums the groups' results over the sequence (MlaPagedDecodeCombineKernel). Who
// chains a group never changes a bit: the warp-specialized split chains the groups a block runs
// whole as it goes (one partial output a group written, not one a split), and the combine chains
// the rest from the splits' own partial outputs, both through these functions (explicit roundings:
// no contraction may differ between the two kernels).
#pragma once

#include <cuda_runtime.h>

namespace kimirt::cuda {

constexpr int kMergeGroup = 4;

struct MergeFactors {
  float a, b, m;  // the running result's factor, the split's, and the new max
};
__device__ __forceinline__ MergeFactors MergeFactorsOf(float m_run, float m_split) {
  const float m = fmaxf(m_run, m_split);
  return {expf(m_run - m), expf(m_split - m), m};
}
// run · a + x · b, rounded as b·x + (a·run).
__device__ __forceinline__ float MergeStep(float run, float x, float a, float b) {
  return __fmaf_rn(b, x, __fmul_rn(a, run));
}

// The group of item w, the sequence's items being j0 .. j0 + n − 1: its first and last item.
__device__ __forceinline__ void MergeGroupOf(int w, int j0, int n, int* first, int* last) {
  *first = j0 + (w - j0) / kMergeGroup * kMergeGroup;
  *last = min(*first + kMergeGroup - 1, j0 + n - 1);
}

}  // namespace kimirt::cuda
