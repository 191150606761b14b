// The CPU backend's GEMM (OpenBLAS), shared by its ops and kernels.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// Rows a BLAS call takes: every call has exactly this many (gemm.cpp says why).
inline constexpr int64_t kGemmRowBlock = 64;

// y [m, n] = x [m, k] · w [n, k]ᵀ, all F32 row-major (k = 0 gives zeros). Row-invariant: a row's
// bits depend on that row of x and on w alone, never on m or the other rows.
void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k);

}  // namespace kimirt::cpu
