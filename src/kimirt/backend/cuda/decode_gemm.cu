// Decode GEMM on tensor cores for BF16-held weights (kernels.h, docs/cuda.md "Decode GEMM"):
// y [m, n] = x [m, k] · w [n, k]ᵀ for 1 ≤ m ≤ kGemvMaxRows, every weight byte read once per call
// whatever m is, and each row's bits independent of the other rows (Backend::RowInvariantRows).
//
// Why tensor cores: at 64 rows the FP32 cores would need 2.4e12 weights/s × 2 × 64 ≈ 300 TFLOP/s
// to keep up with HBM, 4.5× what they have. mma.sync m16n8k16 BF16 → FP32 has the rate; to keep
// F32 accuracy the activation is split in three BF16 parts, x = x_hi + x_mid + x_lo (x_hi =
// bf16(x), x_mid = bf16(x − x_hi), x_lo = bf16(x − x_hi − x_mid): 3 × 8 = 24 mantissa bits, so
// x itself for every normal F32), and each weight tile is multiplied by all three. The weight is
// BF16 already, so every product is exact and the only error left is the F32 summation. (Two
// parts, 16 bits, ≤ 2⁻¹⁶ per element, were measured too coarse for the fixtures' F32 goldens.)
//
// Layout: the weight is the MMA's A operand (16 output columns × 16 k, row-major = w's own
// layout), the rows of x are its B operand (16 k × 8 rows), so rows pad to 8, 16, 32 or 64
// (kTiles = 1, 2, 4, 8 tiles of 8) and the padding is zeros. Each lane loads 16 bytes of a weight
// row (8 consecutive k) and the same 8 k of its x rows; the 32 k of a step are assigned to the two
// MMAs' k slots by the same permutation for A and B (Step below), so they multiply matching
// pairs. x is split once per call into scratch (SplitXKernel) for 4 and 8 tiles; for 1 and 2 the
// GEMM splits it in registers (LoadX + SplitX8), one launch fewer, with the same SplitOne.
// At 4 and 8 tiles (17-64 rows: 96 and 192 MMA columns a weight tile, where mma.sync left the GEMM
// bound by the tensor cores' issue, not HBM) the four warps issue the same MMAs as one warpgroup's
// wgmmas (WgmmaStep, WgmmaIssue: the same bits), x as their B operand, which a block copies a
// round at a time from scratch into shared memory (StageX, cp.async, double-buffered; read by
// every warp from global memory, x was once 4 × 24 KB of L2 traffic per 32 KB weight round at 32
// rows).
//
// Row invariance: a row is one column of the B tile; its accumulator sees the same MMAs in the
// same order (k slices ascending; per 32-k step the six MMAs of Step, then one F32 add) in every
// kTiles instantiation; the split of k across blocks (`splits`) and the order the
// splits are summed in depend on n and k only, never on m.
//
// Tiled weights (TileWeightForDecode, `w_tiled`; docs/cuda.md "Weights tiled for the decode
// GEMM"): row-major, a warp's load instruction reads 8 rows × 64 bytes and a round 32 rows × 256;
// tiled, the round's 8 KB lie in the order the lanes load them, so each instruction reads 512
// contiguous bytes and a round one 8 KB run. Only the addresses change: the same values reach
// the same MMAs.
//
// Groups (DecodeGemmGroup; docs/cuda.md "Grouped decode GEMMs"): several GEMMs of one m in one
// launch, each block running GemmBlock, this kernel's body, with its own problem's plan, and one
// launch of SumSplit for every split problem, so each output keeps its own DecodeGemm's bits.
#include <cuda_bf16.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>

#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/decode_tiled.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/mma_bf16.cuh"
#include "kimirt/backend/cuda/pdl.cuh"
#include "kimirt/backend/cuda/wave_splits.h"
#include "kimirt/backend/cuda/wgmma.cuh"

namespace kimirt::cuda {
namespace {

// The split of x, the MMA and its 32-k step (mma_bf16.cuh, shared with the decode MoE experts).
using mma::LoadStreaming;
using mma::PrefetchL2;
using mma::SplitOne;
using mma::Step;
using mma::XParts;

constexpr int kWarps = 4;
constexpr int kColTiles = 2;                              // 16-column MMA tiles per warp
constexpr int64_t kBlockCols = kWarps * kColTiles * 16;  // 128 output columns per block
static_assert(kColTiles * 16 == 32, "an L2 hint gives each lane one of its warp's columns");
constexpr int64_t kStepK = 32;                            // k per step: two m16n8k16 k-slots
constexpr int kUnroll = 4;                                // steps whose weight loads go out together
constexpr int64_t kSliceQuantum = kStepK * kUnroll;
// Split k across blocks until about four blocks (16 warps) per multiprocessor of an H200 (132)
// exist: a warp has 8 KB of weight loads in flight per round, and 4.8 TB/s × ~1.5 µs loaded
// latency ≈ 7 MB in flight needs ~900 warps; fewer, and a small weight (n = 576: 5 column
// blocks) is read one latency-bound round after another (run 1: a ~12 µs floor). Never into
// slices under kMinSliceK (2 rounds; the [splits, m, n] partials at m = 64 stay ≤ half the
// weight's bytes at n = 576, k = 7168). Then as few waves of blocks as that slice count allows
// (wave_splits.h). A constant, not the device's count, so a model's bits are the same on every GPU.
constexpr int64_t kTargetBlocks = 528;
constexpr int64_t kMinSliceK = 256;
constexpr int kParts = 3;  // x = hi + mid + lo
// Up to this many 8-row tiles the GEMM splits x itself: at 2 tiles the split's ~10 instructions
// per element and lane stay well under the weight's memory time (~450 issue cycles per 2 KB
// warp-step per scheduler at 4.8 TB/s); at 8 they would outgrow the MMAs, so SplitXKernel. Past
// it (4 and 8 tiles, 17-64 rows) x goes through shared memory and the MMAs are wgmmas
// (WgmmaStep, WgmmaIssue); up to it, mma.sync (mma::Step).
constexpr int kMaxTilesSplitInKernel = 2;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Plan {
  int tiles = 1;         // 8-row tiles: 1, 2, 4 or 8
  int64_t m_pad = 0;     // tiles · 8
  int64_t k_pad = 0;     // k rounded up to a step
  int64_t slice = 0;     // k per split, a multiple of kSliceQuantum
  int64_t splits = 1;    // from n and k only
  int64_t x_part = 0;    // BF16 elements of one part of x in scratch: m_pad · k rounded up to a round
  size_t x_bytes = 0;    // x_hi, x_mid, x_lo: x_part each (SplitXKernel; none ≤ 2 tiles)
  size_t part_bytes = 0; // partial sums [splits, m, n] F32 when splits > 1
};

Plan MakePlan(int64_t m, int64_t n, int64_t k) {
  Plan p;
  p.tiles = m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
  p.m_pad = p.tiles * int64_t{8};
  p.k_pad = CeilDiv(k, kStepK) * kStepK;
  const int64_t col_blocks = CeilDiv(n, kBlockCols);
  const int64_t max_splits = std::max<int64_t>(1, p.k_pad / kMinSliceK);
  const int64_t want = std::clamp<int64_t>(CeilDiv(kTargetBlocks, col_blocks), 1, max_splits);
  p.slice = CeilDiv(CeilDiv(p.k_pad, want), kSliceQuantum) * kSliceQuantum;
  p.splits = CeilDiv(p.k_pad, p.slice);
  if (WaveSplitsOn()) {
    p.slice = WaveSliceRounds(col_blocks, CeilDiv(p.k_pad, kSliceQuantum), p.splits, kTargetBlocks) * kSliceQuantum;
    p.splits = CeilDiv(p.k_pad, p.slice);
  }
  // Whole rounds of x, so a round's parts are copied whole (StageX) even where a slice ends mid-round.
  p.x_part = p.tiles <= kMaxTilesSplitInKernel ? 0 : p.m_pad * CeilDiv(k, kSliceQuantum) * kSliceQuantum;
  p.x_bytes = static_cast<size_t>(CeilDiv(kParts * p.x_part * static_cast<int64_t>(sizeof(uint16_t)), 256) * 256);
  p.part_bytes = p.splits > 1 ? static_cast<size_t>(p.splits * m * n) * sizeof(float) : 0;
  return p;
}

// x [m, k] F32 → x_hi, x_mid, x_lo, BF16, zero-padded to whole rounds of k (a round of a part is
// one contiguous run of N · 256 bytes, N = 8 · tiles rows, copied as is into shared memory), in
// the order the GEMM's wgmmas read them as their B operand: per round of 128 k, two
// 128-byte-swizzled K-major panels (wgmma.cuh) of 64 "slots" for each row. Slot L of a round is
// MMA k slot L % 16 of k16 step L / 16 = (step u, half h) and holds the element Step pairs with
// that slot: lane t's 8 consecutive k of a step go to slots 2t, 2t + 1 (words .x), 2t + 8, 2t + 9
// (.y) of half 0, and the same slots of half 1 (.z, .w).
// The tile count a template argument: every division below by a constant power of two (a
// 64-bit division by a run-time count made the call of a small GEMM, x's split included, a few
// µs slower).
template <int kTiles>
__global__ void SplitXKernel(const float* x, int64_t m, int64_t k, int64_t x_part, uint16_t* hi, uint16_t* mid,
                             uint16_t* lo) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  constexpr int64_t kRows = kTiles * 8;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < x_part; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t round = i / (kRows * 128), in_round = i % (kRows * 128);
    const int64_t panel = in_round / (kRows * 64), at = in_round % 64, r = in_round % (kRows * 64) / 64;
    const int64_t slot = panel * 64 + ((at / 8) ^ (r % 8)) * 8 + at % 8;  // the swizzle undone
    const int64_t u = slot / 32, h = slot % 32 / 16, q = slot % 16;
    const int64_t c = round * kSliceQuantum + u * kStepK + 8 * (q % 8 / 2) + q % 2 + 2 * (q / 8) + 4 * h;
    uint32_t hv, mv, lv;
    SplitOne(r < m && c < k ? x[r * k + c] : 0.0f, hv, mv, lv);
    hi[i] = static_cast<uint16_t>(hv);
    mid[i] = static_cast<uint16_t>(mv);
    lo[i] = static_cast<uint16_t>(lv);
  }
}

// x[row][kk .. kk+7] at p, all in range and 16-byte aligned (LoadX's aligned case; GemmBlock's full rounds).
__device__ __forceinline__ void LoadX8(const float* p, float (&v)[8]) {
  const float4 a = __ldg(reinterpret_cast<const float4*>(p));
  const float4 b = __ldg(reinterpret_cast<const float4*>(p + 4));
  v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

// For 1 and 2 tiles (m ≤ 16), with no SplitXKernel launch: x[row][kk .. kk+7] (zeros past m or
// k), read into registers (for 1 tile, the whole round's right after its weight loads) and split
// by SplitX8. `vec`: x rows
// 16-byte aligned and k % 8 == 0, so the 8 are all in or all out.
__device__ __forceinline__ void LoadX(const float* x, int64_t row, int64_t kk, int64_t m, int64_t k, bool vec,
                                      float (&v)[8]) {
  if (vec && row < m && kk < k) {
    LoadX8(x + row * k + kk, v);
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = row < m && kk + e < k ? __ldg(x + row * k + kk + e) : 0.0f;
  }
}

// 8 x values split by SplitOne and packed as SplitXKernel stores them.
__device__ __forceinline__ XParts SplitX8(const float (&v)[8]) {
  uint32_t h[8], md[8], l[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) SplitOne(v[e], h[e], md[e], l[e]);
  const auto pack = [](const uint32_t(&p)[8]) {
    return make_uint4(p[0] | p[1] << 16, p[2] | p[3] << 16, p[4] | p[5] << 16, p[6] | p[7] << 16);
  };
  return XParts{pack(h), pack(md), pack(l)};
}

// Where w[col][kk .. kk+7] (kk % 8 == 0) lies in the decode-tiled layout (decode_tiled.cuh).
KIMIRT_DECODE_TILED_FN int64_t DecodeTiledOffset(int64_t col, int64_t kk, int64_t k) {
  return DecodeTiledRow(col, k) + DecodeTiledK(kk);
}

// w[col][kk .. kk+7] as 8 BF16 (element i in bits 16·(i%2) of word i/2), zeros past n or k.
// kVec: rows are 16-byte aligned (k % 8 == 0, aligned base), so the 8 are all in or all out.
template <bool kVec>
__device__ __forceinline__ uint4 LoadW(const uint16_t* w, int64_t col, int64_t kk, int64_t n, int64_t k) {
  uint4 v = make_uint4(0, 0, 0, 0);
  if (col >= n || kk >= k) return v;
  const uint16_t* p = w + col * k + kk;
  if constexpr (kVec) {
    v = LoadStreaming(p);
  } else {
    uint32_t e[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = kk + i < k ? p[i] : 0u;
    v = make_uint4(e[0] | e[1] << 16, e[2] | e[3] << 16, e[4] | e[5] << 16, e[6] | e[7] << 16);
  }
  return v;
}

// Blocks per multiprocessor the registers must allow: 4 (≤ 128 registers) up to 16 rows, so the
// ~4 blocks per multiprocessor of kTargetBlocks are resident at once (1 tile wants 162 unbounded,
// for the round's x prefetch; bounded, the aligned variants spill 20-32 bytes, the grouped ones
// more: docs/cuda.md "Registers"). 32 and 64 rows need ~170 (their accumulators alone are 32 and
// 64): 2 blocks, as 3 (≤ 168) spills.
template <int kTiles>
constexpr int kMinBlocks = kTiles <= 2 ? 4 : 2;

// Above kMaxTilesSplitInKernel a round's x parts go through shared memory, copied once per
// block: kTiles · 8 rows × 128 k of each part (SplitXKernel's layout, one contiguous run of
// scratch a part), read by the block's wgmmas as their B operand. Two buffers: the next round's
// copy lands while this round's MMAs run; 1 KB more to align them (the swizzle is on address bits).
template <int kTiles>
constexpr int kXChunks = kUnroll * kTiles * 32;  // 16-byte chunks of one part in one round
template <int kTiles>
constexpr size_t kXSmemBytes =
    kTiles <= kMaxTilesSplitInKernel ? 0 : 2 * kParts * kXChunks<kTiles> * sizeof(uint4) + 1024;
static_assert(kXSmemBytes<4> == 49 * 1024 && kXSmemBytes<8> == 97 * 1024, "x buffers: 2 × 24 KB, 2 × 48 KB, + 1 KB");
// kMinBlocks of them an SM (an H200 SM has 228 KB of shared memory, 1 KB of it reserved a block).
static_assert(kMinBlocks<8> * (kXSmemBytes<8> + 1024) <= 228 * 1024, "8 tiles: 2 blocks an SM");

// The x parts of the round at kb (SplitXKernel's scratch) into buffer `dst` (kParts ×
// kXChunks of it), 16 bytes a copy. Whole rounds: scratch holds them, and steps past the slice's
// end are never read (GemmBlock skips them).
template <int kTiles>
__device__ __forceinline__ void StageX(uint4* dst, const uint16_t* x_hi, const uint16_t* x_mid, const uint16_t* x_lo,
                                       int64_t kb) {
  constexpr int kThreads = kWarps * 32;
  const int64_t first = kb / kSliceQuantum * (kXChunks<kTiles> * 8) + threadIdx.x * 8;  // this thread's first element
#pragma unroll
  for (int part = 0; part < kParts; ++part) {
    const auto* src = reinterpret_cast<const uint4*>((part == 0 ? x_hi : part == 1 ? x_mid : x_lo) + first);
    uint4* d = dst + part * kXChunks<kTiles> + threadIdx.x;
#pragma unroll
    for (int j = 0; j < kXChunks<kTiles> / kThreads; ++j) CpAsync16(d + j * kThreads, src + j * kThreads);
  }
}

// The wgmma operands of a step's MMAs: the B descriptor of x part `part`, step u, k16 half h in
// the x buffer at xs_addr (SplitXKernel's layout: per part two panels of kTiles · 8 rows), and
// column tile c's weight words as the A fragment of half h (mma::Step's .x/.y or .z/.w), the chain
// started (scale-d 0) by its first MMA.
template <int kTiles>
__device__ __forceinline__ uint64_t XDesc(uint32_t xs_addr, int part, int u, int h) {
  constexpr uint32_t kPanelBytes = kTiles * 8 * 128, kPartBytes = 2 * kPanelBytes;
  return wgmma::Desc128B(xs_addr + part * kPartBytes + u / 2 * kPanelBytes + (2 * (u % 2) + h) * 32, 16, 1024);
}
__device__ __forceinline__ void WeightFragment(const uint4 (&w)[2], int h, unsigned (&a)[4]) {
  a[0] = h == 0 ? w[0].x : w[0].z;
  a[1] = h == 0 ? w[1].x : w[1].z;
  a[2] = h == 0 ? w[0].y : w[0].w;
  a[3] = h == 0 ? w[1].y : w[1].w;
}
__device__ __forceinline__ int ScaleD(int part, int h) { return part == kParts - 1 && h == 0 ? 0 : 1; }
// acc[r][i] += d[4r + i]: one M tile's D added (after its wait) into its column tile's sums.
template <int kTiles>
__device__ __forceinline__ void AddD(float (&acc)[kTiles][4], float (&d)[4 * kTiles]) {
  wgmma::FenceRegs(d);
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[r][i] += d[4 * r + i];
  }
}

// Step u of a round at 8 tiles on wgmma: the warpgroup (the block's four warps) multiplies
// its 128 weight columns (two M tiles of 64: warp w's column tile c is rows 16w .. 16w + 15 of M
// tile c, A from the same registers mma::Step takes) by the round's x parts in shared memory
// (B, N = 8 · kTiles rows of x). Per M tile the six MMAs of mma::Step in Step's order — lo, mid,
// hi, each k16 half .x/.y then .z/.w, chained from zero — then one F32 add into acc: the sums of
// the mma.sync kernel, which Hopper's wgmma rounds the same way (CudaBackendTest.DecodeGemmRows-
// AreBitIdenticalToAlone holds 17-64 rows to 1 row's bits). D of M tile c is column tile c's
// mma.sync D for every 8-row tile r at d[4r .. 4r + 3]. mma.sync ran 64 rows at ~0.3 of the
// tensor cores' rate (the lm_head: 0.32 of 4.8 TB/s on an H200); on an H100 in one run
// (bench/results/2026-12-06-h100-decode-gemm-wgmma-ab.json) wgmma takes the 48B's lm_head at 64
// rows from 508 to 363 µs and the other shapes 1.02-1.40x. 4 tiles: WgmmaIssue below.
// `d`: one M tile's D, the caller's (one array for every step, so the compiler cannot give the
// steps' chains registers of their own: with a fresh, zeroed D a step, the 8-tile kernel spilled
// ~1.2 KB inside its loop). A chain starts with scale-d 0 (D = A·B), which is Step's MMA from
// zero: its sum of products plus +0, the same value unless that is −0, and −0 added to acc (which
// starts at +0) leaves what +0 leaves. M tiles one after the other.
template <int kTiles>
__device__ __forceinline__ void WgmmaStep(float (&acc)[kColTiles][kTiles][4], const uint4 (&w)[kColTiles][2],
                                          uint32_t xs_addr, int u, float (&d)[4 * kTiles]) {
  static_assert(kTiles == 8, "N = 64: m64n64k16");
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
    wgmma::FenceRegs(d);
    wgmma::Fence();
#pragma unroll
    for (int part = kParts - 1; part >= 0; --part) {  // lo, mid, hi: Step's order
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        unsigned a[4];
        WeightFragment(w[c], h, a);
        wgmma::WgmmaRS_m64n64k16<0>(d, a, XDesc<kTiles>(xs_addr, part, u, h), ScaleD(part, h));
      }
    }
    wgmma::Commit();
    wgmma::Wait<0>();
    AddD<kTiles>(acc[c], d);
  }
}

// At 4 tiles (N = 32) the steps are pipelined instead: step u's MMAs for both M tiles go out as
// one commit group into D buffer u % 2 (WgmmaIssue), and step u − 1's are waited for and added
// (WgmmaRetire) while they run; the adds stay in step order, so the sums are WgmmaStep's. Run
// one after the other, the chains' waits cost the small GEMMs' short slices up to 1.7x.
template <int kTiles>
__device__ __forceinline__ void WgmmaIssue(float (&d)[kColTiles][4 * kTiles], const uint4 (&w)[kColTiles][2],
                                           uint32_t xs_addr, int u) {
  static_assert(kTiles == 4, "N = 32: m64n32k16");
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) wgmma::FenceRegs(d[c]);
  wgmma::Fence();
#pragma unroll
  for (int part = kParts - 1; part >= 0; --part) {  // lo, mid, hi: Step's order
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < kColTiles; ++c) {
        unsigned a[4];
        WeightFragment(w[c], h, a);
        wgmma::WgmmaRS_m64n32k16<0>(d[c], a, XDesc<kTiles>(xs_addr, part, u, h), ScaleD(part, h));
      }
    }
  }
  wgmma::Commit();
}
template <int kTiles>
__device__ __forceinline__ void WgmmaRetire(float (&acc)[kColTiles][kTiles][4], float (&d)[kColTiles][4 * kTiles]) {
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) AddD<kTiles>(acc[c], d[c]);
}

// One block's work, the same in DecodeGemmKernel (one GEMM) and DecodeGemmGroupKernel (a group):
// 128 columns (column block `cb`) × k slice `split`; warp: 32 columns (two MMA tiles) × all
// kTiles row tiles. out: y when splits = 1, else the slice's [m, n] partial.
template <int kTiles, bool kVec>
__device__ __forceinline__ void GemmBlock(const uint16_t* __restrict__ w, const float* __restrict__ x, bool x_vec,
                                          const uint16_t* __restrict__ x_hi, const uint16_t* __restrict__ x_mid,
                                          const uint16_t* __restrict__ x_lo, float* __restrict__ out, int64_t m,
                                          int64_t n, int64_t k, int64_t k_pad, int64_t slice, int64_t cb,
                                          int64_t split, int hint_ahead, bool w_tiled) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t col0 = cb * kBlockCols + warp * (kColTiles * 16);
  // A tiled weight has 16-byte rows (CheckTiled), so only the kVec kernels read one.
  const bool tiled = kVec && w_tiled;
  const int64_t k_begin = split * slice;
  const int64_t k_end = k_begin + slice < k_pad ? k_begin + slice : k_pad;
  out += split * m * n;

  // L2 hints `hint_ahead` rounds ahead of the weight loads: at 33-64 rows only (HintAhead, with
  // the measurements). Each round asked into L2 two rounds ahead was worth it when first
  // measured (run 1: 0.54–0.67 of HBM without at m = 1); with the launches overlapped (pdl.cuh)
  // and every multiprocessor busy it costs more than it gives up to 32 rows, as the expert
  // kernels' did (moe_kernels.cu). The round at kb of lane i's column (col0 + i, 256 bytes,
  // one cp.async.bulk.prefetch). Aligned rows only (the prefetch wants 16-byte addresses and
  // sizes).
  const int64_t k_real_end = k_end < k ? k_end : k;
  auto prefetch_round = [&](int64_t kb) {
    const int64_t col = col0 + lane;
    if (kVec && kb < k_real_end && col < n) {
      const int64_t len = k_real_end - kb < kSliceQuantum ? k_real_end - kb : kSliceQuantum;
      PrefetchL2(w + (tiled ? DecodeTiledRow(col0, k) + DecodeTiledK(kb) + lane * 128 : col * k + kb),
                 static_cast<uint32_t>(len * sizeof(uint16_t)));
    }
  };
  for (int i = 0; i < hint_ahead; ++i) prefetch_round(k_begin + i * kSliceQuantum);
  PdlWait();
  PdlTrigger();

  // 4 and 8 tiles: x through shared memory (kXSmemBytes), round i's parts in buffer i % 2. The
  // first round's copy now (x is SplitXKernel's output: after PdlWait).
  [[maybe_unused]] uint4 *xs = nullptr, *xs_next = nullptr;  // this round's buffer, the other
  if constexpr (kTiles > kMaxTilesSplitInKernel) {
    extern __shared__ __align__(16) uint4 x_smem[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(x_smem));
    xs = x_smem + ((raw + 1023u) / 1024u * 1024u - raw) / sizeof(uint4);  // 1 KB-aligned (kXSmemBytes' slack)
    xs_next = xs + kParts * kXChunks<kTiles>;
    StageX<kTiles>(xs, x_hi, x_mid, x_lo, k_begin);
    CpAsyncCommit();
  }

  [[maybe_unused]] float d_step[kTiles == 8 ? 4 * kTiles : 1];                           // WgmmaStep's D
  [[maybe_unused]] float d_pipe[kTiles == 4 ? 2 : 1][kColTiles][kTiles == 4 ? 4 * kTiles : 1];  // WgmmaIssue's
  float acc[kColTiles][kTiles][4];
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][r][i] = 0.0f;
    }
  }

  // A round of 128 k at kb. kFull: all of it inside the slice and inside k, every column of the
  // warp inside n, aligned weight and x rows — then the weight and x are read through pointers
  // set once and advanced a round at a time, with none of LoadW's and LoadX's bounds checks: the
  // same loads of the same values, so the same bits. (Nsight Compute, a KDA projection group at
  // 1 row: issue 48% busy, DRAM 33%; ~58% of the loop's SASS was integer and address work, most
  // of it these checks and 64-bit addresses.) The full rounds get their own loop so that the
  // checked one's registers do not add to theirs. An x row past m reads row m − 1 instead: an
  // MMA output's column depends on its own B column alone, and those outputs are never stored.
  // On wgmma the whole block (one warpgroup) takes one path: all its columns in n.
  const bool fast = kVec && (kTiles > kMaxTilesSplitInKernel ? (cb + 1) * kBlockCols <= n
                                                             : col0 + kColTiles * 16 <= n && x_vec);
  // Row-major: lane (g, t) starts at row col0 + g, k + 8t; load (u, c, h) is (2c + h)·8 rows and
  // u steps on. Tiled: the lane's chunk of the round's tile; load (u, c, h) is chunk row
  // (u·2 + c)·2 + h of it (DecodeTiledOffset; col0 is a multiple of 32, so the warp's loads are
  // one tile's chunks, fast or not), and a round is the next tile. The full rounds of each layout
  // get their own loop (kTiledFull below), so the tiled loads' offsets are constants and the
  // row-major ones' as before tiling: with the layout's strides chosen at run time the 1- and
  // 2-tile kernels spilled 300-530 bytes, some inside the loop (ptxas -v).
  const uint16_t* w_lane = tiled ? w + DecodeTiledOffset(col0, k_begin, k) + lane * 8
                          : fast  ? w + (col0 + g) * k + k_begin + 8 * t
                                  : w;
  [[maybe_unused]] const float* x_lane[kTiles <= kMaxTilesSplitInKernel ? kTiles : 1];
  if constexpr (kTiles <= kMaxTilesSplitInKernel) {
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
      const int64_t row = r * 8 + g;
      x_lane[r] = x + (row < m ? row : m - 1) * k + k_begin + 8 * t;
    }
  }
  // kWhole: all four steps of the round inside the slice (every full round; a checked one too
  // when only the columns need checks, as in a block partly past n), so the 4-tile wgmmas' waits
  // are fixed at compile time.
  auto round = [&](int64_t kb, auto full, auto tiled_full, auto whole) {
    constexpr bool kFull = decltype(full)::value, kTiledFull = decltype(tiled_full)::value;
    constexpr bool kWhole = kFull || decltype(whole)::value;
    // Elements from load (u, c, h) to (u, c, h + 1) and to (u + 1, c, h), full rounds only.
    [[maybe_unused]] const int64_t w_ch = kTiledFull ? 256 : 8 * k;
    constexpr int64_t w_u = kTiledFull ? 1024 : kStepK;
    if (hint_ahead > 0) prefetch_round(kb + hint_ahead * kSliceQuantum);
    // All of this round's weight loads first, so kUnroll · kColTiles · 2 are in flight per lane.
    uint4 wr[kUnroll][kColTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = kb + u * kStepK + 8 * t;
#pragma unroll
      for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          if constexpr (kFull) {
            wr[u][c][h] = LoadStreaming(w_lane + (2 * c + h) * w_ch + u * w_u);
          } else {
            const int64_t col = col0 + c * 16 + h * 8 + g;
            if (kb + u * kStepK >= k_end) {
              wr[u][c][h] = make_uint4(0, 0, 0, 0);
            } else if (tiled) {  // whole tiles: in n and k unless the warp is past n
              wr[u][c][h] = col < n && kk < k ? LoadStreaming(w_lane + (2 * c + h) * 256 + u * 1024)
                                              : make_uint4(0, 0, 0, 0);
            } else {
              wr[u][c][h] = LoadW<kVec>(w, col, kk, n, k);
            }
          }
        }
      }
    }
    // 1 tile: the round's x (8 floats per step) loaded next, so its latency overlaps the weight's
    // instead of following each step's MMAs.
    [[maybe_unused]] float xr[kTiles == 1 ? kUnroll : 1][8];
    if constexpr (kTiles == 1) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        if constexpr (kFull) {
          LoadX8(x_lane[0] + u * kStepK, xr[u]);
        } else {
          LoadX(x, g, kb + u * kStepK + 8 * t, m, k, x_vec, xr[u]);
        }
      }
    }
    // 4 and 8 tiles, with this round's weight loads in flight: wait for this round's x (this
    // thread's copies, then everyone's: the barrier), which also says every warp is done with
    // the other buffer (last round's MMAs), so the next round's copy goes there now and lands
    // while this round's MMAs run.
    if constexpr (kTiles > kMaxTilesSplitInKernel) {
      CpAsyncWait<0>();
      wgmma::FenceProxyAsync();  // the copies → the wgmmas' reads (async proxy)
      __syncthreads();
      if (kb + kSliceQuantum < k_end) {
        StageX<kTiles>(xs_next, x_hi, x_mid, x_lo, kb + kSliceQuantum);
        CpAsyncCommit();
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (!kWhole && kb + u * kStepK >= k_end) break;  // a step past the slice: skipped, the same for every m
      if constexpr (kTiles == 8) {
        WgmmaStep<kTiles>(acc, wr[u], static_cast<uint32_t>(__cvta_generic_to_shared(xs)), u, d_step);
      } else if constexpr (kTiles == 4) {
        WgmmaIssue<kTiles>(d_pipe[u % 2], wr[u], static_cast<uint32_t>(__cvta_generic_to_shared(xs)), u);
        if constexpr (kWhole) {  // where each wait is fixed at compile time (else ptxas serializes them all)
          if (u > 0) {
            wgmma::Wait<1>();  // step u − 1's group
            WgmmaRetire<kTiles>(acc, d_pipe[(u + 1) % 2]);
          }
          if (u == kUnroll - 1) {
            wgmma::Wait<0>();
            WgmmaRetire<kTiles>(acc, d_pipe[u % 2]);
          }
        } else {  // a round the slice or k cuts: each step waited for
          wgmma::Wait<0>();
          WgmmaRetire<kTiles>(acc, d_pipe[u % 2]);
        }
      } else {
#pragma unroll
        for (int r = 0; r < kTiles; ++r) {
          XParts xp;
          if constexpr (kTiles == 1) {
            xp = SplitX8(xr[u]);
          } else {
            float v[8];
            if constexpr (kFull) {
              LoadX8(x_lane[r] + u * kStepK, v);
            } else {
              LoadX(x, r * 8 + g, kb + u * kStepK + 8 * t, m, k, x_vec, v);
            }
            xp = SplitX8(v);
          }
#pragma unroll
          for (int c = 0; c < kColTiles; ++c) Step(acc[c][r], wr[u][c][0], wr[u][c][1], xp);
        }
      }
    }
    if constexpr (kTiles > kMaxTilesSplitInKernel) {
      uint4* const done = xs;
      xs = xs_next;
      xs_next = done;
    }
  };
  const int64_t in_k = (k_end < k ? k_end : k) - k_begin;
  const int64_t full_end = fast && in_k > 0 ? k_begin + in_k / kSliceQuantum * kSliceQuantum : k_begin;
  int64_t kb = k_begin;
  auto full_rounds = [&](auto tiled_full) {
    constexpr int64_t w_round = decltype(tiled_full)::value ? 4096 : kSliceQuantum;
    for (; kb < full_end; kb += kSliceQuantum) {
      round(kb, std::true_type{}, tiled_full, std::true_type{});
      w_lane += w_round;
      if constexpr (kTiles <= kMaxTilesSplitInKernel) {
#pragma unroll
        for (int r = 0; r < kTiles; ++r) x_lane[r] += kSliceQuantum;
      }
    }
  };
  if (tiled) {
    full_rounds(std::true_type{});
  } else {
    full_rounds(std::false_type{});
  }
  for (; kb < k_end; kb += kSliceQuantum) {
    if constexpr (kTiles == 4) {  // whole rounds apart: WgmmaIssue's pipeline
      if (kb + kSliceQuantum <= k_end) {
        round(kb, std::false_type{}, std::false_type{}, std::true_type{});
      } else {
        round(kb, std::false_type{}, std::false_type{}, std::false_type{});
      }
    } else {
      round(kb, std::false_type{}, std::false_type{}, std::false_type{});
    }
    if (tiled) w_lane += 4096;
  }

  // D fragment: regs 0, 1 are column g, rows 2t and 2t+1 of the tile; regs 2, 3 column g + 8.
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t row = r * 8 + 2 * t + (i & 1), col = col0 + c * 16 + g + (i >> 1) * 8;
        if (row < m && col < n) out[row * n + col] = acc[c][r][i];
      }
    }
  }
}

// y (or the partials) of one GEMM: block (column block blockIdx.x, split blockIdx.y).
template <int kTiles, bool kVec>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks<kTiles>)
    DecodeGemmKernel(const uint16_t* __restrict__ w, const float* __restrict__ x, bool x_vec,
                     const uint16_t* __restrict__ x_hi, const uint16_t* __restrict__ x_mid,
                     const uint16_t* __restrict__ x_lo, float* __restrict__ out,
                     int64_t m, int64_t n, int64_t k, int64_t k_pad, int64_t slice, int hint_ahead, bool tiled) {
  GemmBlock<kTiles, kVec>(w, x, x_vec, x_hi, x_mid, x_lo, out, m, n, k, k_pad, slice, blockIdx.x, blockIdx.y,
                          hint_ahead, tiled);
}

// A group of GEMMs of one row count m (DecodeGemmGroup), one launch: problem i owns the blocks
// [begin, begin + col_blocks · splits) of the 1-D grid, in DecodeGemmKernel's order (column block
// fastest, then split), and each block does what that GEMM's block does alone (GemmBlock with
// the problem's own Plan), so every output has the bits of its own DecodeGemm.
constexpr int kMaxGroup = 8;
struct GroupGemm {
  const uint16_t* w;
  const float* x;
  const uint16_t* x_hi;  // x_mid, x_lo follow at x_part elements each (SplitXKernel); ≤ 2 tiles: none
  float* out;
  int64_t n, k, k_pad, slice, x_part;
  uint32_t begin, col_blocks;
  bool x_vec, tiled;
};
struct GroupGemmArgs {
  GroupGemm p[kMaxGroup];
  int count;
  int64_t m;
  int hint_ahead;
};

template <int kTiles, bool kVec>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks<kTiles>)
    DecodeGemmGroupKernel(const __grid_constant__ GroupGemmArgs a) {
  int i = 0;
  for (int j = 1; j < a.count; ++j) i = blockIdx.x >= a.p[j].begin ? j : i;
  const GroupGemm& p = a.p[i];
  const uint32_t local = blockIdx.x - p.begin;
  GemmBlock<kTiles, kVec>(p.w, p.x, p.x_vec, p.x_hi, p.x_hi + p.x_part, p.x_hi + 2 * p.x_part, p.out, a.m, p.n,
                          p.k, p.k_pad, p.slice, local % p.col_blocks, local / p.col_blocks, a.hint_ahead, p.tiled);
}

// y = Σ_s part[s], s ascending: the same order for every element and every m. The loads go out
// kSumBatch at a time ahead of their adds (up to 28 slices: a serial load-add chain would cost
// one L2 latency per slice).
constexpr int64_t kSumBatch = 8;
__device__ __forceinline__ void SumSplit(const float* __restrict__ part, int64_t splits, int64_t mn, int64_t i,
                                         float* __restrict__ y) {
  float s = part[i];
  for (int64_t j0 = 1; j0 < splits; j0 += kSumBatch) {
    float v[kSumBatch];
#pragma unroll
    for (int64_t b = 0; b < kSumBatch; ++b) v[b] = j0 + b < splits ? part[(j0 + b) * mn + i] : 0.0f;
#pragma unroll
    for (int64_t b = 0; b < kSumBatch; ++b) {
      if (j0 + b < splits) s += v[b];
    }
  }
  y[i] = s;
}

__global__ void SumSplitsKernel(const float* __restrict__ part, int64_t splits, int64_t mn, float* __restrict__ y) {
  PdlWait();
  PdlTrigger();
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < mn; i += int64_t{gridDim.x} * blockDim.x) {
    SumSplit(part, splits, mn, i, y);
  }
}

// The split sums of a group's split problems in one launch: problem i's elements are
// [begin, begin + mn) of the index space, each summed by SumSplit as SumSplitsKernel sums it.
struct GroupSum {
  const float* part;
  float* y;
  int64_t splits, mn, begin;
};
struct GroupSumArgs {
  GroupSum p[kMaxGroup];
  int count;
  int64_t total;
};

__global__ void SumSplitsGroupKernel(const __grid_constant__ GroupSumArgs a) {
  PdlWait();
  PdlTrigger();
  for (int64_t e = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; e < a.total; e += int64_t{gridDim.x} * blockDim.x) {
    int i = 0;
    for (int j = 1; j < a.count; ++j) i = e >= a.p[j].begin ? j : i;
    const GroupSum& p = a.p[i];
    SumSplit(p.part, p.splits, p.mn, e - p.begin, p.y);
  }
}

// Lets `kernel` take kXSmemBytes<kTiles> of dynamic shared memory (96 KB at 8 tiles: over the
// 48 KB default) with all of the SM's L1/shared memory as shared (2 blocks × (96 + 1) KB; the
// weight loads do not allocate in L1 and x no longer goes through it), once per device (the
// attributes are per device; `configured`: one bit a device id, ids ≥ 64 set them every call).
template <int kTiles, class Kernel>
void AllowXSmem(Kernel kernel, std::atomic<uint64_t>& configured) {
  if constexpr (kXSmemBytes<kTiles> > 0) AllowDynamicSmem(kernel, kXSmemBytes<kTiles>, true, "DecodeGemm", &configured);
}

// L2 hints, rounds ahead (GemmBlock), for `tiles` 8-row tiles: two at 8 tiles (33-64 rows),
// none below, unless KIMIRT_DECODE_GEMM_L2_HINT=n asks for n everywhere (a knob for measuring;
// the bits do not depend on it). One run (2026-12-03): decode_gemm_bench's shapes took 1.34 /
// 1.37 / 2.56 / 3.79 ms at 1 / 8 / 32 / 64 rows without, 1.63 / 1.67 / 2.91 / 3.77 with two
// rounds ahead; in the model the small GEMMs of 64 rows decide it (the whole 48B at batch 64:
// 30.0 ms a step without, 28.5 with; batch 1: 3.32 without, 3.39 with).
int HintAhead(int tiles) {
  static const int forced = [] {
    const char* v = std::getenv("KIMIRT_DECODE_GEMM_L2_HINT");
    return v == nullptr ? -1 : std::clamp(std::atoi(v), 0, 4);
  }();
  return forced >= 0 ? forced : tiles >= 8 ? 2 : 0;
}

template <int kTiles>
void Launch(bool vec, dim3 grid, const uint16_t* w, const float* x, bool x_vec, const uint16_t* hi,
            const uint16_t* mid, const uint16_t* lo, float* out, int64_t m, int64_t n, int64_t k, const Plan& p,
            bool tiled, cudaStream_t s) {
  static std::atomic<uint64_t> configured[2];
  const auto kernel = vec ? DecodeGemmKernel<kTiles, true> : DecodeGemmKernel<kTiles, false>;
  AllowXSmem<kTiles>(kernel, configured[vec]);
  LaunchPdl("DecodeGemm", kernel, grid, dim3(kWarps * 32), kXSmemBytes<kTiles>, s, w, x, x_vec, hi, mid, lo, out, m,
            n, k, p.k_pad, p.slice, HintAhead(kTiles), tiled);
}

template <int kTiles>
void LaunchGroup(bool vec, const GroupGemmArgs& a, unsigned blocks, cudaStream_t s) {
  static std::atomic<uint64_t> configured[2];
  const auto kernel = vec ? DecodeGemmGroupKernel<kTiles, true> : DecodeGemmGroupKernel<kTiles, false>;
  AllowXSmem<kTiles>(kernel, configured[vec]);
  LaunchPdl("DecodeGemm group", kernel, dim3(blocks), dim3(kWarps * 32), kXSmemBytes<kTiles>, s, a);
}

unsigned GridFor(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(CeilDiv(n, 256), 65536)); }

void CheckShape(int64_t m, int64_t k) {
  if (m > kGemvMaxRows || m < 1 || k <= 0) {
    std::fprintf(stderr, "kimirt: DecodeGemm takes 1..%lld rows and k > 0, got m=%lld k=%lld\n",
                 static_cast<long long>(kGemvMaxRows), static_cast<long long>(m), static_cast<long long>(k));
    std::abort();
  }
}

// A tiled weight (TileWeightForDecode) is whole tiles, 16-byte aligned.
void CheckTiled(bool tiled, const void* w, int64_t n, int64_t k) {
  if (tiled && (!DecodeGemmTileable(n, k) || reinterpret_cast<uintptr_t>(w) % 16 != 0)) {
    std::fprintf(stderr, "kimirt: DecodeGemm: a tiled weight needs n %% 32 == 0, k %% 128 == 0 and a 16-byte "
                         "aligned base, got n=%lld k=%lld\n", static_cast<long long>(n), static_cast<long long>(k));
    std::abort();
  }
}

// dst's 16-byte chunk i ← the chunk of src that DecodeTiledOffset puts there.
__global__ void TileWeightKernel(const uint4* __restrict__ src, uint4* __restrict__ dst, int64_t n, int64_t k) {
  const int64_t chunks = n * k / 8, k_tiles = k / 128;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < chunks; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t tile = i / 512, q = i % 512 / 32, lane = i % 32;
    const int64_t col = tile / k_tiles * 32 + q % 4 / 2 * 16 + q % 2 * 8 + lane / 4;
    const int64_t kk = tile % k_tiles * 128 + q / 4 * 32 + lane % 4 * 8;
    dst[i] = src[(col * k + kk) / 8];
  }
}

// For 4 and 8 tiles: x's three parts into `parts` (Plan::x_bytes of it), SplitXKernel's layout;
// up to 2 tiles the GEMM splits x itself (LoadX + SplitX8) and this launches nothing.
void SplitX(const float* x, int64_t m, int64_t k, const Plan& p, void* parts, cudaStream_t s) {
  if (p.tiles <= kMaxTilesSplitInKernel) return;
  uint16_t* hi = static_cast<uint16_t*>(parts);
  LaunchPdl("DecodeGemm split x", p.tiles == 4 ? SplitXKernel<4> : SplitXKernel<8>, dim3(GridFor(p.x_part)), dim3(256),
            0, s, x, m, k, p.x_part, hi, hi + p.x_part, hi + 2 * p.x_part);
  CheckLaunch("DecodeGemm split x");
}

// 16-byte loads: of the weight (kVec) and of x (x_vec) need k % 8 == 0 and an aligned base.
bool Vec(const void* base, int64_t k) { return k % 8 == 0 && reinterpret_cast<uintptr_t>(base) % 16 == 0; }

size_t Align256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Where a group's problems keep their scratch: per problem in order, x's parts (4 and 8 tiles;
// once per distinct x, which later problems of the same x share), then its partials (splits > 1),
// each region 256-byte aligned. Problems with n = 0 take none.
struct GroupLayout {
  std::vector<Plan> plan;
  std::vector<size_t> x_at, part_at;
  std::vector<bool> splits_x;  // this problem's x is split here (its first problem)
  size_t bytes = 0;
};

GroupLayout LayoutOf(int64_t m, const DecodeGemmProblem* problems, int count) {
  GroupLayout l;
  for (int i = 0; i < count; ++i) {
    const DecodeGemmProblem& q = problems[i];
    CheckShape(m, q.k);
    const Plan p = MakePlan(m, q.n, q.k);
    l.plan.push_back(p);
    l.x_at.push_back(0);
    l.part_at.push_back(0);
    l.splits_x.push_back(false);
    if (q.n == 0 || p.x_bytes == 0) continue;
    int first = i;
    for (int j = 0; j < i && first == i; ++j) {
      if (problems[j].n != 0 && problems[j].x == q.x && problems[j].k == q.k) first = j;
    }
    if (first == i) {
      l.x_at[i] = l.bytes;
      l.splits_x[i] = true;
      l.bytes += p.x_bytes;  // a multiple of 256
    } else {
      l.x_at[i] = l.x_at[first];
    }
  }
  for (int i = 0; i < count; ++i) {
    if (problems[i].n == 0 || l.plan[i].part_bytes == 0) continue;
    l.part_at[i] = l.bytes;
    l.bytes += Align256(l.plan[i].part_bytes);
  }
  return l;
}

}  // namespace

size_t DecodeGemmScratchBytes(int64_t m, int64_t n, int64_t k) {
  const Plan p = MakePlan(m, n, k);
  return p.x_bytes + p.part_bytes;
}

int64_t DecodeGemmSplits(int64_t n, int64_t k) { return MakePlan(1, n, k).splits; }

bool DecodeGemmTileable(int64_t n, int64_t k) { return n > 0 && k > 0 && n % 32 == 0 && k % 128 == 0; }

void TileWeightForDecode(const void* w_bf16, void* tiled, int64_t n, int64_t k, cudaStream_t s) {
  CheckTiled(true, tiled, n, k);
  LaunchPdl("DecodeGemm tile weight", TileWeightKernel, dim3(GridFor(n * k / 8)), dim3(256), 0, s,
            static_cast<const uint4*>(w_bf16), static_cast<uint4*>(tiled), n, k);
  CheckLaunch("DecodeGemm tile weight");
}

void DecodeGemm(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                cudaStream_t s, bool w_tiled) {
  if (m == 0 || n == 0) return;
  CheckShape(m, k);
  CheckTiled(w_tiled, w_bf16, n, k);
  const Plan p = MakePlan(m, n, k);
  SplitX(x, m, k, p, scratch, s);
  uint16_t* hi = p.x_bytes ? static_cast<uint16_t*>(scratch) : nullptr;
  uint16_t* mid = p.x_bytes ? hi + p.x_part : nullptr;
  uint16_t* lo = p.x_bytes ? mid + p.x_part : nullptr;
  const auto* w = static_cast<const uint16_t*>(w_bf16);
  const bool vec = Vec(w, k), x_vec = Vec(x, k);
  float* out = p.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(scratch) + p.x_bytes) : y;
  const dim3 grid(static_cast<unsigned>(CeilDiv(n, kBlockCols)), static_cast<unsigned>(p.splits));
  switch (p.tiles) {
    case 1: Launch<1>(vec, grid, w, x, x_vec, hi, mid, lo, out, m, n, k, p, w_tiled, s); break;
    case 2: Launch<2>(vec, grid, w, x, x_vec, hi, mid, lo, out, m, n, k, p, w_tiled, s); break;
    case 4: Launch<4>(vec, grid, w, x, x_vec, hi, mid, lo, out, m, n, k, p, w_tiled, s); break;
    default: Launch<8>(vec, grid, w, x, x_vec, hi, mid, lo, out, m, n, k, p, w_tiled, s); break;
  }
  CheckLaunch("DecodeGemm");
  if (p.splits > 1) {
    LaunchPdl("DecodeGemm sum splits", SumSplitsKernel, dim3(GridFor(m * n)), dim3(256), 0, s,
              static_cast<const float*>(out), p.splits, m * n, y);
  }
}

size_t DecodeGemmGroupScratchBytes(int64_t m, const DecodeGemmProblem* problems, int count) {
  if (m == 0) return 0;
  return LayoutOf(m, problems, count).bytes;
}

void DecodeGemmGroup(int64_t m, const DecodeGemmProblem* problems, int count, void* scratch, cudaStream_t s) {
  if (m == 0) return;
  const GroupLayout l = LayoutOf(m, problems, count);
  char* base = static_cast<char*>(scratch);
  for (int i = 0; i < count; ++i) {
    if (l.splits_x[i]) SplitX(problems[i].x, m, problems[i].k, l.plan[i], base + l.x_at[i], s);
  }
  // The GEMMs: one launch per kMaxGroup problems of one weight alignment (kVec is the kernel's).
  const int tiles = MakePlan(m, 1, 1).tiles;
  for (const bool vec : {true, false}) {
    GroupGemmArgs a = {};
    a.m = m;
    a.hint_ahead = HintAhead(tiles);
    unsigned blocks = 0;
    auto flush = [&] {
      if (a.count == 0) return;
      switch (tiles) {
        case 1: LaunchGroup<1>(vec, a, blocks, s); break;
        case 2: LaunchGroup<2>(vec, a, blocks, s); break;
        case 4: LaunchGroup<4>(vec, a, blocks, s); break;
        default: LaunchGroup<8>(vec, a, blocks, s); break;
      }
      CheckLaunch("DecodeGemm group");
      a.count = 0;
      blocks = 0;
    };
    for (int i = 0; i < count; ++i) {
      const DecodeGemmProblem& q = problems[i];
      const Plan& p = l.plan[i];
      if (q.n == 0 || Vec(q.w, q.k) != vec) continue;
      GroupGemm& g = a.p[a.count++];
      g.w = static_cast<const uint16_t*>(q.w);
      g.x = q.x;
      g.x_vec = Vec(q.x, q.k);
      CheckTiled(q.w_tiled, q.w, q.n, q.k);
      g.tiled = q.w_tiled;
      g.x_hi = p.x_bytes ? reinterpret_cast<const uint16_t*>(base + l.x_at[i]) : nullptr;
      g.x_part = p.x_part;
      g.out = p.splits > 1 ? reinterpret_cast<float*>(base + l.part_at[i]) : q.y;
      g.n = q.n;
      g.k = q.k;
      g.k_pad = p.k_pad;
      g.slice = p.slice;
      g.begin = blocks;
      g.col_blocks = static_cast<uint32_t>(CeilDiv(q.n, kBlockCols));
      blocks += g.col_blocks * static_cast<uint32_t>(p.splits);
      if (a.count == kMaxGroup) flush();
    }
    flush();
  }
  // The split sums, each problem's in SumSplitsKernel's order.
  GroupSumArgs a = {};
  auto flush = [&] {
    if (a.count == 0) return;
    LaunchPdl("DecodeGemm group sum splits", SumSplitsGroupKernel, dim3(GridFor(a.total)), dim3(256), 0, s, a);
    a.count = 0;
    a.total = 0;
  };
  for (int i = 0; i < count; ++i) {
    if (problems[i].n == 0 || l.plan[i].splits == 1) continue;
    a.p[a.count++] = GroupSum{reinterpret_cast<const float*>(base + l.part_at[i]), problems[i].y, l.plan[i].splits,
                              m * problems[i].n, a.total};
    a.total += m * problems[i].n;
    if (a.count == kMaxGroup) flush();
  }
  flush();
}

}  // namespace kimirt::cuda
