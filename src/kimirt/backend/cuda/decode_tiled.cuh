// The decode-tiled weight layout (kernels.h TileWeightForDecode; docs/cuda.md "Weights tiled for
// the decode GEMM"): an [n, k] BF16 weight, n % 32 == 0, k % 128 == 0, stored as tiles of 32 rows
// × 128 k (8 KB), k-fastest; inside a tile the 16-byte chunks lie in the order a DecodeGemm warp's
// round loads them: step u (32 k), column tile c (16 rows), half h (8 rows), lane g·4 + t (row g,
// k 8t .. 8t+7). Element (col, kk) of a chunk start (kk % 8 == 0) is at
// DecodeTiledRow(col, k) + DecodeTiledK(kk): the row's and the k's parts add, so a kernel that
// walks a row (the prefill GEMM's copies) keeps a row base and offsets it by k as before.
#pragma once

#include <cstdint>

// Device and host code alike (host: the kernels' emulations, scripts/*_emulate.sh).
#ifdef __CUDACC__
#define KIMIRT_DECODE_TILED_FN __host__ __device__ __forceinline__
#else
#define KIMIRT_DECODE_TILED_FN inline
#endif

namespace kimirt::cuda {

KIMIRT_DECODE_TILED_FN int64_t DecodeTiledRow(int64_t col, int64_t k) {
  return col / 32 * (k / 128) * 4096 + (col % 32 / 16 * 2 + col % 16 / 8) * 256 + col % 8 * 32;
}

KIMIRT_DECODE_TILED_FN int64_t DecodeTiledK(int64_t kk) {
  return kk / 128 * 4096 + kk % 128 / 32 * 1024 + kk % 32;
}

}  // namespace kimirt::cuda
