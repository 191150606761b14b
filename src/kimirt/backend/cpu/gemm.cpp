// cpu::Gemm (gemm.h) through OpenBLAS's cblas_sgemm, in calls of exactly kGemmRowBlock rows.
//
// Why blocks (batch invariance, docs/numerics.md): cblas_sgemm is not row-invariant. How a row's
// sums are ordered depends on the call's row count (the kernels' tails for rows past the last
// full unroll, GEMV forwarding for one row) and on the kernel family OpenBLAS picks for the CPU
// at load time. Measured with Debian 12's OpenBLAS 0.3.21 on a 2-core Xeon VM: a row computed
// alone and the same row among 2-130 others differed in 175 of 250 shapes under the Prescott,
// Haswell, SkylakeX and Cooperlake kernels (1 or 2 threads; only Sandybridge's agreed), and
// ProcessRanksDecode.BatchedRowsEqualEachSequenceDecodedAlone failed on a machine where OpenBLAS
// detected Prescott. Every call here has the same shape, [kGemmRowBlock, k] · [n, k]ᵀ, with zero
// rows padding the last block, so each row takes the same path whatever the others are: 0 of
// those 250 shapes differed under any kernel family (cpu/gemm_test.cpp holds it). Full blocks
// are staged too, so every call also has the same operands' layout (the arrangement measured).
#include "kimirt/backend/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace kimirt::cpu {

void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  // Thread ranks call this concurrently: each thread its own staging.
  thread_local std::vector<float> xb, yb;
  xb.resize(static_cast<size_t>(kGemmRowBlock * k));
  yb.resize(static_cast<size_t>(kGemmRowBlock * n));
  for (int64_t m0 = 0; m0 < m; m0 += kGemmRowBlock) {
    const int64_t rows = std::min(kGemmRowBlock, m - m0);
    std::memcpy(xb.data(), x + m0 * k, static_cast<size_t>(rows * k) * sizeof(float));
    std::fill(xb.begin() + rows * k, xb.end(), 0.0f);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(kGemmRowBlock), static_cast<int>(n),
                static_cast<int>(k), 1.0f, xb.data(), static_cast<int>(k), w, static_cast<int>(k), 0.0f, yb.data(),
                static_cast<int>(n));
    std::memcpy(y + m0 * n, yb.data(), static_cast<size_t>(rows * n) * sizeof(float));
  }
}

}  // namespace kimirt::cpu
