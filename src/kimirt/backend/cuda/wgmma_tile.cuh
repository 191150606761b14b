// One 128 × 128 output tile of a BF16 GEMM on Hopper's warpgroup MMA, for the prefill kernels
// (prefill_gemm_wgmma.cu, moe_prefill_kernels.cu): acc = a [128 rows, kp] · b [128 rows, kp]ᵀ with
// each row of a and b given by its own pointer (so callers gather rows: the MoE's tokens through
// `order`, an expert's gate and up rows side by side), null for a row of zeros.
//
// 256 threads = two warpgroups; warpgroup u computes rows 64u .. 64u + 63 against all 128 b rows
// (wgmma m64n128k16, both operands from shared memory as 128-byte-swizzled K-major panels of 64
// k, wgmma.cuh), its accumulators where the m16n8k16 C fragments would be: warp w, lane (g, t)
// holds rows 64u + 16w + g and + 8, columns 8j + 2t and + 1 at acc[4j .. 4j + 3] (rows g: 0, 1;
// g + 8: 2, 3). Every element sums its k16 products in ascending k from zero — tc_tile.cuh's
// order, whose bits it gives. Four cp.async stages of 64 k; one k tile's MMAs stay in flight
// while the next tile's barrier and copies are issued.
#pragma once

#include <cstdint>

#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/decode_tiled.cuh"
#include "kimirt/backend/cuda/wgmma.cuh"

namespace kimirt::cuda::wgmma {

constexpr int kTileRows = 128, kTileK = 64, kTileThreads = 256, kTileStages = 4;
constexpr uint32_t kTileStageBytes = kTileRows * kTileK * 2;  // 16 KB: an a or b tile of one k step
// Dynamic shared memory a block needs: the stages of a and b, and 1 KB to align them to the
// swizzle's 1,024 bytes (129 KB: one block an SM).
constexpr size_t kTileSmemBytes = kTileStages * 2 * kTileStageBytes + 1024;

// a_rows[i] / b_rows[i]: rows threadIdx.x / 8 + 32i of a and b (BF16, kp of them, 16-byte
// aligned; kp a multiple of 8), or null; `fallback` any valid global address (a zero-filled
// copy reads nothing but must name one). kTiledB: b is decode-tiled (decode_tiled.cuh), b_rows[i]
// its rows' DecodeTiledRow bases, and a chunk at k0 lies DecodeTiledK(k0) past them: the same
// values land in the same places.
template <bool kTiledB = false>
__device__ __forceinline__ void TileGemm(unsigned char* smem_raw, const uint16_t* const (&a_rows)[4],
                                         const uint16_t* const (&b_rows)[4], int64_t kp, const void* fallback,
                                         float (&acc)[64]) {
  const uint32_t a_addr = (SharedAddress(smem_raw) + 1023u) & ~1023u;  // stage s at + s · kTileStageBytes
  const uint32_t b_addr = a_addr + kTileStages * kTileStageBytes;
  const int num_k = static_cast<int>((kp + kTileK - 1) / kTileK);
  // Thread t copies chunk t % 8 of its rows t / 8 + 32i: one swizzle for all four (row mod 8).
  const int c8 = threadIdx.x % 8;
  const uint32_t sw = SwizzledOffset(threadIdx.x / 8, c8);
  auto load = [&](int kt, int stage) {
    const int64_t k0 = int64_t{kt} * kTileK + 8 * c8;
    const bool k_ok = k0 < kp;  // a chunk is whole or past the end
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const uint32_t off = stage * kTileStageBytes + 32 * 128 * i + sw;
      const bool a_ok = k_ok && a_rows[i] != nullptr, b_ok = k_ok && b_rows[i] != nullptr;
      CpAsync16(a_addr + off, a_ok ? a_rows[i] + k0 : fallback, a_ok);
      CpAsync16(b_addr + off, b_ok ? b_rows[i] + (kTiledB ? DecodeTiledK(k0) : k0) : fallback, b_ok);
    }
  };
#pragma unroll
  for (int i = 0; i < 64; ++i) acc[i] = 0.0f;
  const int wg = threadIdx.x / 128;
#pragma unroll
  for (int kt = 0; kt < kTileStages - 2; ++kt) {
    if (kt < num_k) load(kt, kt);
    CpAsyncCommit();
  }
  for (int kt = 0; kt < num_k; ++kt) {
    // k tile kt landed (kTileStages − 3 newer groups may fly); every warpgroup done with tile
    // kt − 2, whose stage the copies below take (the MMAs of kt − 1 may still run).
    CpAsyncWait<kTileStages - 3>();
    FenceProxyAsync();
    __syncthreads();
    if (kt + kTileStages - 2 < num_k) load(kt + kTileStages - 2, (kt + kTileStages - 2) % kTileStages);
    CpAsyncCommit();
    const uint32_t at = a_addr + (kt % kTileStages) * kTileStageBytes + wg * 64 * 128;
    const uint32_t bt = b_addr + (kt % kTileStages) * kTileStageBytes;
    FenceRegs(acc);
    Fence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) {
      WgmmaSS_m64n128k16<0>(acc, Desc128B(at + kk * 32, 16, 1024), Desc128B(bt + kk * 32, 16, 1024));
    }
    Commit();
    Wait<1>();  // tile kt − 1's MMAs done
    FenceRegs(acc);
  }
  Wait<0>();
  FenceRegs(acc);
}

// Where this thread's accumulators lie in the tile (the layout above): acc[4j + 2·half] and
// acc[4j + 2·half + 1] are row TileAccRow(half), columns TileAccCol(j) and + 1.
__device__ __forceinline__ int TileAccRow(int half) {
  return 64 * (threadIdx.x / 128) + 16 * (threadIdx.x / 32 % 4) + threadIdx.x % 32 / 4 + 8 * half;
}
__device__ __forceinline__ int TileAccCol(int j) { return 8 * j + 2 * (threadIdx.x % 4); }

}  // namespace kimirt::cuda::wgmma
