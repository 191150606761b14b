// The prefill GEMM's output tiles on Hopper's warpgroup MMA (prefill_gemm.cu's default; issue 14
// item 1): y [m, n] = xb [m, kp] · w [n, kp]ᵀ over BF16 rows already padded to kp (a multiple
// of 8), F32 accumulation, F32 or BF16 output.
//
// The same 128 × 128 output tile and grid order as the mma.sync tile (tc_tile.cuh), the same sums
// (wgmma_tile.cuh: each output element accumulates its k16 products in ascending k from zero), so
// a row's bits depend on its x row, w and k only (batch invariance), and the two kernels give the
// same bits (CudaBackendPrefillGemm.WgmmaGivesTheMmaSyncBits). Four k stages of 64 (129 KB, one
// block an SM); three at two blocks an SM measured the same within 2% (0.60 against 0.61 of the
// dense peak at K3's MLP, 21.2 against 20.9 ms for the 2-layer 48B's 8K prefill).
// Measured on an H200 (prefill_gemm_bench, docs/cuda.md): 0.55-0.69 of the dense BF16 peak on the
// 48B's and K3's shapes at 2,048-8,192 rows, against 0.39-0.49 for the mma.sync tile.
#include "kimirt/backend/cuda/prefill_gemm_wgmma.h"

#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/wgmma_tile.cuh"

namespace kimirt::cuda {
namespace {

constexpr int kBM = wgmma::kTileRows, kBN = wgmma::kTileRows, kThreads = wgmma::kTileThreads;
constexpr size_t kSmemBytes = wgmma::kTileSmemBytes;
// Row groups of the grid order, as tc_tile's kernel (prefill_gemm.cu kGroupM): each w tile fetched
// from HBM serves 8 row tiles from L2.
constexpr int64_t kGroupM = 8;

template <bool kBf16Out, bool kTiledB>
__global__ void __launch_bounds__(kThreads, 1)
    PrefillGemmWgmmaKernel(const uint16_t* xb, int64_t m, int64_t kp, const uint16_t* w, int64_t n, void* y) {
  extern __shared__ __align__(128) unsigned char smem_raw[];

  const int64_t tiles_m = (m + kBM - 1) / kBM, tiles_n = (n + kBN - 1) / kBN;
  const int64_t pid = blockIdx.x, per_group = kGroupM * tiles_n, first_m = pid / per_group * kGroupM;
  const int64_t group_m = min(tiles_m - first_m, kGroupM), in_group = pid % per_group;
  const int64_t m0 = (first_m + in_group % group_m) * kBM, n0 = in_group / group_m * kBN;
  const int row0 = threadIdx.x / 8;
  const uint16_t* a_rows[4];
  const uint16_t* b_rows[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t r = row0 + 32 * i;
    a_rows[i] = m0 + r < m ? xb + (m0 + r) * kp : nullptr;
    b_rows[i] = n0 + r < n ? w + (kTiledB ? DecodeTiledRow(n0 + r, kp) : (n0 + r) * kp) : nullptr;
  }
  float acc[kBN / 2];
  wgmma::TileGemm<kTiledB>(smem_raw, a_rows, b_rows, kp, xb, acc);

  const bool pairs = n % 2 == 0 && reinterpret_cast<uintptr_t>(y) % (kBf16Out ? 4 : 8) == 0;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t r = m0 + wgmma::TileAccRow(half);
    if (r >= m) continue;
#pragma unroll
    for (int j = 0; j < kBN / 8; ++j) {
      const int64_t c = n0 + wgmma::TileAccCol(j);
      if (c >= n) continue;
      const float v0 = acc[4 * j + 2 * half], v1 = acc[4 * j + 2 * half + 1];
      if constexpr (kBf16Out) {
        __nv_bfloat16* out = static_cast<__nv_bfloat16*>(y) + r * n + c;
        if (pairs) {
          *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(v0, v1);
        } else {
          out[0] = __float2bfloat16_rn(v0);
          if (c + 1 < n) out[1] = __float2bfloat16_rn(v1);
        }
      } else {
        float* out = static_cast<float*>(y) + r * n + c;
        if (pairs) {
          *reinterpret_cast<float2*>(out) = make_float2(v0, v1);
        } else {
          out[0] = v0;
          if (c + 1 < n) out[1] = v1;
        }
      }
    }
  }
}

template <bool kBf16Out, bool kTiledB>
void Launch(const uint16_t* xb, int64_t m, int64_t kp, const uint16_t* w, int64_t n, void* y, cudaStream_t s) {
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(PrefillGemmWgmmaKernel<kBf16Out, kTiledB>, kSmemBytes, true, "PrefillGemm (wgmma)", &configured);
  const int64_t tiles = ((m + kBM - 1) / kBM) * ((n + kBN - 1) / kBN);
  PrefillGemmWgmmaKernel<kBf16Out, kTiledB>
      <<<static_cast<unsigned>(tiles), kThreads, kSmemBytes, s>>>(xb, m, kp, w, n, y);
  CheckLaunch("PrefillGemm (wgmma)");
}

}  // namespace

void PrefillGemmWgmmaTiles(const uint16_t* xb, int64_t m, int64_t kp, const uint16_t* w, int64_t n, void* y,
                           bool bf16_out, cudaStream_t s, bool w_tiled) {
  if (w_tiled) {
    if (bf16_out) {
      std::fprintf(stderr, "kimirt: PrefillGemm (wgmma): a tiled weight takes F32 output only\n");
      std::abort();
    }
    Launch<false, true>(xb, m, kp, w, n, y, s);
  } else if (bf16_out) {
    Launch<true, false>(xb, m, kp, w, n, y, s);
  } else {
    Launch<false, false>(xb, m, kp, w, n, y, s);
  }
}

}  // namespace kimirt::cuda
