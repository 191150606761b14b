// The sum order of cuda::Gemv (weight_kernels.cu), on the host: "lane" j of a warp sums
// x[i]·w[i] for i = j, j + 32, … ascending in one F32 accumulator, one fused multiply-add a term
// (nvcc contracts the kernels' acc += xv · w to FFMA), then v += v[j ^ 16], 8, 4, 2, 1, and the
// result is lane 0's. The MoE router's choices depend on these bits (issue 12), so the CUDA tests
// (CudaBackendGemv.*) and the kernels' host emulation (scripts/gemv_emulate.sh) hold the GPU to
// exactly this. Header-only, no dependencies: the emulation compiles it outside the build.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace kimirt::testing {

inline float GemvReferenceDot(const float* x, const float* w, int64_t k) {
  float lane[32];
  for (int j = 0; j < 32; ++j) {
    float acc = 0.0f;
    for (int64_t i = j; i < k; i += 32) acc = std::fmaf(x[i], w[i], acc);
    lane[j] = acc;
  }
  for (int off = 16; off > 0; off >>= 1) {
    float next[32];
    for (int j = 0; j < 32; ++j) next[j] = lane[j] + lane[j ^ off];
    std::copy(next, next + 32, lane);
  }
  return lane[0];
}

}  // namespace kimirt::testing
