// What the two wgmma MLA decode splits share (spec §6.6; issue 12): mla_decode_wgmma.cu (the wgmma
// split, both warpgroups on every tile) and mla_decode_ws.cu (the warp-specialized split, a scorer
// warpgroup a tile ahead of two accumulating ones): the models' widths and the tile's shape, q̄'s
// hi / lo rows in swizzled panels, the work items and the walks over their tiles, the online
// softmax step, ō's accumulation and the FP8 widening. Device code for those two files only.
#pragma once

#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/wgmma.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cmath>
#include <cstdint>

namespace kimirt::cuda::mla_wgmma {

constexpr int kR = 512, kDr = 64, kW = kR + kDr;  // the models' MLA widths (spec §6)
constexpr int kHeads = 32;                         // a block's heads: hi and lo rows fill an m64
constexpr int kTile = 32;                          // positions a tile
constexpr int kThreads = 256;                      // two warpgroups
constexpr int kPanels = kW / 64;                   // 128-byte panels of a row: 8 latent, 1 rope
constexpr int kStepsPerGroup = kW / 16 / 2;        // S's 36 k steps, half a warpgroup
constexpr int kLatentSteps = kR / 16;              // k steps 0 .. 31 latent, 32 .. 35 rope
constexpr uint32_t kQPanelBytes = 64 * 128, kQBytes = kPanels * kQPanelBytes;
constexpr uint32_t kTilePanelBytes = kTile * 128, kTileBytes = kPanels * kTilePanelBytes;
static_assert(kTile * 8 == kThreads, "eight threads a row of a tile: one 16-byte chunk of each panel");
static_assert(kR / 2 == 2 * 128, "a warpgroup's half of ō: two m64n128 accumulators");
static_assert(kStepsPerGroup < kLatentSteps && kLatentSteps < 2 * kStepsPerGroup, "warpgroup 1 holds the rope steps");

// The m64 row of head hh's part (0: hi, 1: lo): warp hh / 8 of the warpgroup, its rows g, g + 8.
__device__ __forceinline__ int QRow(int hh, int part) { return 16 * (hh / 8) + hh % 8 + 8 * part; }

// Two F32 as the hi and lo BF16 pairs of PackBf16's order: v = hi + lo + (|rest| ≤ 2⁻¹⁷|v|); a
// non-finite hi gets lo = 0 (mla_decode_kernels.cu's Split2 on two values).
__device__ __forceinline__ void SplitPair(float x, float y, unsigned& hi, unsigned& lo) {
  hi = PackBf16(x, y);
  const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&hi);
  const float hx = __low2float(h), hy = __high2float(h);
  lo = PackBf16(isfinite(hx) ? x - hx : 0.0f, isfinite(hy) ? y - hy : 0.0f);
}

// A thread's row of the tiles ahead: a (table index, offset in the block) cursor over one
// sequence's block table, advanced a tile at a time without a division.
struct RowCursor {
  int index, offset, left;  // left: positions from the cursor's row to the split's end
  __device__ void Start(const PagedDecodeArgs& a, int64_t b, int64_t pos, int64_t end) {
    index = a.table_begin[b] + static_cast<int>(pos / a.block_size);  // positions fit int32
    offset = static_cast<int>(pos % a.block_size);
    left = static_cast<int>(end - pos);
  }
  // The pool row of the cursor's position (−1 past the split's end), then the cursor a tile on.
  __device__ int64_t Next(const PagedDecodeArgs& a) {
    const int bs = a.block_size;
    const int64_t at = left > 0 ? (int64_t{a.tables[index]} * a.layers + a.layer) * bs + offset : -1;
    offset += kTile;
    while (offset >= bs) offset -= bs, ++index;
    left -= kTile;
    return at;
  }
};

// A work item (sequence, first position, end position) of the step's list.
struct Item {
  int b, s0, s1;  // the list's int32s
  __device__ static Item Load(const PagedDecodeArgs& a, int w) {
    return {a.work[3 * w], a.work[3 * w + 1], a.work[3 * w + 2]};
  }
  __device__ int Tiles() const { return (s1 - s0 + kTile - 1) / kTile; }
};

// A thread's row of every tile of the block's items w0 .. w1 − 1, in order: the copy ring runs on
// from one item's last tile into the next item's first, so a block walking several items pays
// the chain work list → block table → first rows once, not an item.
struct TileStream {
  RowCursor cur;
  int item, end, tiles_left, row;
  __device__ void Begin(const PagedDecodeArgs& a, int w0, int w1, int row_in_tile) {
    item = w0, end = w1, row = row_in_tile;
    Open(a);
  }
  __device__ void Open(const PagedDecodeArgs& a) {
    tiles_left = 0;
    if (item < end) {
      const Item it = Item::Load(a, item);
      cur.Start(a, it.b, it.s0 + row, it.s1);
      tiles_left = it.Tiles();
    }
  }
  // False past the last item's last tile; else the pool row of this thread's row of the next
  // tile (−1 past its item's end).
  __device__ bool Next(const PagedDecodeArgs& a, int64_t* at) {
    if (tiles_left == 0) {
      if (item >= end) return false;
      ++item;
      Open(a);
      if (tiles_left == 0) return false;
    }
    --tiles_left;
    *at = cur.Next(a);
    return true;
  }
};

// The tiles of the block's items w0 .. w1 − 1 in order, as their first position, their item's end
// and the sequence's first table entry: the walk of the TMA copies (wgmma-ws-tma), which look up
// each box's row in the table themselves.
struct TileStreamPos {
  int item, end, tiles_left, s, s1, table;
  __device__ void Begin(int w0, int w1) { item = w0 - 1, end = w1, tiles_left = 0, s = s1 = table = 0; }
  // False past the last item's last tile.
  __device__ bool Next(const PagedDecodeArgs& a) {
    if (tiles_left == 0) {
      if (++item >= end) return false;
      const Item it = Item::Load(a, item);
      s = it.s0, s1 = it.s1, table = a.table_begin[it.b], tiles_left = it.Tiles();
      if (tiles_left == 0) return false;
    } else {
      s += kTile;
    }
    --tiles_left;
    return true;
  }
};

// Eight FP8 E4M3 codes as eight BF16 (exact), in PackBf16's order.
__device__ __forceinline__ uint4 WidenFp8x8(uint2 codes) {
  const unsigned w[2] = {codes.x, codes.y};
  unsigned out[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w[i / 2] >> (16 * (i % 2))), __NV_E4M3);
    const float2 f = __half22float2(__half2(h));
    out[i] = PackBf16(f.x, f.y);
  }
  return make_uint4(out[0], out[1], out[2], out[3]);
}

// The work items w0 .. w1 − 1 this block runs: a run of a.block_work (persistent), else the one
// item blockIdx.x (none past the step's count).
__device__ __forceinline__ void BlockItems(const PagedDecodeArgs& a, int* w0, int* w1) {
  *w0 = static_cast<int>(blockIdx.x), *w1 = *w0 + 1;
  if (a.block_work != nullptr) {
    *w0 = a.block_work[blockIdx.x], *w1 = a.block_work[blockIdx.x + 1];
  } else if (*w0 >= *a.work_count) {
    *w1 = *w0;
  }
}

// One tile of the online softmax for the head a quad holds: this lane's 8 scores x (−inf past
// the split's end) become e^(x − m_new), the running max m and this lane's share of the sum l move
// on, and the factor for ō's rescale, e^(m − m_new), is returned (0 on the first tile, m = −inf;
// m_new is finite: a tile holds at least one position).
__device__ __forceinline__ float SoftmaxStep(float (&x)[8], float& m, float& l) {
  float mx = x[0];
#pragma unroll
  for (int i = 1; i < 8; ++i) mx = fmaxf(mx, x[i]);
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  const float m_new = fmaxf(m, mx);
  const float corr = expf(m - m_new);
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    x[i] = expf(x[i] - m_new);
    sum += x[i];
  }
  l = l * corr + sum;
  m = m_new;
  return corr;
}

// FP8 rows: after the softmax step, P times each position's latent scale, so ō sums
// p · scale · code while l summed p alone (the mma.sync split's order). BF16 rows: the step alone.
template <int kKind>
__device__ __forceinline__ float SoftmaxStepScaled(float (&x)[8], float& m, float& l, const float (&lat_scale)[8]) {
  const float corr = SoftmaxStep(x, m, l);
  if constexpr (kKind == 2) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] *= lat_scale[i];
  }
  return corr;
}

// ō += P · c for one tile: warpgroup wg's dims 256 wg + [0, 256) as two m64n128 accumulators, P's
// hi / lo A fragments of the tile's two k16 steps in pa, the tile's panels at `stage` read as the
// MN-major B operand; issued, committed and (kWait) waited for (the panels are free after).
// Without kWait the caller works on beside the tensor cores and ends with AccumulateWait.
template <bool kWait = true>
__device__ __forceinline__ void AccumulateTile(float (&o0)[64], float (&o1)[64], const unsigned (&pa)[2][4],
                                               uint32_t stage, int wg) {
  wgmma::FenceRegs(o0);
  wgmma::FenceRegs(o1);
  wgmma::Fence();
  const uint64_t desc_v = wgmma::Desc128B(stage + 4 * wg * kTilePanelBytes, kTilePanelBytes, 1024);
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    constexpr uint32_t kStep = 16 * 128 >> 4, kHalf = 2 * kTilePanelBytes >> 4;  // descriptor units
    wgmma::WgmmaRS_m64n128k16<1>(o0, pa[kk], desc_v + kk * kStep);
    wgmma::WgmmaRS_m64n128k16<1>(o1, pa[kk], desc_v + kk * kStep + kHalf);
  }
  wgmma::Commit();
  if constexpr (kWait) {
    wgmma::Wait<0>();
    wgmma::FenceRegs(o0);
    wgmma::FenceRegs(o1);
  }
}

// The wait of an AccumulateTile<false>.
__device__ __forceinline__ void AccumulateWait(float (&o0)[64], float (&o1)[64]) {
  wgmma::Wait<0>();
  wgmma::FenceRegs(o0);
  wgmma::FenceRegs(o1);
}

// One round of LoadQuery: chunks k0, k0 + kN, ... (kPer of them).
template <int kN, int kPer>
__device__ __forceinline__ void LoadQueryRound(const PagedDecodeArgs& a, const float* qc, int64_t b, int64_t h0, int k0,
                                               unsigned char* base_ptr) {
  constexpr int kChunks = kW / 8;
  float4 v[kPer][2];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int k = k0 + i * kN, hh = k / kChunks, e8 = k % kChunks;
    if (h0 + hh < a.H) {
      const float4* src = reinterpret_cast<const float4*>(qc + ((b * a.H + h0 + hh) * kW + e8 * 8));
      v[i][0] = src[0], v[i][1] = src[1];
    } else {
      v[i][0] = v[i][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int k = k0 + i * kN, hh = k / kChunks, e8 = k % kChunks;
    uint4 hi, lo;
    SplitPair(v[i][0].x, v[i][0].y, hi.x, lo.x);
    SplitPair(v[i][0].z, v[i][0].w, hi.y, lo.y);
    SplitPair(v[i][1].x, v[i][1].y, hi.z, lo.z);
    SplitPair(v[i][1].z, v[i][1].w, hi.w, lo.w);
    unsigned char* panel = base_ptr + (e8 / 8) * kQPanelBytes;
    *reinterpret_cast<uint4*>(panel + wgmma::SwizzledOffset(QRow(hh, 0), e8 % 8)) = hi;
    *reinterpret_cast<uint4*>(panel + wgmma::SwizzledOffset(QRow(hh, 1), e8 % 8)) = lo;
  }
}

// q̄ of sequence b's heads h0 .. h0 + 31 as hi and lo rows, swizzled into the panels at base_ptr,
// by kN threads (tid < kN): 32 heads × 72 chunks of 8 values, in rounds of kPer a thread, each
// round's loads before its conversions. Heads past H are zeros (never stored).
template <int kN = kThreads, int kPer = kHeads * (kW / 8) / kN>
__device__ __forceinline__ void LoadQuery(const PagedDecodeArgs& a, const float* qc, int64_t b, int64_t h0, int tid,
                                          unsigned char* base_ptr) {
  constexpr int kChunks = kW / 8;
  static_assert(kHeads * kChunks % (kN * kPer) == 0, "whole rounds");
#pragma unroll 1
  for (int r0 = 0; r0 < kHeads * kChunks; r0 += kN * kPer) {
    LoadQueryRound<kN, kPer>(a, qc, b, h0, tid + r0, base_ptr);
  }
  wgmma::FenceProxyAsync();  // these stores → the wgmmas' reads (after the next tile's barrier)
}

}  // namespace kimirt::cuda::mla_wgmma
