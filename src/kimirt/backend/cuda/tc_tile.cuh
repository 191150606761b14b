// The tensor-core tile shared by the prefill GEMMs (prefill_gemm.cu, moe_prefill_kernels.cu;
// docs/cuda.md "Prefill GEMMs on tensor cores"): a 128 × 128 output tile of acc += a · bᵀ, a and
// b BF16 with k contiguous, F32 accumulation, mma.sync m16n8k16 fed by ldmatrix from shared
// memory, which a 3-stage cp.async pipeline fills 64 k at a time.
//
// Batch invariance by construction: every output element is one thread's accumulator, which
// sees the k16 MMAs of its row in ascending k, one after another, whatever the tile's other rows
// are and however many rows the call has. No split of k, no tile size chosen by m: a row's bits
// depend on its own x row and the weight only.
//
// b comes in two forms. BF16: straight through cp.async like a. MXFP4 (spec §2.9: two E2M1
// codes a byte, low nibble first, one E8M0 scale per 32): the codes go through cp.async into a
// small raw stage, and each k tile is decoded into one BF16 b tile in shared memory before its
// MMAs. Every MXFP4 value is exactly a BF16 value (E2M1 × 2^(s−127): ≤ 2 significant bits), so
// the decoded tile holds the bits a BF16-held copy of the same weights holds, and the MMAs — the
// same instructions in the same order — give the same bits.
//
// Layout: 256 threads = 8 warps, 2 along m × 4 along n, a warp 64 rows × 32 columns (4 × 4
// MMA tiles, 64 accumulators a thread). Shared rows are 64 BF16 = 128 bytes = 8 chunks of 16
// bytes, chunk c of row r stored at chunk c ^ (r % 8): the 8 rows one ldmatrix reads (and the 8
// a cp.async wave writes) fall in 8 distinct bank groups.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/mxfp4_tiled.cuh"

namespace kimirt::cuda::tc {

constexpr int kBM = 128, kBN = 128, kBK = 64, kStages = 3, kThreads = 256;
constexpr int kRowBytes = kBK * 2;              // one tile row of BF16
constexpr int kTileBytes = kBM * kRowBytes;     // 16 KB (a and b tiles are the same size)
constexpr int kRawBytes = kBN * kBK / 2;        // an MXFP4 b tile's codes: 4 KB
// MXFP4 codes as they arrive: row-major, kStages k tiles; tiled (mxfp4_tiled.cuh), two pairs of k
// tiles, a pair being each row's 128 k (64 bytes) of one tile of the layout (TileMma's load).
constexpr int kPairBytes = 2 * kRawBytes;
constexpr int kRawAreaBytes = 2 * kPairBytes;   // 16 KB
static_assert(kStages * kRawBytes <= kRawAreaBytes, "row-major stages fit the raw area");
constexpr int kLoadRows = kThreads / 8;         // rows one pass of the 256 threads loads (8 chunks a row)
constexpr int kRowsPerThread = kBM / kLoadRows; // 4
static_assert(kBM == kBN && kBN * 2 == kThreads, "MXFP4 decode: one thread per (row, scale group) of a k tile");
// Dynamic shared memory of a kernel using the tile (above the 48 KB default: the kernel sets
// cudaFuncAttributeMaxDynamicSharedMemorySize). Two blocks fit a Hopper SM (227 KB) either way.
constexpr size_t kSmemBf16 = static_cast<size_t>(kStages) * 2 * kTileBytes;                  // 96 KB
constexpr size_t kSmemMxfp4 = static_cast<size_t>(kStages) * kTileBytes + kRawAreaBytes + kTileBytes;  // 80 KB

// Lets `kernel` take `bytes` of dynamic shared memory on the current device (the attribute is
// per device, so callers set it before every launch: a host-side write, no launch).
inline void AllowSharedMemory(const void* kernel, size_t bytes, const char* what) {
  const cudaError_t e =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kimirt: %s: %zu bytes of shared memory: %s\n", what, bytes, cudaGetErrorString(e));
    std::abort();
  }
}

// dst [rows, kp] BF16 = src [rows, k] F32 rounded to nearest even, zeros in columns k .. kp − 1
// (kp a multiple of 8, so every 16-byte chunk of a row is whole); prefill_gemm.cu.
void RoundToBf16(const float* src, int64_t rows, int64_t k, int64_t kp, uint16_t* dst, cudaStream_t s);

__device__ __forceinline__ uint32_t SharedAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Byte offset of 16-byte chunk c of row r in a swizzled tile.
__device__ __forceinline__ uint32_t Swz(int r, int c) {
  return static_cast<uint32_t>(r * kRowBytes + ((c ^ (r & 7)) << 4));
}


__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// MXFP4 → F32, exactly (spec §2.9): E8M0 s is 2^(s−127) (s = 0 the subnormal 2^−127, s = 255
// NaN); an E2M1 code is ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}. Their product is exact (or ±inf past
// F32's range), and every such value is a BF16 value, so its top 16 bits are its BF16.
__device__ __forceinline__ float E8M0ToFloat(uint32_t s) {
  if (s == 255u) return __int_as_float(0x7fc00000);
  return s == 0u ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(s << 23));
}
// Built from the code's bits, in registers (a 16-entry table would sit in local memory): for a
// magnitude code m ≥ 2 (exponent e = m >> 1 ≥ 1, mantissa bit m & 1) the F32 bits are
// ((e + 126) << 23) | ((m & 1) << 22) = (m + 252) << 22; m = 1 is 0.5, m = 0 is 0; bit 3 the sign.
__device__ __forceinline__ float E2M1ToFloat(uint32_t code) {
  const uint32_t m = code & 7u;
  const uint32_t mag = m >= 2u ? (m + 252u) << 22 : (m == 1u ? 0x3f000000u : 0u);
  return __uint_as_float(mag | (code & 8u) << 28);
}
// 8 codes (a 32-bit word, element i in bits 4i..4i+3) × scale → 8 BF16 packed two a word.
__device__ __forceinline__ uint4 DecodeMxfp4x8(uint32_t codes, float scale) {
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = __float_as_uint(E2M1ToFloat(codes >> (8 * i)) * scale) >> 16;
    const uint32_t hi = __float_as_uint(E2M1ToFloat(codes >> (8 * i + 4)) * scale) >> 16;
    w[i] = lo | (hi << 16);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// 8 tiled codes (mxfp4_tiled.cuh's bit order) × scale → what DecodeMxfp4x8 gives for the same
// codes row-major, without putting them back in row-major order (Mxfp4UntileWord: ~50 by its source, not
// counted in SASS; the tiled prefill ran 0.86x of row-major with it). The placement holds element e as the
// BF16 bits of E2M1 × 2^−126 in half e / 4 of A word e % 4; × 2^126 is exact (|x| ≤ 6 · 2^−126,
// F32 subnormals kept: no -ftz) and gives E2M1ToFloat's float, then the same multiply by scale.
__device__ __forceinline__ uint4 DecodeMxfp4TiledX8(uint32_t tiled, float scale) {
  const Mxfp4Placed p = Mxfp4PlaceTiled(tiled);
  const auto value = [&](uint32_t bits) { return __float_as_uint(__uint_as_float(bits) * 0x1p126f * scale); };
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // elements 2i and 2i + 1
    const uint32_t a = p.a[2 * i % 4], b = p.a[(2 * i + 1) % 4];
    const uint32_t lo = value(i < 2 ? a << 16 : a & 0xFFFF0000u), hi = value(i < 2 ? b << 16 : b & 0xFFFF0000u);
    w[i] = (lo >> 16) | (hi & 0xFFFF0000u);
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Where a block's b tile comes from. BF16: rows[i] is the global row of tile row
// (tid / 8 + 32 i) (null: a row past the weight, zeros), k contiguous. MXFP4: the codes and
// scales of tile row tid / 2 (null: zeros); the thread loads and decodes its scale group tid % 2
// of each k tile.
struct BRowsBf16 {
  const uint16_t* rows[kRowsPerThread];
};
struct BRowsMxfp4 {
  const uint8_t* codes;
  const uint8_t* scales;
  // codes tiled (mxfp4_tiled.cuh): `codes` is the row's base (Mxfp4TiledRow), k's part added.
  bool tiled = false;
};

// acc (a warp's 4 × 4 MMA tiles, [m tile][n tile][fragment]) = Σ over k tiles of a_tile · b_tileᵀ.
// a_rows[i]: the BF16 row of tile row (tid / 8 + 32 i), null for zeros; kp: k, a multiple of 8
// (BF16 chunks are whole) — for MXFP4 a multiple of 32. `any`: a valid global address (the
// source of zero-filled copies). kGlu: the warp's n tiles are b rows {16w, 16w + 8} and
// {64 + 16w, 64 + 16w + 8} (w = the warp's n index), so n tile j and j + 2 are gate and up of
// the same column and the GLU epilogue stays in registers; else rows 32w + 8j.
template <bool kMxfp4, bool kGlu, typename BRows>
__device__ __forceinline__ void TileMma(uint8_t* smem, const uint16_t* const (&a_rows)[kRowsPerThread],
                                        const BRows& b, int64_t kp, const void* any, float (&acc)[4][4][4]) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wm = warp >> 2, wn = warp & 3;
  uint8_t* const a_base = smem;
  uint8_t* const b_base = smem + kStages * kTileBytes;  // BF16 b stages, or MXFP4 raw stages
  uint8_t* const b_dec = b_base + kRawAreaBytes;      // MXFP4: the decoded b tile
  const int64_t ktiles = (kp + kBK - 1) / kBK;
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int f = 0; f < 4; ++f) acc[mi][ni][f] = 0.0f;
    }
  }
  // MXFP4 scales of the stages in flight (a ring shifted each k tile, so indices stay constant).
  uint32_t scale_ring[kStages - 1] = {};
  const int chunk = tid & 7, row0 = tid >> 3;
  auto load = [&](int64_t kt) -> uint32_t {
    const int slot = static_cast<int>(kt % kStages);
    const int64_t kk = kt * kBK + chunk * 8;
    const uint32_t a_s = SharedAddr(a_base + slot * kTileBytes);
#pragma unroll
    for (int i = 0; i < kRowsPerThread; ++i) {
      const bool ok = a_rows[i] != nullptr && kk < kp;
      CpAsync16(a_s + Swz(row0 + kLoadRows * i, chunk), ok ? a_rows[i] + kk : any, ok);
    }
    uint32_t scale = 127;
    if constexpr (kMxfp4) {
      const int group = tid & 1;
      const int64_t k = kt * kBK + group * 32;
      const bool ok = b.codes != nullptr && k < kp;
      if (b.tiled) {
        // A k tile's words of a row lie in four 16-byte chunks (a decode lane's each) beside the
        // next k tile's (mxfp4_tiled.cuh): copying them apart took four times the sector requests
        // (K3's prefill 0.82x). So an even k tile brings its pair's 64 bytes a row in whole
        // chunks, chunks 2·group and 2·group + 1 by this thread, into pair buffer kt / 2 % 2 (in
        // use until the odd tile's decode, two iterations before the next load there); chunk c
        // at (c ^ (r / 2 % 4)) · 16, so the decode's loads of rows r .. r + 7 spread over the
        // banks. The odd tile's copies come with the even one's group. K % 128 == 0 (tiled
        // codes): the pair lies inside the weight when its first tile does.
        if (kt % 2 == 0) {
          const int r = tid >> 1;
          const bool in = b.codes != nullptr && kt * kBK < kp;
          uint8_t* const row = b_base + kt / 2 % 2 * kPairBytes + r * (2 * kBK / 2);
#pragma unroll
          for (int c = 2 * group; c < 2 * group + 2; ++c) {
            CpAsync16(SharedAddr(row + (c ^ (r >> 1 & 3)) * 16), in ? b.codes + Mxfp4TiledK(kt * kBK + 8 * c) : any, in);
          }
        }
      } else {
        CpAsync16(SharedAddr(b_base + slot * kRawBytes + (tid >> 1) * (kBK / 2) + group * 16), ok ? b.codes + k / 2 : any,
                  ok);
      }
      if (ok) scale = __ldg(b.scales + k / 32);
    } else {
      const uint32_t b_s = SharedAddr(b_base + slot * kTileBytes);
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        const bool ok = b.rows[i] != nullptr && kk < kp;
        CpAsync16(b_s + Swz(row0 + kLoadRows * i, chunk), ok ? b.rows[i] + kk : any, ok);
      }
    }
    return scale;
  };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < ktiles) scale_ring[s] = load(s);
    CpAsyncCommit();  // empty groups too, so the wait count below is the same every k tile
  }
  for (int64_t kt = 0; kt < ktiles; ++kt) {
    CpAsyncWait<kStages - 2>();  // k tile kt has landed (this thread's copies) ...
    __syncthreads();             // ... everyone's; and every warp is done with k tile kt − 1
    uint32_t next_scale = 127;
    if (kt + kStages - 1 < ktiles) next_scale = load(kt + kStages - 1);
    CpAsyncCommit();
    const int slot = static_cast<int>(kt % kStages);
    uint32_t b_s;
    if constexpr (kMxfp4) {
      const int r = tid >> 1, group = tid & 1;
      const float scale = E8M0ToFloat(scale_ring[0]);
      uint32_t words[4];
      if (b.tiled) {  // step c's word of scale group gg of the pair (load above)
        const uint8_t* row = b_base + kt / 2 % 2 * kPairBytes + r * (2 * kBK / 2);
        const int gg = 2 * static_cast<int>(kt % 2) + group;
#pragma unroll
        for (int c = 0; c < 4; ++c) words[c] = *reinterpret_cast<const uint32_t*>(row + (c ^ (r >> 1 & 3)) * 16 + 4 * gg);
      } else {
        const uint4 q = *reinterpret_cast<const uint4*>(b_base + slot * kRawBytes + r * (kBK / 2) + group * 16);
        words[0] = q.x, words[1] = q.y, words[2] = q.z, words[3] = q.w;
      }
#pragma unroll
      for (int wd = 0; wd < 4; ++wd) {
        *reinterpret_cast<uint4*>(b_dec + Swz(r, group * 4 + wd)) =
            b.tiled ? DecodeMxfp4TiledX8(words[wd], scale) : DecodeMxfp4x8(words[wd], scale);
      }
#pragma unroll
      for (int s = 0; s + 1 < kStages - 1; ++s) scale_ring[s] = scale_ring[s + 1];
      scale_ring[kStages - 2] = next_scale;
      __syncthreads();  // the decoded tile is whole
      b_s = SharedAddr(b_dec);
    } else {
      (void)next_scale;
      b_s = SharedAddr(b_base + slot * kTileBytes);
    }
    const uint32_t a_s = SharedAddr(a_base + slot * kTileBytes);
#pragma unroll
    for (int ks = 0; ks < kBK / 16; ++ks) {
      uint32_t af[4][4], bf[4][2];
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
        const int r = wm * 64 + mi * 16 + (lane & 15);
        LdMatrixX4(af[mi], a_s + Swz(r, ks * 2 + (lane >> 4)));
      }
#pragma unroll
      for (int p = 0; p < 2; ++p) {
        const int base = kGlu ? p * 64 + wn * 16 : wn * 32 + p * 16;
        const int r = base + ((lane >> 4) << 3) + (lane & 7);
        uint32_t q[4];
        LdMatrixX4(q, b_s + Swz(r, ks * 2 + ((lane >> 3) & 1)));
        bf[2 * p][0] = q[0];
        bf[2 * p][1] = q[1];
        bf[2 * p + 1][0] = q[2];
        bf[2 * p + 1][1] = q[3];
      }
#pragma unroll
      for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
        for (int ni = 0; ni < 4; ++ni) Mma(acc[mi][ni], af[mi], bf[ni][0], bf[ni][1]);  // ldmatrix_mma.cuh
      }
    }
  }
  CpAsyncWait<0>();  // nothing in flight when the block moves on (only empty groups remain)
}

// Where accumulator acc[mi][ni][f] of this thread sits in the 128 × 128 tile: row
// RowOf(mi, f), column ColOf(ni, f) (for kGlu: gate/up column ColOf(ni % 2, f) of 64).
__device__ __forceinline__ int TileRowOf(int mi, int f) {
  const int lane = threadIdx.x & 31, wm = (threadIdx.x >> 5) >> 2;
  return wm * 64 + mi * 16 + (lane >> 2) + (f >= 2 ? 8 : 0);
}
template <bool kGlu>
__device__ __forceinline__ int TileColOf(int ni, int f) {
  const int lane = threadIdx.x & 31, wn = (threadIdx.x >> 5) & 3;
  return (kGlu ? wn * 16 : wn * 32) + ni * 8 + 2 * (lane & 3) + (f & 1);
}

}  // namespace kimirt::cuda::tc
