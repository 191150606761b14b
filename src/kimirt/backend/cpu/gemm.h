// The CPU backend's GEMM (gemm.cpp), shared by its ops and kernels.
#pragma once

#include <cstdint>

namespace kimirt::cpu {

// kAuto: the AVX2 kernel where the CPU has AVX2 and FMA, else the portable one. kPortable: the
// portable one always (the tests hold the two to the same bits).
enum class GemmKernel { kAuto, kPortable };

// y [m, n] = x [m, k] · w [n, k]ᵀ, all F32 row-major (k = 0 gives zeros). Row-invariant: each
// output's bits depend on its row of x and its row of w alone, never on m, n, where the row sits
// or the thread count (gemm.cpp gives the order of the sums).
void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k,
          GemmKernel kernel = GemmKernel::kAuto);

}  // namespace kimirt::cpu
