// cpu::Gemm (gemm.h): our own kernel, every output one fixed sequence of operations.
//
// Why not OpenBLAS (batch invariance, docs/numerics.md): cblas_sgemm is not row-invariant. How a
// row's sums are ordered depends on the call's row count (the kernels' tails, GEMV forwarding for
// one row) and, with the row count fixed, on the row's position in the call: under Debian 12's
// OpenBLAS 0.3.21 (Haswell and Zen kernels, 1 or 2 threads) rows 6-11 of every 12 of a 64-row
// call summed differently from rows 0-5, in 118-119 of 120 shapes, so a prompt's bits moved with
// where its chunk began. Padding every call to 64 rows (this file's earlier answer) also made a
// one-row decode pay for 64.
//
// Here y[i][j] is, whatever m, i, j, the tiling or the threads: eight lanes, lane l summing
// x[i][p]·w[j][p] over p ≡ l (mod 8) in increasing p by FMA (the last partial group's missing
// products as FMAs of zeros), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). The AVX2
// kernel and the portable one compute exactly that (FMA is rounded once on both), so they agree
// bit for bit (gemm_test.cpp). Tiles of 3 rows × 4 columns keep twelve accumulators in
// registers; a task is a block of rows × a block of columns whose weights stay in L2.
#include "kimirt/backend/cpu/gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kimirt/core/parallel_for.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KIMIRT_GEMM_AVX2 1
#endif

namespace kimirt::cpu {
namespace {

constexpr int64_t kLanes = 8;
constexpr int64_t kTileRows = 3, kTileCols = 4;

// The lanes' fixed reduction order (the AVX2 kernel's: high half onto low, then pairs).
float ReduceLanes(const float (&l)[kLanes]) { return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7])); }

// Portable: one output at a time, the lanes as an array.
void TilePortable(const float* x, const float* w, float* y, int64_t rows, int64_t cols, int64_t n, int64_t k) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float* xr = x + r * k;
      const float* wc = w + c * k;
      float acc[kLanes] = {};
      for (int64_t p = 0; p < k; p += kLanes) {
        for (int64_t l = 0; l < kLanes; ++l) {
          const bool in = p + l < k;
          acc[l] = std::fma(in ? xr[p + l] : 0.0f, in ? wc[p + l] : 0.0f, acc[l]);
        }
      }
      y[r * n + c] = ReduceLanes(acc);
    }
  }
}

#ifdef KIMIRT_GEMM_AVX2
__attribute__((target("avx2,fma"))) inline float ReduceAvx2(__m256 v) {
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // l_i + l_{i+4}
  const __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));  // (l0+l4)+(l2+l6), (l1+l5)+(l3+l7)
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// A tile of R rows × C columns, all of k: R·C accumulators of eight lanes.
template <int R, int C>
__attribute__((target("avx2,fma"))) void TileAvx2(const float* x, const float* w, float* y, int64_t n, int64_t k) {
  __m256 acc[R][C];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  }
  const int64_t full = k / kLanes * kLanes;
  for (int64_t p = 0; p < full; p += kLanes) {
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_loadu_ps(x + r * k + p);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_loadu_ps(w + c * k + p);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  if (full < k) {  // the partial group: masked loads read zeros past k
    alignas(32) int32_t mask_bits[kLanes];
    for (int64_t l = 0; l < kLanes; ++l) mask_bits[l] = full + l < k ? -1 : 0;
    const __m256i mask = _mm256_load_si256(reinterpret_cast<const __m256i*>(mask_bits));
    __m256 xv[R];
    for (int r = 0; r < R; ++r) xv[r] = _mm256_maskload_ps(x + r * k + full, mask);
    for (int c = 0; c < C; ++c) {
      const __m256 wv = _mm256_maskload_ps(w + c * k + full, mask);
      for (int r = 0; r < R; ++r) acc[r][c] = _mm256_fmadd_ps(xv[r], wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < C; ++c) y[r * n + c] = ReduceAvx2(acc[r][c]);
  }
}

template <int R>
void TileAvx2Cols(const float* x, const float* w, float* y, int64_t cols, int64_t n, int64_t k) {
  switch (cols) {
    case 4: return TileAvx2<R, 4>(x, w, y, n, k);
    case 3: return TileAvx2<R, 3>(x, w, y, n, k);
    case 2: return TileAvx2<R, 2>(x, w, y, n, k);
    default: return TileAvx2<R, 1>(x, w, y, n, k);
  }
}

void TileAvx2Any(const float* x, const float* w, float* y, int64_t rows, int64_t cols, int64_t n, int64_t k) {
  switch (rows) {
    case 3: return TileAvx2Cols<3>(x, w, y, cols, n, k);
    case 2: return TileAvx2Cols<2>(x, w, y, cols, n, k);
    default: return TileAvx2Cols<1>(x, w, y, cols, n, k);
  }
}

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#endif

using TileFn = void (*)(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);

TileFn PickTile(GemmKernel kernel) {
#ifdef KIMIRT_GEMM_AVX2
  if (kernel != GemmKernel::kPortable && HasAvx2()) return TileAvx2Any;
#endif
  (void)kernel;
  return TilePortable;
}

}  // namespace

void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k, GemmKernel kernel) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  const TileFn tile = PickTile(kernel);
  // Blocks: ~256 KB of weights (a column block stays in L2 while the row tiles pass over it),
  // 48 rows; a whole multiple of the tile either way.
  const int64_t block_cols = std::max<int64_t>(kTileCols, (int64_t{256 * 1024} / (4 * k)) / kTileCols * kTileCols);
  const int64_t block_rows = 16 * kTileRows;
  const int64_t col_blocks = (n + block_cols - 1) / block_cols, row_blocks = (m + block_rows - 1) / block_rows;
  auto run = [&](int64_t task) {
    const int64_t r0 = task / col_blocks * block_rows, c0 = task % col_blocks * block_cols;
    const int64_t r1 = std::min(m, r0 + block_rows), c1 = std::min(n, c0 + block_cols);
    for (int64_t r = r0; r < r1; r += kTileRows) {
      const int64_t rows = std::min(kTileRows, r1 - r);
      for (int64_t c = c0; c < c1; c += kTileCols) {
        tile(x + r * k, w + c * k, y + r * n + c, rows, std::min(kTileCols, c1 - c), n, k);
      }
    }
  };
  const int64_t tasks = row_blocks * col_blocks;
  // Threads cost a few µs a call: small products stay on the caller (bits are the same either way).
  if (tasks == 1 || m * n * k < (int64_t{1} << 18)) {
    for (int64_t t = 0; t < tasks; ++t) run(t);
  } else {
    ParallelFor(tasks, run);
  }
}

}  // namespace kimirt::cpu
