// The decode-tiled layout of MXFP4 expert codes (kernels.h TileMxfp4Codes; docs/cuda.md "MXFP4
// codes tiled"), issue 13's default (KIMIRT_MXFP4_TILED=0: row-major).
//
// Row-major, an [n, k] expert weight's codes are k/2 bytes a row, element k in nibble k % 2 of
// byte k / 2 (bits 4e .. 4e+3 of a 32-bit word for its 8 elements e). The decode kernel's lane
// (g, t) of a warp's 16-row tile wants, for each 32-k step u of a 128-k round, the word of k =
// 32u + 8t .. +7 of its rows g and g + 8; row-major those come as 16-byte pieces of whole scale
// groups, exchanged through shared memory in the quad (~22 instructions a round), and a load
// instruction reads 8 rows × 64 bytes. Tiled:
//
// - tiles of 16 rows × 128 k (1 KB), k-fastest; inside a tile the 16-byte chunk of (half h =
//   row / 8, row g, t) at (h·8 + g)·64 + 16t, holding the words of steps u = 0..3 in order: a
//   lane's one 16-byte load is its round, a load instruction 512 contiguous bytes, a warp's
//   rounds one contiguous run;
// - inside a word, the 32 bits of its 8 codes permuted so that the decode places them in fewer
//   instructions (below). Scales stay row-major [n, k/32].
//
// Placement. The decode makes four BF16x2 A words from a word: A word j = (element j, element j
// + 4), each half sign at bit 15, E2M1 exponent at 8..7, mantissa at 6 (P = 0x81C081C0), which
// reads as E2M1 × 2^−126, then one BF16 multiply scales it (moe_kernels.cu). Row-major that is
// a shift, a second shift and two LOP3s a word (~4 instructions). Tiled, A word 0's bits are
// stored where they go (one LOP3), A words 1 and 2's rotated by 4 and 10 (a funnel shift and a
// LOP3 each), A word 3's in two rotations (two of each): 9 instructions for the four words
// instead of ~15. No permutation does all four with one rotation each (a search of the
// rotations and byte permutations: the sets P + d do not tile the 32 bits), so this is the
// fewest for this contract (docs/cuda.md, issue 13's analysis).
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define KIMIRT_MXFP4_TILED_FN __host__ __device__ __forceinline__
#else
#define KIMIRT_MXFP4_TILED_FN inline
#endif

namespace kimirt::cuda {

constexpr uint32_t kMxfp4PlacedMask = 0x81C081C0u;  // P: sign 15, exponent 8..7, mantissa 6 (and + 16)
constexpr uint32_t kMxfp4Word3Rot2 = 0x80C080C0u;   // A word 3's bits rotated by 2: P's 6, 7, 15 and + 16
constexpr uint32_t kMxfp4Word3Rot10 = 0x01000100u;  // A word 3's bits rotated by 10: P's 8 and 24

// Where bit p of P (p in 6, 7, 8, 15, 22, 23, 24, 31) of A word j is stored in a tiled word.
KIMIRT_MXFP4_TILED_FN int Mxfp4TiledBit(int j, int p) {
  if (j == 0) return p;
  if (j == 1) return (p + 4) % 32;
  if (j == 2) return (p + 10) % 32;
  return p % 16 == 8 ? (p + 22) % 32 : (p + 30) % 32;  // rotated left by 10 or by 2 to p
}

// Element e's code bit b (0 mantissa, 1 and 2 exponent, 3 sign) → its P bit in A word e % 4.
KIMIRT_MXFP4_TILED_FN int Mxfp4PlacedBit(int e, int b) { return (b == 3 ? 15 : 6 + b) + 16 * (e / 4); }

// A row-major word of 8 codes (element e in bits 4e..4e+3) in the tiled bit order (at load).
KIMIRT_MXFP4_TILED_FN uint32_t Mxfp4TileWord(uint32_t w) {
  uint32_t r = 0;
  for (int e = 0; e < 8; ++e) {
    for (int b = 0; b < 4; ++b) r |= ((w >> (4 * e + b)) & 1u) << Mxfp4TiledBit(e % 4, Mxfp4PlacedBit(e, b));
  }
  return r;
}

// Byte offset of the word holding codes (row, kk .. kk+7), kk % 8 == 0, of an [n, k] weight (n %
// 16 == 0, k % 128 == 0): a row part and a k part that add, so a kernel keeps a row base.
KIMIRT_MXFP4_TILED_FN int64_t Mxfp4TiledRow(int64_t row, int64_t k) {
  return row / 16 * (k / 128) * 1024 + row % 16 / 8 * 512 + row % 8 * 64;
}
KIMIRT_MXFP4_TILED_FN int64_t Mxfp4TiledK(int64_t kk) { return kk / 128 * 1024 + kk % 32 / 8 * 16 + kk % 128 / 32 * 4; }

// The four A words of a tiled word, placed (each half E2M1 × 2^−126 as BF16 bits, before the
// scale's multiply): as the row-major placement of the same codes (moe_kernels.cu PlaceX8).
// Rotations written as shifts: nvcc makes each one funnel shift.
KIMIRT_MXFP4_TILED_FN uint32_t Mxfp4RotateRight(uint32_t w, int n) { return (w >> n) | (w << (32 - n)); }
struct Mxfp4Placed {
  uint32_t a[4];
};
KIMIRT_MXFP4_TILED_FN Mxfp4Placed Mxfp4PlaceTiled(uint32_t w) {
  return {{w & kMxfp4PlacedMask, Mxfp4RotateRight(w, 4) & kMxfp4PlacedMask, Mxfp4RotateRight(w, 10) & kMxfp4PlacedMask,
           (Mxfp4RotateRight(w, 30) & kMxfp4Word3Rot2) | (Mxfp4RotateRight(w, 22) & kMxfp4Word3Rot10)}};
}

// A tiled word back in row-major order, read from where the placement puts each code (sign at
// 15, exponent and mantissa at 8..6 of its half of A word e % 4): the emulations check with it
// that the placement and the stored order agree (against Mxfp4TileWord and the row-major codes).
KIMIRT_MXFP4_TILED_FN uint32_t Mxfp4UntileWord(uint32_t w) {
  const Mxfp4Placed p = Mxfp4PlaceTiled(w);
  uint32_t r = 0;
  for (int e = 0; e < 8; ++e) {
    const uint32_t b = p.a[e % 4] >> (16 * (e / 4));
    r |= (((b >> 12) & 8u) | ((b >> 6) & 7u)) << (4 * e);
  }
  return r;
}

// Whether an [n, k] weight's codes can be tiled.
KIMIRT_MXFP4_TILED_FN bool Mxfp4Tileable(int64_t n, int64_t k) { return n > 0 && k > 0 && n % 16 == 0 && k % 128 == 0; }

}  // namespace kimirt::cuda
