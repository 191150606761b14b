// The paged MLA decode split on tensor cores (kernels.h MlaPagedDecode; spec §6.6; issue 12):
// for BF16 and FP8 latent caches at the models' widths (latent 512, rope 64). The CUDA-core
// split in mla_kernels.cu moved ~40 GB/s (0.01 of HBM) at 32 heads: each warp owned a head and
// reduced one dot product per position across its lanes. Here a block takes 16 heads (one MMA
// m-tile) of one split of one sequence, and per tile of 32 positions:
//
//   1. scores S = q̄ · [c ‖ k_s]ᵀ: the 36 k-steps (16 wide) are dealt to the 8 warps, each warp
//      holding its k-steps' query fragments in registers for the whole kernel (the query is read
//      from shared memory once), each producing a partial S over all 32 positions; the partials
//      are summed in warp order (a fixed order: the same bits whatever else runs).
//   2. online softmax in F32 (16 threads a head, fixed butterflies), P into shared memory.
//   3. ō += P · c: warp w owns latent dims 64w .. 64w + 63.
//
// Precision: the cache values are exact in BF16 (BF16 codes; FP8 E4M3 codes, their per-row
// scales applied in F32 outside the MMAs). q̄ and P are F32; each goes in as two BF16 parts,
// hi = bf16(v) and lo = bf16(v − hi), which hold 16 significant bits (|v − hi − lo| ≤ 2⁻¹⁷|v|);
// every product is exact and the MMAs accumulate in F32. Each k-step's two MMAs start from zero
// and are added to the running sum with an F32 add (the tensor cores' accumulation truncates;
// mma_bf16.cuh). Measured against the CUDA-core split and the CPU in
// CudaBackendTest.PagedDecode* (RelL2 ≤ 2e-5).
//
// Batch invariance: a block's inputs are its own sequence's rows and query; the split schedule
// is a function of the sequence's own context (MlaDecodeSplitLen), so a sequence's bits do not
// depend on the batch.
//
// Two variants (Ring4, Ring2 below; KIMIRT_MLA_DECODE_VARIANT) place values and form addresses
// differently and run the same sums in the same order: the same bits
// (CudaBackendTest.PagedDecodeRing2GivesRing4sBits; scripts/mla_decode_emulate.sh on the host).
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace kimirt::cuda {
namespace {

constexpr int kR = 512, kDr = 64, kW = kR + kDr;  // the models' MLA widths (spec §6)
constexpr int kHeads = 16;                         // heads a block: one m-tile
constexpr int kTile = 32;                          // positions a tile
constexpr int kWarps = 8, kThreads = kWarps * 32;
constexpr int kRowStride = kW + 8;  // BF16 elements: 1168 bytes, so ldmatrix's 8 rows hit 8 bank groups
constexpr int kLatSteps = kR / 16, kRopeSteps = kDr / 16;  // 32 + 4 k-steps of 16
constexpr int kLatPerWarp = kLatSteps / kWarps;            // 4; warps 0..3 also take one rope step
constexpr int kDimsPerWarp = kR / kWarps;                  // 64 latent dims of ō a warp
constexpr int kPStride = kTile + 8;                        // P rows: 80 bytes, conflict-free too
static_assert(kRopeSteps <= kWarps && kLatSteps % kWarps == 0, "k-steps dealt evenly");

// The variants (kernels.h MlaDecodeVariant): the same sums in the same order (so the same bits),
// different residency.
//
// ring4 (the first shape): tiles in flight: the rows of kStages - 1 tiles stream in by cp.async (no
// registers) while the block works on one. One block an SM (236 registers), so Little's law asks
// the SM alone for its share of HBM: ~36 GB/s × ~2 µs of loaded latency ≈ 72 KB, three BF16
// tiles. (With the next tile alone in registers the split ran at ~3 µs a tile, ~0.2 of HBM: one
// tile's latency.) Profiled latency-bound: 2 warps a scheduler, one issue every ~8 cycles.
struct Ring4 {
  static constexpr int kStages = 4, kSStride = kTile + 1;
  static constexpr bool kLean = false;
};
// ring2 (the default before mla_decode_wgmma.cu): two blocks an SM (4 warps a scheduler), to hide
// the latency ring4 cannot: ≤ 128 registers (__maxnreg__ below) and ≤ 113 KB of shared memory a
// block (228 KB an SM). A 2-stage ring (one tile in flight a block, two an SM); q̄'s rope
// fragments in shared memory, read per tile by warps 0..3 (8 registers); the score partials of
// one n-tile pair live at a time (8 registers, not 32: the rope k-step after the latent ones);
// the rows issued from a cursor without divisions (Tile::NextRow); the ldmatrix operands'
// shared-memory offsets computed once; partial scores stored and read as float2 (stride 40:
// conflict-free for both).
struct Ring2 {
  static constexpr int kStages = 2, kMinBlocks = 2, kSStride = kTile + 8;
  static constexpr bool kLean = true;
};

template <int kKind, class V>
struct Smem {
  static constexpr int kStages = V::kStages, kSStride = V::kSStride;
  // A stage holds one tile as it lies in the cache: BF16 rows already in the padded layout the
  // MMAs read (kind 1), or FP8 codes [kTile][kW] and the rows' two scales (kind 2), widened to
  // BF16 into `rows` before use. Kind 1 stages q̄'s hi and lo parts [2][kHeads][kRowStride] in
  // the last stage before the first tile (the same size); kind 2 in `rows`.
  static constexpr int kCodeBytes = kTile * kW;  // FP8 codes, then the scales
  static constexpr int kStageBytes = kKind == 1 ? kTile * kRowStride * 2 : kCodeBytes + kTile * 2 * 4;
  static_assert(kKind != 1 || kStageBytes == 2 * kHeads * kRowStride * 2, "q̄ staging fits a stage");
  alignas(16) unsigned char ring[kStages][kStageBytes];
  __nv_bfloat16 rows[kKind == 2 ? kTile : 1][kRowStride];
  // Ring2: q̄'s rope columns (hi, lo), read per tile by warps 0..3 instead of held (8 registers).
  alignas(16) __nv_bfloat16 q_rope[V::kLean ? 2 : 1][V::kLean ? kHeads : 1][kDr + 8];
  alignas(16) float s_lat[kWarps][kHeads][kSStride];     // each warp's partial scores, latent k-steps
  alignas(16) float s_rope[kRopeSteps][kHeads][kSStride];  // and rope k-steps (warps 0..3)
  __nv_bfloat16 p[2][kHeads][kPStride];     // P's hi and lo parts (the latent scale folded in)
  float scale_lat[kTile], scale_rope[kTile];
  float corr[kHeads];
};

// v = hi + lo + (|rest| ≤ 2⁻¹⁷|v|), both BF16; a non-finite hi gets lo = 0.
__device__ __forceinline__ void Split2(float v, __nv_bfloat16& hi, __nv_bfloat16& lo) {
  hi = __float2bfloat16_rn(v);
  const float h = __bfloat162float(hi);
  lo = __float2bfloat16_rn(isfinite(h) ? v - h : 0.0f);
}


// Two FP8 E4M3 codes (low byte first) as a BF16 pair: every E4M3 value is a BF16 value.
__device__ __forceinline__ unsigned Fp8x2ToBf16x2(unsigned short codes) {
  const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(codes), __NV_E4M3);
  const float2 f = __half22float2(__half2(h));
  return PackBf16(f.x, f.y);
}


// One tile's rows: kind 1 (BF16) 72 chunks of 16 bytes a row, kind 2 (FP8) 36. Eight threads a
// row (tid / 8; 32 rows × 8 = 256 threads), thread tid % 8 taking chunks tid % 8 + 8i: the row's
// place in the pool is worked out once a tile, in 32-bit math. Rows past the split's end are
// zero-filled (cp.async with source size 0), so P = 0 meets finite codes.
template <int kKind>
struct Tile {
  static constexpr int kRowBytes = kKind == 1 ? kW * 2 : kW;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kPerThread = (kChunksPerRow + 7) / 8;
  static_assert(kTile * 8 == kThreads, "eight threads a row");

  // This thread's row of the tile at t0: its block-table entry (−1 past the split's end s1).
  // Read a tile ahead of its Issue, so the table load's latency hides behind a tile's math.
  static __device__ int32_t BlockOf(const PagedDecodeArgs& a, const int32_t* table, int64_t t0, int64_t s1) {
    const int j = threadIdx.x / 8;
    return t0 + j < s1 ? table[(static_cast<int>(t0) + j) / a.block_size] : -1;  // positions fit int32
  }

  // Starts the copy of the tile at t0 (the rows of `block` = BlockOf(t0)) into `stage`.
  static __device__ void Issue(const PagedDecodeArgs& a, int32_t block, int64_t t0, unsigned char* stage) {
    const int j = threadIdx.x / 8, sub = threadIdx.x % 8;
    const bool valid = block >= 0;
    const int bs = a.block_size;
    const int64_t row = valid ? (int64_t{block} * a.layers + a.layer) * bs + (static_cast<int>(t0) + j) % bs : 0;
    const unsigned char* src = static_cast<const unsigned char*>(a.values) + row * kRowBytes;
    unsigned char* dst = stage + j * (kKind == 1 ? kRowStride * 2 : kW);
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = sub + 8 * i;
      if (e < kChunksPerRow) CpAsync16(dst + e * 16, valid ? src + e * 16 : a.values, valid);
    }
    if (kKind == 2 && sub == 0) {
      float* sc = reinterpret_cast<float*>(stage + kTile * kW) + 2 * j;
      CpAsync8(sc, valid ? a.scales + row * 2 : a.scales, valid);
    }
  }

  // Ring2's copies, with fewer instructions and registers (the profile counted ~190 integer
  // instructions a warp a tile; Issue and BlockOf above spend ~150 of them a thread on two
  // divisions by the block size and each chunk's 64-bit address). This thread's row of the tile
  // ahead is a (table index, offset in the block) cursor advanced 32 positions a tile without a
  // division, read into the row's index in the pool (int32: a pool of 2³¹ rows of ≥ 584 bytes
  // would not fit a GPU); a row's pool and stage addresses are formed once, its chunks at
  // constant offsets from them.
  struct Cursor {
    int index, offset;  // position (index − first) · block_size + offset of the table at a.tables[first]
    __device__ void Start(int first, int p, int bs) { index = first + p / bs, offset = p % bs; }
  };
  // The pool row of the cursor's position (−1 when not `valid`: past the split's end), then the
  // cursor a tile on.
  static __device__ int32_t NextRow(Cursor& c, const PagedDecodeArgs& a, bool valid) {
    const int bs = a.block_size;
    const int32_t row = valid ? a.tables[c.index] * (a.layers * bs) + (a.layer * bs + c.offset) : -1;
    c.offset += kTile;
    while (c.offset >= bs) c.offset -= bs, ++c.index;
    return row;
  }
  // Starts the copy of this thread's row (pool row `row`; row < 0: zeros, read from row 0, which
  // exists, with size 0) into `stage`.
  static __device__ void IssueRow(const PagedDecodeArgs& a, int32_t row, unsigned char* stage) {
    const int j = threadIdx.x / 8, sub = threadIdx.x % 8;
    const bool valid = row >= 0;
    const int64_t at = valid ? row : 0;
    const unsigned char* src = static_cast<const unsigned char*>(a.values) + at * kRowBytes + sub * 16;
    unsigned char* dst = stage + j * (kKind == 1 ? kRowStride * 2 : kW) + sub * 16;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      if (sub + 8 * i < kChunksPerRow) CpAsync16(dst + 128 * i, src + 128 * i, valid);
    }
    if (kKind == 2 && sub == 0) {
      float* sc = reinterpret_cast<float*>(stage + kTile * kW) + 2 * j;
      CpAsync8(sc, a.scales + at * 2, valid);
    }
  }

  // Kind 2: the stage's FP8 codes as BF16 rows and its scales, for the MMAs.
  template <class Sm>
  static __device__ void Widen(const unsigned char* stage, Sm& sm) {
    const int j = threadIdx.x / 8, sub = threadIdx.x % 8;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = sub + 8 * i;
      if (e >= kChunksPerRow) continue;
      const uint4 v = *reinterpret_cast<const uint4*>(stage + j * kW + e * 16);
      const unsigned w[4] = {v.x, v.y, v.z, v.w};
      uint4 lo, hi;
      lo.x = Fp8x2ToBf16x2(w[0] & 0xffff), lo.y = Fp8x2ToBf16x2(w[0] >> 16);
      lo.z = Fp8x2ToBf16x2(w[1] & 0xffff), lo.w = Fp8x2ToBf16x2(w[1] >> 16);
      hi.x = Fp8x2ToBf16x2(w[2] & 0xffff), hi.y = Fp8x2ToBf16x2(w[2] >> 16);
      hi.z = Fp8x2ToBf16x2(w[3] & 0xffff), hi.w = Fp8x2ToBf16x2(w[3] >> 16);
      *reinterpret_cast<uint4*>(&sm.rows[j][e * 16]) = lo;
      *reinterpret_cast<uint4*>(&sm.rows[j][e * 16 + 8]) = hi;
    }
    if (sub == 0) {
      const float* sc = reinterpret_cast<const float*>(stage + kTile * kW) + 2 * j;
      sm.scale_lat[j] = sc[0];
      sm.scale_rope[j] = sc[1];
    }
  }
};

// Block (work item = split [s0, s1) of sequence b, heads h0 .. h0 + 15). Writes the split's
// unnormalized ō [kR] and (max, sum) per head to part_o / part_ml, as the CUDA-core split does.
// V (Ring4, Ring2) changes where values live and how addresses are formed, never a sum's order.
template <int kKind, class V>
__device__ __forceinline__ void DecodeSplit(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml) {
  constexpr int kStages = V::kStages;
  using Sm = Smem<kKind, V>;
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Sm& sm = *reinterpret_cast<Sm*>(smem_raw);
  const int64_t work = blockIdx.x;
  if (work >= *a.work_count) return;  // the whole block: past this step's work list
  const int64_t b = a.work[3 * work], s0 = a.work[3 * work + 1], s1 = a.work[3 * work + 2];
  const int64_t h0 = int64_t{blockIdx.y} * kHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int32_t* table = a.tables + a.table_begin[b];

  // The first kStages - 1 tiles' copies go out before the query is staged (one commit group a
  // tile, empty ones past the end, so the wait count below is the same every tile).
  const int ntiles = static_cast<int>((s1 - s0 + kTile - 1) / kTile);
  // Ring2: this thread's row of the tiles ahead (positions fit int32, as in BlockOf).
  typename Tile<kKind>::Cursor cur;
  int tile_left = static_cast<int>(s1 - s0);  // positions from this tile to the split's end
  if constexpr (V::kLean) cur.Start(a.table_begin[b], static_cast<int>(s0) + tid / 8, a.block_size);
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if constexpr (V::kLean) {
      const int32_t row = Tile<kKind>::NextRow(cur, a, tid / 8 < tile_left - i * kTile);
      if (i < ntiles) Tile<kKind>::IssueRow(a, row, sm.ring[i]);
    } else {
      const int64_t t = s0 + int64_t{i} * kTile;
      if (i < ntiles) Tile<kKind>::Issue(a, Tile<kKind>::BlockOf(a, table, t, s1), t, sm.ring[i]);
    }
    CpAsyncCommit();
  }
  int32_t block_ahead;  // ring4: the block of this thread's row of the tile ahead; ring2: its pool row
  if constexpr (V::kLean) {
    block_ahead = Tile<kKind>::NextRow(cur, a, tid / 8 < tile_left - (kStages - 1) * kTile);
  } else {
    block_ahead = Tile<kKind>::BlockOf(a, table, s0 + int64_t{kStages - 1} * kTile, s1);
  }
  if (kKind == 1 && tid < kTile) sm.scale_lat[tid] = sm.scale_rope[tid] = 1.0f;  // BF16 rows have none
  void* const q_stage = kKind == 1 ? static_cast<void*>(sm.ring[kStages - 1]) : static_cast<void*>(&sm.rows[0][0]);

  // q̄ hi / lo into the staging buffer, then this warp's k-steps' A fragments into registers:
  // latent k-steps warp·4 .. warp·4 + 3, and rope k-step warp for warps 0..3.
  {
    __nv_bfloat16(*q)[kHeads][kRowStride] = reinterpret_cast<__nv_bfloat16(*)[kHeads][kRowStride]>(q_stage);
    // All of a thread's loads first, then the conversions (one round trip, not 36; ring2 two
    // of 18, within its 128 registers).
    constexpr int kPer = kHeads * kW / kThreads, kRounds = V::kLean ? 2 : 1, kPerRound = kPer / kRounds;
    static_assert(kHeads * kW % kThreads == 0 && kPer % kRounds == 0, "q̄ dealt evenly");
#pragma unroll
    for (int round = 0; round < kRounds; ++round) {
      float v[kPerRound];
#pragma unroll
      for (int k = 0; k < kPerRound; ++k) {
        const int i = tid + (round * kPerRound + k) * kThreads, hh = i / kW, e = i % kW;
        v[k] = h0 + hh < a.H ? qc[((b * a.H) + h0 + hh) * kW + e] : 0.0f;
      }
#pragma unroll
      for (int k = 0; k < kPerRound; ++k) {
        const int i = tid + (round * kPerRound + k) * kThreads, hh = i / kW, e = i % kW;
        Split2(v[k], q[0][hh][e], q[1][hh][e]);
      }
    }
  }
  __syncthreads();
  if constexpr (V::kLean) {  // ring2: the rope columns aside, 16 bytes a thread
    static_assert(2 * kHeads * kDr * 2 == kThreads * 16, "one 16-byte word a thread");
    const int part = tid / 128, hh = (tid / 8) % kHeads, c = (tid % 8) * 8;
    const __nv_bfloat16(*q)[kHeads][kRowStride] =
        reinterpret_cast<const __nv_bfloat16(*)[kHeads][kRowStride]>(q_stage);
    *reinterpret_cast<uint4*>(&sm.q_rope[part][hh][c]) = *reinterpret_cast<const uint4*>(&q[part][hh][kR + c]);
  }
  unsigned qa[2][kLatPerWarp + (V::kLean ? 0 : 1)][4];  // [hi/lo][k-step][fragment]
  {
    const __nv_bfloat16(*q)[kHeads][kRowStride] =
        reinterpret_cast<const __nv_bfloat16(*)[kHeads][kRowStride]>(q_stage);
    const int r = lane % 16, c8 = (lane / 16) * 8;
#pragma unroll
    for (int part = 0; part < 2; ++part) {
#pragma unroll
      for (int k = 0; k < kLatPerWarp; ++k) Ldmatrix4(qa[part][k], &q[part][r][(warp * kLatPerWarp + k) * 16 + c8]);
      if constexpr (!V::kLean) {
        if (warp < kRopeSteps) Ldmatrix4(qa[part][kLatPerWarp], &q[part][r][kR + warp * 16 + c8]);
      }
    }
  }
  // (The barrier at the top of the first tile also frees the staging buffer.)

  // Ring2: each lane's byte offsets into a tile's rows (and P) for its ldmatrix operands, once:
  // the score B operand (n-tile pair np, k-step k: + np·16 rows + k·32 bytes; the rope k-step at
  // a constant of the warp's from it), the ō B operand (k-step k, n-tile pair np: + k·16 rows +
  // np·32 bytes), P's A operand.
  constexpr int kRowBytes = kRowStride * 2;
  const uint32_t off_s = ((lane / 16) * 8 + lane % 8) * kRowBytes + ((lane / 8) % 2) * 16 + warp * kLatPerWarp * 32;
  const uint32_t off_v = ((lane % 8) + ((lane / 8) % 2) * 8) * kRowBytes + (warp * kDimsPerWarp + (lane / 16) * 8) * 2;
  const uint32_t off_p = (lane % 16) * kPStride * 2 + (lane / 16) * 16;

  // Softmax state of head hs = tid / 16 (its 16 threads hold the same values).
  const int hs = tid / 16, js = (tid % 16) * 2;
  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int it = 0; it < ntiles; ++it) {
    const int64_t t0 = s0 + int64_t{it} * kTile;
    CpAsyncWait<kStages - 2>();  // this tile's copies (this thread's) have landed ...
    __syncthreads();             // ... everyone's; and every warp is done with the last tile
    {
      const int next = it + kStages - 1;  // into the stage the last tile used
      const int64_t t = s0 + int64_t{next} * kTile;
      if constexpr (V::kLean) {
        if (next < ntiles) Tile<kKind>::IssueRow(a, block_ahead, sm.ring[next % kStages]);
        CpAsyncCommit();
        if (next + 1 < ntiles) block_ahead = Tile<kKind>::NextRow(cur, a, tid / 8 < tile_left - kStages * kTile);
      } else {
        if (next < ntiles) Tile<kKind>::Issue(a, block_ahead, t, sm.ring[next % kStages]);
        CpAsyncCommit();
        if (next + 1 < ntiles) block_ahead = Tile<kKind>::BlockOf(a, table, t + kTile, s1);
      }
    }
    if (kKind == 2) {
      Tile<kKind>::Widen(sm.ring[it % kStages], sm);
      __syncthreads();
    }
    const __nv_bfloat16(*rows)[kRowStride] =
        kKind == 1 ? reinterpret_cast<const __nv_bfloat16(*)[kRowStride]>(sm.ring[it % kStages]) : sm.rows;
    const unsigned char* const rb = reinterpret_cast<const unsigned char*>(rows);

    // 1. Partial scores over this warp's k-steps, all 32 positions (4 n-tiles of 8).
    if constexpr (V::kLean) {
      // n-tile n's sum is 0 + d(k-step 0) + … + d(3), as below; the rope step's 0 + d alone.
      auto store = [&](float(*dst)[V::kSStride], int n, const float(&s)[4]) {
        const int c = n * 8 + 2 * t4;
        *reinterpret_cast<float2*>(&dst[g][c]) = make_float2(s[0], s[1]);
        *reinterpret_cast<float2*>(&dst[g + 8][c]) = make_float2(s[2], s[3]);
      };
#pragma unroll
      for (int np = 0; np < 2; ++np) {  // n-tiles 2np, 2np + 1 in one ldmatrix
        float sl[2][4] = {};
#pragma unroll
        for (int k = 0; k < kLatPerWarp; ++k) {
          unsigned bfr[4];
          Ldmatrix4(bfr, rb + off_s + np * 16 * kRowBytes + k * 32);
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            Mma(d, qa[1][k], bfr[2 * q], bfr[2 * q + 1]);
            Mma(d, qa[0][k], bfr[2 * q], bfr[2 * q + 1]);
#pragma unroll
            for (int i = 0; i < 4; ++i) sl[q][i] += d[i];
          }
        }
        store(sm.s_lat[warp], 2 * np, sl[0]);
        store(sm.s_lat[warp], 2 * np + 1, sl[1]);
      }
      if (warp < kRopeSteps) {
        unsigned qr[2][4];  // the rope k-step's fragments, as ring4 holds them
#pragma unroll
        for (int part = 0; part < 2; ++part) Ldmatrix4(qr[part], &sm.q_rope[part][lane % 16][warp * 16 + (lane / 16) * 8]);
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          unsigned bfr[4];
          Ldmatrix4(bfr, rb + off_s + (kR - (kLatPerWarp - 1) * 16 * warp) * 2 + np * 16 * kRowBytes);  // rope k-step
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            Mma(d, qr[1], bfr[2 * q], bfr[2 * q + 1]);
            Mma(d, qr[0], bfr[2 * q], bfr[2 * q + 1]);
            float sr[4];
#pragma unroll
            for (int i = 0; i < 4; ++i) sr[i] = 0.0f + d[i];
            store(sm.s_rope[warp], 2 * np + q, sr);
          }
        }
      }
    } else {
      float sl_[4][4], sr_[4][4];
#pragma unroll
      for (int n = 0; n < 4; ++n) {
#pragma unroll
        for (int i = 0; i < 4; ++i) sl_[n][i] = sr_[n][i] = 0.0f;
      }
      const int mi = lane / 8, r8 = lane % 8;
#pragma unroll
      for (int k = 0; k <= kLatPerWarp; ++k) {
        if (k == kLatPerWarp && warp >= kRopeSteps) break;
        const int col = k < kLatPerWarp ? (warp * kLatPerWarp + k) * 16 : kR + warp * 16;
#pragma unroll
        for (int np = 0; np < 2; ++np) {  // n-tiles 2np, 2np + 1 in one ldmatrix
          unsigned bfr[4];
          Ldmatrix4(bfr, &rows[(2 * np + mi / 2) * 8 + r8][col + (mi % 2) * 8]);
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
            Mma(d, qa[1][k], bfr[2 * q], bfr[2 * q + 1]);
            Mma(d, qa[0][k], bfr[2 * q], bfr[2 * q + 1]);
            float(&s)[4] = k < kLatPerWarp ? sl_[2 * np + q] : sr_[2 * np + q];
#pragma unroll
            for (int i = 0; i < 4; ++i) s[i] += d[i];
          }
        }
      }
#pragma unroll
      for (int n = 0; n < 4; ++n) {
        const int c = n * 8 + 2 * t4;
        sm.s_lat[warp][g][c] = sl_[n][0], sm.s_lat[warp][g][c + 1] = sl_[n][1];
        sm.s_lat[warp][g + 8][c] = sl_[n][2], sm.s_lat[warp][g + 8][c + 1] = sl_[n][3];
        if (warp < kRopeSteps) {
          sm.s_rope[warp][g][c] = sr_[n][0], sm.s_rope[warp][g][c + 1] = sr_[n][1];
          sm.s_rope[warp][g + 8][c] = sr_[n][2], sm.s_rope[warp][g + 8][c + 1] = sr_[n][3];
        }
      }
    }
    __syncthreads();

    // 2. Online softmax: thread (hs, js) takes positions js, js + 1 of head hs.
    {
      float s[2];
      if constexpr (V::kLean) {  // the same sums as below, two positions a load
        float lat[2] = {0.0f, 0.0f}, rope[2] = {0.0f, 0.0f};
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
          const float2 p = *reinterpret_cast<const float2*>(&sm.s_lat[w][hs][js]);
          lat[0] += p.x, lat[1] += p.y;
        }
#pragma unroll
        for (int w = 0; w < kRopeSteps; ++w) {
          const float2 p = *reinterpret_cast<const float2*>(&sm.s_rope[w][hs][js]);
          rope[0] += p.x, rope[1] += p.y;
        }
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int j = js + u;
          s[u] = j < tile_left ? a.scale * (sm.scale_lat[j] * lat[u] + sm.scale_rope[j] * rope[u]) : -INFINITY;
        }
      } else {
#pragma unroll
        for (int u = 0; u < 2; ++u) {
          const int j = js + u;
          float lat = 0.0f, rope = 0.0f;
#pragma unroll
          for (int w = 0; w < kWarps; ++w) lat += sm.s_lat[w][hs][j];
#pragma unroll
          for (int w = 0; w < kRopeSteps; ++w) rope += sm.s_rope[w][hs][j];
          s[u] = t0 + j < s1 ? a.scale * (sm.scale_lat[j] * lat + sm.scale_rope[j] * rope) : -INFINITY;
        }
      }
      float tmax = fmaxf(s[0], s[1]);
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, off));
      const float m_new = fmaxf(m, tmax);
      const float corr = expf(m - m_new);  // 0 on the first tile (m = -inf)
      const float p0 = expf(s[0] - m_new), p1 = expf(s[1] - m_new);
      float psum = p0 + p1;
#pragma unroll
      for (int off = 8; off > 0; off >>= 1) psum += __shfl_xor_sync(0xffffffffu, psum, off);
      l = l * corr + psum;
      m = m_new;
      // ō sums p·scale·code: the FP8 row's latent scale rides on p (l sums p alone).
      __nv_bfloat16 h0b, l0b, h1b, l1b;
      Split2(p0 * sm.scale_lat[js], h0b, l0b);
      Split2(p1 * sm.scale_lat[js + 1], h1b, l1b);
      sm.p[0][hs][js] = h0b, sm.p[0][hs][js + 1] = h1b;
      sm.p[1][hs][js] = l0b, sm.p[1][hs][js + 1] = l1b;
      if (tid % 16 == 0) sm.corr[hs] = corr;
    }
    __syncthreads();

    // 3. ō (this warp's 64 dims) = corr · ō + P · c.
    {
      const float c0 = sm.corr[g], c1 = sm.corr[g + 8];
      unsigned pa[2][2][4];  // [hi/lo][k-step of 16 positions]
      const int r = lane % 16, c8 = (lane / 16) * 8;
      const unsigned char* const pb = reinterpret_cast<const unsigned char*>(&sm.p[0][0][0]);
#pragma unroll
      for (int part = 0; part < 2; ++part) {
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          if constexpr (V::kLean) {
            Ldmatrix4(pa[part][k], pb + off_p + part * kHeads * kPStride * 2 + k * 32);
          } else {
            Ldmatrix4(pa[part][k], &sm.p[part][r][k * 16 + c8]);
          }
        }
      }
#pragma unroll
      for (int np = 0; np < kDimsPerWarp / 16; ++np) {  // n-tiles 2np, 2np + 1
        float d[2][4] = {};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          unsigned bfr[4];
          // Matrices: positions k·16 + 0..7 / 8..15 at dims n0, then at n0 + 8 (transposed).
          if constexpr (V::kLean) {
            Ldmatrix4Trans(bfr, rb + off_v + k * 16 * kRowBytes + np * 32);
          } else {
            Ldmatrix4Trans(bfr, &rows[k * 16 + (lane % 8) + ((lane / 8) % 2) * 8]
                                     [warp * kDimsPerWarp + np * 16 + (lane / 16) * 8]);
          }
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            Mma(d[q], pa[1][k], bfr[2 * q], bfr[2 * q + 1]);
            Mma(d[q], pa[0][k], bfr[2 * q], bfr[2 * q + 1]);
          }
        }
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          float(&o)[4] = acc[2 * np + q];
          o[0] = o[0] * c0 + d[q][0], o[1] = o[1] * c0 + d[q][1];
          o[2] = o[2] * c1 + d[q][2], o[3] = o[3] * c1 + d[q][3];
        }
      }
    }
    tile_left -= kTile;
  }
  CpAsyncWait<0>();  // only empty groups remain; nothing in flight when the block ends

  // The split's unnormalized ō and (max, sum) per head.
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) {
    const int dim = warp * kDimsPerWarp + n * 8 + 2 * t4;
    if (h0 + g < a.H) {
      float* po = part_o + (work * a.H + h0 + g) * kR + dim;
      po[0] = acc[n][0], po[1] = acc[n][1];
    }
    if (h0 + g + 8 < a.H) {
      float* po = part_o + (work * a.H + h0 + g + 8) * kR + dim;
      po[0] = acc[n][2], po[1] = acc[n][3];
    }
  }
  if (tid % 16 == 0 && h0 + hs < a.H) {
    part_ml[(work * a.H + h0 + hs) * 2] = m;
    part_ml[(work * a.H + h0 + hs) * 2 + 1] = l;
  }
}

// ring4 as it always was; ring2 capped at 128 registers: two blocks of 256 threads an SM.
// (`__launch_bounds__(256, 2)` gives the same cap, but ptxas then kept three values in local
// memory, reloaded every tile; `__maxnreg__(128)` alone does not spill: cuobjdump -res-usage.)
template <int kKind>
__global__ void __launch_bounds__(kThreads) MlaDecodeTcKernel(PagedDecodeArgs a, const float* qc, float* part_o,
                                                              float* part_ml) {
  DecodeSplit<kKind, Ring4>(a, qc, part_o, part_ml);
}
template <int kKind>
__global__ void __maxnreg__(128) MlaDecodeTcRing2Kernel(PagedDecodeArgs a, const float* qc, float* part_o,
                                                        float* part_ml) {
  DecodeSplit<kKind, Ring2>(a, qc, part_o, part_ml);
}
static_assert(128 * kThreads * Ring2::kMinBlocks <= 65536, "ring2: two blocks' registers an SM");

template <int kKind, class V, class Kernel>
void Launch(Kernel kernel, const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml, cudaStream_t s) {
  using Sm = Smem<kKind, V>;
  // The whole 228 KB an SM as shared memory (ring2's two blocks need 2 × (111.5 + 1) KB).
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(kernel, sizeof(Sm), true, "MLA decode kernel", &configured);
  const dim3 grid(static_cast<unsigned>(a.num_work), static_cast<unsigned>((a.H + kHeads - 1) / kHeads));
  LaunchPdl("MlaDecodeTc", kernel, grid, dim3(kThreads), sizeof(Sm), s, a, qc, part_o, part_ml);
  CheckLaunch("MlaDecodeTc");
}

// Ring2 fits two blocks an SM only within these (H200: 228 KB of shared memory an SM, 1 KB of it
// reserved a block).
static_assert(sizeof(Smem<1, Ring2>) <= 113 * 1024, "ring2 BF16: two blocks an SM");
static_assert(sizeof(Smem<2, Ring2>) <= 113 * 1024, "ring2 FP8: two blocks an SM");

std::atomic<int> g_variant{-1};  // SetMlaDecodeVariant's, else the environment's (read once)

}  // namespace

MlaDecodeVariant ParseMlaDecodeVariant(const char* name) {
  if (name == nullptr || std::strcmp(name, "") == 0 || std::strcmp(name, "wgmma-ws-tma") == 0) return MlaDecodeVariant::kWgmmaWsTma;
  if (std::strcmp(name, "wgmma") == 0) return MlaDecodeVariant::kWgmma;
  if (std::strcmp(name, "wgmma-ws") == 0) return MlaDecodeVariant::kWgmmaWs;
  if (std::strcmp(name, "wgmma-item") == 0) return MlaDecodeVariant::kWgmmaItem;
  if (std::strcmp(name, "ring2") == 0) return MlaDecodeVariant::kRing2;
  if (std::strcmp(name, "ring4") == 0) return MlaDecodeVariant::kRing4;
  std::fprintf(stderr, "kimirt: KIMIRT_MLA_DECODE_VARIANT=%s: not a variant (ring4, ring2, wgmma, wgmma-item, wgmma-ws, wgmma-ws-tma)\n", name);
  std::abort();
}

const char* MlaDecodeVariantName(MlaDecodeVariant v) {
  switch (v) {
    case MlaDecodeVariant::kWgmma: return "wgmma";
    case MlaDecodeVariant::kWgmmaItem: return "wgmma-item";
    case MlaDecodeVariant::kWgmmaWs: return "wgmma-ws";
    case MlaDecodeVariant::kWgmmaWsTma: return "wgmma-ws-tma";
    case MlaDecodeVariant::kRing2: return "ring2";
    case MlaDecodeVariant::kRing4: break;
  }
  return "ring4";
}

MlaDecodeVariant CurrentMlaDecodeVariant() {
  static const MlaDecodeVariant from_env = ParseMlaDecodeVariant(std::getenv("KIMIRT_MLA_DECODE_VARIANT"));
  const int v = g_variant.load();
  return v < 0 ? from_env : static_cast<MlaDecodeVariant>(v);
}

void SetMlaDecodeVariant(MlaDecodeVariant v) { g_variant.store(static_cast<int>(v)); }

bool MlaPagedDecodeTcSupported(const PagedDecodeArgs& a) {
  return a.r == kR && a.dr == kDr && (a.kind == 1 || a.kind == 2);
}

void MlaPagedDecodeSplitTc(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml, cudaStream_t s) {
  if (!MlaPagedDecodeTcSupported(a)) {
    std::fprintf(stderr, "kimirt: the tensor-core MLA decode takes BF16 or FP8 latents of %d + %d, got kind %d, %lld + %lld\n",
                 kR, kDr, a.kind, static_cast<long long>(a.r), static_cast<long long>(a.dr));
    std::abort();
  }
  const MlaDecodeVariant v = CurrentMlaDecodeVariant();
  if ((v == MlaDecodeVariant::kWgmmaWs || v == MlaDecodeVariant::kWgmmaWsTma) && MlaPagedDecodeWgmmaSupported(a)) {
    MlaPagedDecodeSplitWgmmaWs(a, qc, part_o, part_ml, s, v == MlaDecodeVariant::kWgmmaWsTma);
    return;
  }
  if ((v == MlaDecodeVariant::kWgmma || v == MlaDecodeVariant::kWgmmaItem) && MlaPagedDecodeWgmmaSupported(a)) {
    MlaPagedDecodeSplitWgmma(a, qc, part_o, part_ml, v == MlaDecodeVariant::kWgmma, s);
    return;
  }
  const bool ring2 = v == MlaDecodeVariant::kRing2;
  if (a.kind == 1) {
    ring2 ? Launch<1, Ring2>(MlaDecodeTcRing2Kernel<1>, a, qc, part_o, part_ml, s)
          : Launch<1, Ring4>(MlaDecodeTcKernel<1>, a, qc, part_o, part_ml, s);
  } else {
    ring2 ? Launch<2, Ring2>(MlaDecodeTcRing2Kernel<2>, a, qc, part_o, part_ml, s)
          : Launch<2, Ring4>(MlaDecodeTcKernel<2>, a, qc, part_o, part_ml, s);
  }
}

}  // namespace kimirt::cuda
