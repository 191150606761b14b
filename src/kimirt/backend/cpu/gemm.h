// The CPU backend's GEMM (OpenBLAS), shared by its ops and kernels.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// y [m, n] = x [m, k] · w [n, k]ᵀ, all F32 row-major (k = 0 gives zeros).
void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);

}  // namespace kimirt::cpu
