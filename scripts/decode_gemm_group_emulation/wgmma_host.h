// Hopper's wgmma for the decode GEMM's host emulation (../decode_gemm_group_emulate.sh; the kernel's
// WgmmaStep and WgmmaIssue): m64n64k16 and m64n32k16 with A from the warpgroup's registers (warp w: rows 16w .. 16w + 15 as the
// m16n8k16 A fragment) and B K-major in 128-byte-swizzled shared memory, named by a descriptor
// (wgmma.cuh) whose start address is an offset into the block's dynamic shared memory: the kernel's
// __cvta_generic_to_shared becomes EmuSmemOffset. Each output sums its 16 products as shim.h's
// EmuMma does (in double, rounded once; scale-d 0 starts from zero), so a chain of these gives the
// emulated mma.sync chain's bits, and a wrong descriptor, panel, swizzle or fragment map does not.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "decode_gemm_host.h"

inline uint32_t EmuSmemOffset(const void* p) {
  return static_cast<uint32_t>(static_cast<const char*>(p) - reinterpret_cast<const char*>(g_dyn_smem));
}

inline uint32_t g_wg_a[4][32][4];  // the warpgroup's A fragments (one block runs at a time)

// m64nNk16, N = 2 · D (D: the thread's accumulators).
template <int D>
inline void EmuWgmmaRS(float (&d)[D], const unsigned (&a)[4], uint64_t desc, int scale_d) {
  if (blockDim.x != 128 || (desc >> 62) != 1) {
    std::fprintf(stderr, "emulated wgmma: a block of %u threads (128: one warpgroup), swizzle mode %u (1: 128 B)\n",
                 blockDim.x, static_cast<unsigned>(desc >> 62));
    std::abort();
  }
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  g_ctx->block.arrive_and_wait();
  for (int i = 0; i < 4; ++i) g_wg_a[w][l][i] = a[i];
  g_ctx->block.arrive_and_wait();
  const uint32_t start = static_cast<uint32_t>(desc & 0x3fff) << 4;
  const uint32_t sbo = static_cast<uint32_t>((desc >> 32) & 0x3fff) << 4;
  auto A = [&](int row, int k) {
    const int r = row % 16, ln = (r % 8) * 4 + (k % 8) / 2, reg = (r >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0);
    return Half(g_wg_a[row / 16][ln][reg], k % 2);
  };
  auto B = [&](int k, int n) {  // row n of the [N, 16] K-major tile: 8-row atoms SBO apart, swizzled
    const uint32_t logical = start + static_cast<uint32_t>(n / 8) * sbo + static_cast<uint32_t>(n % 8) * 128 + 2 * k;
    const uint32_t phys = logical ^ (((logical >> 7) & 7u) << 4);
    uint16_t v;
    std::memcpy(&v, reinterpret_cast<const char*>(g_dyn_smem) + phys, 2);
    return BfToF(v);
  };
  for (int j = 0; j < D / 4; ++j) {
    for (int e = 0; e < 4; ++e) {
      const int row = 16 * w + g + (e >= 2 ? 8 : 0), col = 8 * j + 2 * t + (e & 1);
      double s = scale_d != 0 ? d[4 * j + e] : 0.0;
      for (int k = 0; k < 16; ++k) s += static_cast<double>(A(row, k)) * B(k, col);
      d[4 * j + e] = static_cast<float>(s);
    }
  }
  g_ctx->block.arrive_and_wait();  // every thread has read the fragments before the next call writes them
}
