// Prefill GEMM on tensor cores for BF16-held weights (kernels.h, docs/cuda.md "Prefill GEMMs on
// tensor cores"): y [m, n] = bf16(x) [m, k] · w [n, k]ᵀ, F32 accumulation and output, for calls
// of more than kGemvMaxRows rows with Backend::bf16_prefill() on (issue 14 item 1).
//
// Two launches: x rounded to BF16 (round to nearest even) into scratch [m, kp], kp = k rounded up
// to 8 with zeros, so every 16-byte chunk of a row is whole; then the tile kernel over a grid of
// 128 × 128 output tiles: wgmma's (prefill_gemm_wgmma.cu), or tc_tile.cuh's on mma.sync, which
// gives the same bits. A weight whose rows are not 16-byte aligned (k % 8 ≠ 0)
// is first copied into scratch [n, kp] with zero padding (no model shape needs it; the odd test
// shapes do). The zeros add +0 products: no bits change.
//
// Batch invariance: the grid is m / 128 × n / 128 tiles of one fixed kernel; a row's output
// depends on its x row, w and k only (the k tiles in ascending order, no split) — never on m.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/env_switch.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/prefill_gemm_wgmma.h"
#include "kimirt/backend/cuda/tc_tile.cuh"

namespace kimirt::cuda {
namespace {

int64_t RoundUp8(int64_t k) { return (k + 7) / 8 * 8; }
size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

// A weight the tile can read in place: rows start 16-byte aligned.
bool WeightInPlace(const void* w, int64_t k) { return k % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0; }

// dst [rows, kp] BF16 = src [rows, k] (F32 rounded to nearest even, or BF16 copied), zeros in
// columns k .. kp. One thread per 8 output columns.
template <bool kFromF32>
__global__ void ToBf16PaddedKernel(const void* src, int64_t rows, int64_t k, int64_t kp, uint16_t* dst) {
  const int64_t chunks = kp / 8, total = rows * chunks;
  const bool vec = k % 4 == 0 && reinterpret_cast<uintptr_t>(src) % 16 == 0;  // rows of whole float4s
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t r = i / chunks, c0 = i % chunks * 8;
    uint32_t v[8];
    if constexpr (kFromF32) {
      const float* row = static_cast<const float*>(src) + r * k;
      if (vec && c0 + 8 <= k) {
        const float4 a = __ldg(reinterpret_cast<const float4*>(row + c0));
        const float4 b = __ldg(reinterpret_cast<const float4*>(row + c0 + 4));
        const float f[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = __bfloat16_as_ushort(__float2bfloat16_rn(f[e]));
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[e] = c0 + e < k ? __bfloat16_as_ushort(__float2bfloat16_rn(row[c0 + e])) : 0u;
      }
    } else {
      const uint16_t* row = static_cast<const uint16_t*>(src) + r * k;
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = c0 + e < k ? row[c0 + e] : 0u;
    }
    *reinterpret_cast<uint4*>(dst + r * kp + c0) =
        make_uint4(v[0] | v[1] << 16, v[2] | v[3] << 16, v[4] | v[5] << 16, v[6] | v[7] << 16);
  }
}

template <bool kFromF32>
void ToBf16Padded(const void* src, int64_t rows, int64_t k, int64_t kp, uint16_t* dst, cudaStream_t s) {
  const int64_t total = rows * (kp / 8);
  const int64_t blocks = std::min<int64_t>((total + 255) / 256, int64_t{132} * 16);
  ToBf16PaddedKernel<kFromF32><<<static_cast<unsigned>(blocks), 256, 0, s>>>(src, rows, k, kp, dst);
  CheckLaunch(kFromF32 ? "ToBf16Padded(F32)" : "ToBf16Padded(BF16)");
}

// Blocks in groups of kGroupM row tiles: the ~264 blocks resident at a time cover about 8 row
// tiles × 33 column tiles rather than 1 × 264, so each weight tile fetched from HBM serves 8 row
// tiles from L2 (at K3's MLP, n = 33792: the weight read m / 1024 times instead of m / 128).
// Which block computes a tile changes no bits.
constexpr int64_t kGroupM = 8;

__global__ void __launch_bounds__(tc::kThreads, 2)
    PrefillGemmKernel(const uint16_t* xb, int64_t m, int64_t kp, const uint16_t* w, int64_t n, float* y) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int64_t tiles_m = (m + tc::kBM - 1) / tc::kBM, tiles_n = (n + tc::kBN - 1) / tc::kBN;
  const int64_t pid = blockIdx.x, per_group = kGroupM * tiles_n, first_m = pid / per_group * kGroupM;
  const int64_t group_m = min(tiles_m - first_m, kGroupM), in_group = pid % per_group;
  const int64_t m0 = (first_m + in_group % group_m) * tc::kBM, n0 = in_group / group_m * tc::kBN;
  const int row0 = threadIdx.x >> 3;
  const uint16_t* a_rows[tc::kRowsPerThread];
  tc::BRowsBf16 b;
#pragma unroll
  for (int i = 0; i < tc::kRowsPerThread; ++i) {
    const int64_t r = row0 + tc::kLoadRows * i;
    a_rows[i] = m0 + r < m ? xb + (m0 + r) * kp : nullptr;
    b.rows[i] = n0 + r < n ? w + (n0 + r) * kp : nullptr;
  }
  float acc[4][4][4];
  tc::TileMma<false, false>(smem, a_rows, b, kp, w, acc);
  // (row, col) and (row, col + 1) as one aligned float2 where every row start is 8-byte aligned.
  const bool pairs = n % 2 == 0 && reinterpret_cast<uintptr_t>(y) % 8 == 0;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int f = 0; f < 4; f += 2) {
        const int64_t r = m0 + tc::TileRowOf(mi, f), c = n0 + tc::TileColOf<false>(ni, f);
        if (r >= m || c >= n) continue;
        float* out = y + r * n + c;
        if (pairs) {
          *reinterpret_cast<float2*>(out) = make_float2(acc[mi][ni][f], acc[mi][ni][f + 1]);
        } else {
          out[0] = acc[mi][ni][f];
          if (c + 1 < n) out[1] = acc[mi][ni][f + 1];
        }
      }
    }
  }
}

[[noreturn]] void Fail(const char* what, int64_t m, int64_t n, int64_t k) {
  std::fprintf(stderr, "kimirt: prefill GEMM of %lld x %lld x %lld (m x n x k): %s\n", static_cast<long long>(m),
               static_cast<long long>(n), static_cast<long long>(k), what);
  std::abort();
}

}  // namespace

void tc::RoundToBf16(const float* src, int64_t rows, int64_t k, int64_t kp, uint16_t* dst, cudaStream_t s) {
  ToBf16Padded<true>(src, rows, k, kp, dst, s);
}

size_t PrefillGemmScratchBytes(int64_t m, int64_t n, int64_t k, const void* w_bf16) {
  const int64_t kp = RoundUp8(k);
  size_t bytes = Align256(static_cast<size_t>(m * kp) * sizeof(uint16_t));
  if (!WeightInPlace(w_bf16, k)) bytes += Align256(static_cast<size_t>(n * kp) * sizeof(uint16_t));
  return bytes;
}

namespace {

// Which tile: the wgmma one (prefill_gemm_wgmma.cu; the same bits, 1.3-1.6x faster) unless
// KIMIRT_PREFILL_GEMM_WGMMA=0 (read once, for A/B runs) or the caller asks for the mma.sync one.
// BF16 output exists on the wgmma tile only.
enum class Tile { kDefault, kMmaSync, kWgmmaBf16Out };

void LaunchPrefillGemm(const float* x, const void* w_bf16, void* y, int64_t m, int64_t n, int64_t k, void* scratch,
                       cudaStream_t s, Tile tile, bool w_tiled = false) {
  if (m < 1 || n < 1 || k < 1) Fail("every dimension must be at least 1", m, n, k);
  const int64_t tiles = ((m + tc::kBM - 1) / tc::kBM) * ((n + tc::kBN - 1) / tc::kBN);
  if (m > (int64_t{1} << 31) || n > (int64_t{1} << 31) || tiles > INT32_MAX) {
    Fail("more tiles than the grid takes", m, n, k);
  }
  if (reinterpret_cast<uintptr_t>(scratch) % 256 != 0) Fail("scratch must be 256-byte aligned", m, n, k);
  if (reinterpret_cast<uintptr_t>(w_bf16) % 2 != 0) Fail("the weight must be 2-byte aligned", m, n, k);
  const int64_t kp = RoundUp8(k);
  uint16_t* xb = static_cast<uint16_t*>(scratch);
  tc::RoundToBf16(x, m, k, kp, xb, s);
  const uint16_t* w = static_cast<const uint16_t*>(w_bf16);
  if (!WeightInPlace(w_bf16, k)) {
    uint16_t* wp = reinterpret_cast<uint16_t*>(static_cast<uint8_t*>(scratch) +
                                               Align256(static_cast<size_t>(m * kp) * sizeof(uint16_t)));
    ToBf16Padded<false>(w_bf16, n, k, kp, wp, s);
    w = wp;
  }
  static const bool wgmma = EnvSwitchOn("KIMIRT_PREFILL_GEMM_WGMMA");
  if (w_tiled) {  // the wgmma tile alone reads a tiled weight (the same bits as the mma.sync one)
    if (tile != Tile::kDefault || !WeightInPlace(w_bf16, k) || !DecodeGemmTileable(n, k)) {
      Fail("a decode-tiled weight takes the default tile, n % 32 == 0, k % 128 == 0, 16-byte aligned", m, n, k);
    }
    PrefillGemmWgmmaTiles(xb, m, kp, w, n, y, false, s, true);
    return;
  }
  if (tile == Tile::kWgmmaBf16Out || (tile == Tile::kDefault && wgmma)) {
    PrefillGemmWgmmaTiles(xb, m, kp, w, n, y, tile == Tile::kWgmmaBf16Out, s);
    return;
  }
  // Per device, so on every call (a host-side attribute write, no launch).
  tc::AllowSharedMemory(reinterpret_cast<const void*>(PrefillGemmKernel), tc::kSmemBf16, "PrefillGemm");
  PrefillGemmKernel<<<static_cast<unsigned>(tiles), tc::kThreads, tc::kSmemBf16, s>>>(xb, m, kp, w, n,
                                                                                   static_cast<float*>(y));
  CheckLaunch("PrefillGemm");
}

}  // namespace

void PrefillGemm(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                 cudaStream_t s, bool w_tiled) {
  LaunchPrefillGemm(x, w_bf16, y, m, n, k, scratch, s, Tile::kDefault, w_tiled);
}

void PrefillGemmBf16Out(const float* x, const void* w_bf16, void* y_bf16, int64_t m, int64_t n, int64_t k,
                        void* scratch, cudaStream_t s) {
  LaunchPrefillGemm(x, w_bf16, y_bf16, m, n, k, scratch, s, Tile::kWgmmaBf16Out);
}

void PrefillGemmMmaSync(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                        cudaStream_t s) {
  LaunchPrefillGemm(x, w_bf16, y, m, n, k, scratch, s, Tile::kMmaSync);
}

}  // namespace kimirt::cuda
