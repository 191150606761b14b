// cpu::Gemm (gemm.h) through OpenBLAS's cblas_sgemm.
#include "kimirt/backend/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>

namespace kimirt::cpu {

void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y,
              static_cast<int>(n));
}

}  // namespace kimirt::cpu
