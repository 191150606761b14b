// The paged MLA decode split as two warpgroups on alternate tiles (kernels.h
// MlaDecodeVariant::kSeesaw; spec §6.6; issue 12), for BF16 latents of the models' widths (latent
// 512, rope 64). The wgmma split (mla_decode_wgmma.cu) runs each tile as one chain — S split
// over both warpgroups, a swap, the softmax, ō — with two 36 KB tiles in flight: its copies
// alone and its compute alone each take 82-87% of its time (docs/cuda.md "Which half sets a
// tile's time"). This is the shape of FlashMLA's dense decode kernel on Hopper
// (deepseek-ai/FlashMLA, csrc/sm90/decode/dense/splitkv_mla.cuh, "seesaw" in its write-up),
// written for our m64 of 32 heads' hi and lo rows (mla_decode_wgmma.cu says why):
//
//   Tiles of 64 positions (q̄'s shared-memory reads halve a position against 32) in two buffers,
//   T0 and T1, each loaded by TMA as nine 64-column panels with a barrier each, so S starts on
//   the first panel while the rest land. Warpgroup 0 owns T0's scores and ō's dims 0 .. 255,
//   warpgroup 1 T1's scores and dims 256 .. 511. For a pair of tiles:
//     WG0: softmax of S(T0) (the running max in shared memory; scale0 = the old max's factor)
//          → ō_L += P0 · T0's dims 0 .. 255 (P0 in registers)
//     WG1: (after scale0) softmax of S(T1) against WG0's new max (scale1) → P1 into shared
//          memory → ō_R += P1 · T1's dims 256 .. 511, then ō_R += P0 · T0's dims 256 .. 511
//     WG0: (after scale1) P0 · scale1 into shared memory for WG1, ō_L · scale1 += P1 · T1's
//          dims 0 .. 255, then S of the next T0 while WG1 runs S of the next T1.
//   So one warpgroup's scores run under the other's softmax and ō, and a buffer's panels are
//   reloaded as soon as their last reader is done (dims 0 .. 255 by WG0's loader thread, the rest
//   by WG1's), across work items too: the next item's first tiles land while this one ends.
//
// Shared memory (227 KB, one block an SM): q̄'s latent panels (64 KB; its rope columns are held in
// registers as the A fragments of S's last four k steps, FlashMLA's trick, so the ninth panel's
// place holds P1), the two tiles (144 KB), P0 (8 KB), the maxima, scales and sums, 18 barriers.
//
// Precision: as the wgmma split — hi and lo BF16 parts of q̄ and P, products exact, F32
// accumulation in the tensor cores — but S summed by one warpgroup over all 36 k steps, and ō
// rescaled when the other warpgroup's tile moves the max; its own bits, held to the CPU at the
// same RelL2 ≤ 2e-5 (CudaBackendTest.PagedDecode*). Batch invariance: a block reads its own
// sequence's rows and query, on the split schedule of its own context (MlaDecodeSplitLen), and
// an item's sums do not depend on which block runs it or what it ran before.
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/named_barrier.cuh"
#include "kimirt/backend/cuda/pdl.cuh"
#include "kimirt/backend/cuda/tma.cuh"
#include "kimirt/backend/cuda/tma.h"
#include "kimirt/backend/cuda/wgmma.cuh"

#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace kimirt::cuda {
namespace {

constexpr int kR = 512, kDr = 64, kW = kR + kDr;  // the models' MLA widths (spec §6)
constexpr int kHeads = 32;                         // a block's heads: hi and lo rows fill an m64
constexpr int kTile = 64;                          // positions a tile
constexpr int kThreads = 256;                      // two warpgroups
constexpr int kPanels = kW / 64;                   // 128-byte panels of a row: 8 latent, 1 rope
constexpr uint32_t kPanelBytes = 64 * 128;         // 64 rows (q̄'s m64, or a tile's positions)
constexpr uint32_t kTileBytes = kPanels * kPanelBytes;
// Offsets from the 1 KB-aligned base.
constexpr uint32_t kP1At = 8 * kPanelBytes;  // q̄'s ninth panel's place: P1 (the rope is in registers)
constexpr uint32_t kTileAt = kTileBytes;     // buffer k at kTileAt + k · kTileBytes
constexpr uint32_t kP0At = 3 * kTileBytes;
constexpr uint32_t kMaxAt = kP0At + kPanelBytes;  // [32] the running max of each head
constexpr uint32_t kScale0At = kMaxAt + 128, kScale1At = kScale0At + 128;  // [32] each
constexpr uint32_t kSumAt = kScale1At + 128;                                // [2][32] each warpgroup's sum
constexpr uint32_t kBarAt = kSumAt + 256;                                   // [2][9] a barrier a panel
constexpr uint32_t kQueueAt = kBarAt + 2 * kPanels * 8;                     // [2][2] TileQueue
constexpr int kMaxItems = 48;                                               // a block's items held in shared memory
constexpr uint32_t kItemsAt = kQueueAt + 4 * 80;                            // [kMaxItems] int4
constexpr size_t kSmemBytes = kItemsAt + kMaxItems * 16 + 1024;             // + alignment
static_assert(kSmemBytes <= 227 * 1024, "one block an SM");
static_assert(kTile * 2 == 128, "P's 64 positions are one 128-byte panel row");

// Named barriers (named_barrier.cuh): the pair's hand-offs between the warpgroups, and one of each
// warpgroup's own (its zeroed rows before its wgmmas read them).
enum Bar : int { kScale0Ready = 1, kScale1Ready = 2, kP0Ready = 3, kP1Ready = 4, kOwn = 5 };  // kOwn + warpgroup

// The m64 row of head hh's part (0: hi, 1: lo), as mla_decode_wgmma.cu: warp hh / 8, rows g, g + 8.
__device__ __forceinline__ int QRow(int hh, int part) { return 16 * (hh / 8) + hh % 8 + 8 * part; }

// Two F32 as the hi and lo BF16 pairs of PackBf16's order (mla_decode_wgmma.cu's SplitPair).
__device__ __forceinline__ void SplitPair(float x, float y, unsigned& hi, unsigned& lo) {
  hi = PackBf16(x, y);
  const __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162*>(&hi);
  const float hx = __low2float(h), hy = __high2float(h);
  lo = PackBf16(isfinite(hx) ? x - hx : 0.0f, isfinite(hy) ? y - hy : 0.0f);
}

// A work item of the step's list (sequence, first position, end position) and where its
// sequence's block table starts (table_begin[b]).
struct Item {
  int b, s0, s1, table;
  __device__ int Tiles() const { return (s1 - s0 + kTile - 1) / kTile; }
};

// The block's items w0 .. w1 − 1: the first kMaxItems copied into shared memory at the start
// (BlockItems::Fill), so neither the loaders nor the item loop wait on a chain of global loads
// (work list → table_begin) between two items; any past them read from the list.
struct BlockItems {
  const int4* held;  // shared memory
  int w0;
  __device__ static Item FromList(const PagedDecodeArgs& a, int w) {
    const int b = a.work[3 * w];
    return {b, a.work[3 * w + 1], a.work[3 * w + 2], a.table_begin[b]};
  }
  __device__ void Fill(const PagedDecodeArgs& a, int w1, int tid, int4* to) const {
    for (int i = tid; i < min(w1 - w0, kMaxItems); i += kThreads) {
      const Item it = FromList(a, w0 + i);
      to[i] = make_int4(it.b, it.s0, it.s1, it.table);
    }
  }
  __device__ Item Get(const PagedDecodeArgs& a, int w) const {
    if (w - w0 >= kMaxItems) return FromList(a, w);
    const int4 v = held[w - w0];
    return {v.x, v.y, v.z, v.w};
  }
};

// The tiles one buffer takes, in order: tiles k, k + 2, ... of each of the block's items (a pair's
// first tile lies in buffer 0, its second in buffer 1). Each warpgroup's loader thread keeps one
// for each buffer in shared memory (not registers: the consumers hold 255), with the next tile's
// table entries copied in (cp.async) when the tile before it was loaded: a refill waits on no
// global load. Its loops are not unrolled: inlined at every refill of every pair step, unrolled
// boxes and divisions made the kernel 26,840 instructions, and its warps waited on instruction
// fetch (Nsight Compute, session 32).
struct TileQueue {
  Item it;                 // the next tile's item
  int work, tile, end, k;  // the next tile handed out: tile `tile` of item `work`; the buffer
  int boxes, offset;       // its boxes, and its first row's place in its block
  int entries[kTile / 8];  // its boxes' table entries (boxes of at least 8 rows)
  // The next tile on: tile + 2 of this item, or the first tile k of a later one; its entries on
  // their way. False when the buffer takes no more tiles.
  __device__ void Advance(const PagedDecodeArgs& a, const BlockItems& items, int box_rows) {
    tile += 2;
#pragma unroll 1
    while (work < end && tile >= it.Tiles()) {
      if (++work < end) it = items.Get(a, work);
      tile = k;
    }
    if (work >= end) return;
    const int bs = a.block_size, pos0 = it.s0 + kTile * tile;
    boxes = min(kTile / box_rows, (it.s1 - pos0 + box_rows - 1) / box_rows);
    // Blocks of 64 rows or more: one box at pos0 % bs; smaller: box j is block pos0 / bs + j, whole.
    const int first = pos0 / bs;
    offset = pos0 - first * bs;
#pragma unroll 1
    for (int j = 0; j < boxes; ++j) CpAsync4(&entries[j], a.tables + it.table + first + j);
  }
  __device__ void Begin(const PagedDecodeArgs& a, const BlockItems& items, int w0, int w1, int buffer, int box_rows) {
    work = w0, end = w1, k = buffer, tile = buffer - 2;
    if (w0 < w1) it = items.Get(a, w0);
    Advance(a, items, box_rows);
  }
};
static_assert(sizeof(TileQueue) <= 80, "a queue's slot in shared memory");

// The next tile of queue q, panels p0 .. p1 − 1, into the buffer at `buf` (panel p at p · 8 KB),
// each completing on its barrier (bars + 8p); then the queue a tile on. The tile's rows lie in
// paged blocks, so boxes of box_rows (the block size, at most 64) rows; boxes wholly past the
// item's end are not loaded (their rows are zeroed before ō reads them: ZeroRows).
__device__ __forceinline__ void LoadNext(const CUtensorMap* map, const PagedDecodeArgs& a, const BlockItems& items,
                                         TileQueue* q, uint32_t buf, uint32_t bars, int p0, int p1, int box_rows) {
  if (q->work >= q->end) return;
  CpAsyncWaitAll();  // the entries (fetched a refill ago; the loader copies nothing else this way)
  const int boxes = q->boxes, bytes = boxes * box_rows * 128;
#pragma unroll 1
  for (int p = p0; p < p1; ++p) tma::MbarArriveExpectTx(bars + 8 * p, bytes);
#pragma unroll 1
  for (int j = 0; j < boxes; ++j) {
    const int row = (q->entries[j] * a.layers + a.layer) * a.block_size + q->offset;
#pragma unroll 1
    for (int p = p0; p < p1; ++p) tma::Load2D(buf + p * kPanelBytes + j * box_rows * 128, map, bars + 8 * p, 64 * p, row);
  }
  q->Advance(a, items, box_rows);
}

// q̄ of sequence b's heads h0 .. h0 + 31, latent columns, as hi and lo rows swizzled into the
// panels at q (mla_decode_wgmma.cu's LoadQuery without the rope panel), in two rounds of four
// chunks of 8 a thread (all of a round's loads before its conversions; one round of eight would
// hold 64 registers beside the rope's). Heads past H are zeros.
__device__ __forceinline__ void LoadQueryLatent(const PagedDecodeArgs& a, const float* qc, int64_t b, int64_t h0, int tid,
                                                unsigned char* q) {
  constexpr int kChunks = kR / 8, kPer = 4, kRounds = kHeads * kChunks / kThreads / kPer;
#pragma unroll 1
  for (int round = 0; round < kRounds; ++round) {
    float4 v[kPer][2];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int k = tid + (round * kPer + i) * kThreads, hh = k / kChunks, e8 = k % kChunks;
      if (h0 + hh < a.H) {
        const float4* src = reinterpret_cast<const float4*>(qc + ((b * a.H + h0 + hh) * kW + e8 * 8));
        v[i][0] = src[0], v[i][1] = src[1];
      } else {
        v[i][0] = v[i][1] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      }
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int k = tid + (round * kPer + i) * kThreads, hh = k / kChunks, e8 = k % kChunks;
      uint4 hi, lo;
      SplitPair(v[i][0].x, v[i][0].y, hi.x, lo.x);
      SplitPair(v[i][0].z, v[i][0].w, hi.y, lo.y);
      SplitPair(v[i][1].x, v[i][1].y, hi.z, lo.z);
      SplitPair(v[i][1].z, v[i][1].w, hi.w, lo.w);
      unsigned char* panel = q + (e8 / 8) * kPanelBytes;
      *reinterpret_cast<uint4*>(panel + wgmma::SwizzledOffset(QRow(hh, 0), e8 % 8)) = hi;
      *reinterpret_cast<uint4*>(panel + wgmma::SwizzledOffset(QRow(hh, 1), e8 % 8)) = lo;
    }
  }
  wgmma::FenceProxyAsync();  // these stores → the wgmmas' reads (after the next __syncthreads)
}

// q̄'s rope columns of head hh (this lane's, 8 · warp + g) as the A fragments of S's k steps 32 ..
// 35: [kk] = rows g (hi) and g + 8 (lo) of columns 512 + 16kk + 2c, + 1 and + 8, + 9.
__device__ __forceinline__ void LoadQueryRope(const PagedDecodeArgs& a, const float* qc, int64_t b, int64_t head, int c,
                                              unsigned (&qr)[4][4]) {
  const bool in = head < a.H;
  const float* q = qc + ((b * a.H + (in ? head : 0)) * kW + kR + 2 * c);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    const float2 x = in ? *reinterpret_cast<const float2*>(q + 16 * kk) : make_float2(0.0f, 0.0f);
    const float2 y = in ? *reinterpret_cast<const float2*>(q + 16 * kk + 8) : make_float2(0.0f, 0.0f);
    SplitPair(x.x, x.y, qr[kk][0], qr[kk][1]);
    SplitPair(y.x, y.y, qr[kk][2], qr[kk][3]);
  }
}

// A descriptor the compiler cannot see through: the 36 + 16 descriptors a pair's wgmmas use are
// loop invariants, and hoisted out of the pair loop they would hold ~100 registers.
__device__ __forceinline__ uint64_t Opaque(uint64_t d) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(d));
  return d;
}

// S's panels kP0 .. kP1 − 1 of the tile at `tile` (each waited for on its barrier), added into s:
// latent panels from q̄'s panels, the rope panel from q̄'s fragments in registers.
template <int kP0, int kP1>
__device__ __forceinline__ void IssueScores(float (&s)[32], const unsigned (&qr)[4][4], uint64_t desc_q, uint32_t tile,
                                            uint32_t bars, uint32_t parity) {
  const uint64_t desc_t = Opaque(wgmma::Desc128B(tile, 16, 1024));
  desc_q = Opaque(desc_q);
#pragma unroll
  for (int p = kP0; p < kP1; ++p) {
    tma::MbarWait(bars + 8 * p, parity);
    wgmma::FenceRegs(s);  // the wait is a loop: ptxas would put this fence in itself (C7519)
    wgmma::Fence();
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t off = (p * kPanelBytes + 32 * k) >> 4;  // descriptor units
      if (p < 8) {
        wgmma::WgmmaSS_m64n64k16<0>(s, desc_q + off, desc_t + off);
      } else {
        wgmma::WgmmaRS_m64n64k16<0>(s, qr[k], desc_t + off);
      }
    }
    wgmma::Commit();
  }
}

__device__ __forceinline__ void ZeroScores(float (&s)[32]) {
#pragma unroll
  for (int i = 0; i < 32; ++i) s[i] = 0.0f;
  wgmma::FenceRegs(s);
  wgmma::Fence();
}

// This lane's 16 scores of head 8 · warp + g (hi row + lo row), scaled; columns at or past
// `valid` −inf (their rows may hold anything). x[2n + e] is column 8n + 2c + e.
__device__ __forceinline__ void Scores(const float (&s)[32], float scale, int valid, int c, float (&x)[16]) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) x[2 * n + e] = 8 * n + 2 * c + e < valid ? scale * (s[4 * n + e] + s[4 * n + e + 2]) : -INFINITY;
  }
}

__device__ __forceinline__ float QuadMax(const float (&x)[16]) {
  float m = x[0];
#pragma unroll
  for (int i = 1; i < 16; ++i) m = fmaxf(m, x[i]);
  m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
  return fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
}

// p = exp(x − max) in place; returns this lane's sum of them.
__device__ __forceinline__ float Exponentiate(float (&x)[16], float max) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < 16; ++i) {
    x[i] = expf(x[i] - max);
    sum += x[i];
  }
  return sum;
}

// ō · f, skipped by a warp whose heads all have f = 1 (x · 1 is x: the same bits either way).
__device__ __forceinline__ void ScaleO(float (&o0)[64], float (&o1)[64], float f) {
  if (__any_sync(0xffffffffu, f != 1.0f)) {
#pragma unroll
    for (int i = 0; i < 64; ++i) o0[i] *= f, o1[i] *= f;
  }
}

// P's hi and lo parts as the A fragments of the tile's four k16 steps (rows g and g + 8).
__device__ __forceinline__ void PFragments(const float (&x)[16], unsigned (&pa)[4][4]) {
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    SplitPair(x[4 * kk], x[4 * kk + 1], pa[kk][0], pa[kk][1]);
    SplitPair(x[4 * kk + 2], x[4 * kk + 3], pa[kk][2], pa[kk][3]);
  }
  // All computed here, before the wgmma fence: computed between the wgmmas that read them, ptxas
  // would fence each (C7519).
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
    for (int i = 0; i < 4; ++i) asm volatile("" : "+r"(pa[kk][i])::"memory");
  }
}

// f · P as the K-major A operand of the other warpgroup's wgmma: rows QRow(head, part), the 64
// positions one swizzled 128-byte row (conflict-free: chunk n ^ g spreads a warp's stores).
__device__ __forceinline__ void StoreP(const float (&x)[16], float f, int warp, int g, int c, unsigned char* panel) {
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    unsigned hi, lo;
    SplitPair(f * x[2 * n], f * x[2 * n + 1], hi, lo);
    *reinterpret_cast<unsigned*>(panel + wgmma::SwizzledOffset(16 * warp + g, n) + 4 * c) = hi;
    *reinterpret_cast<unsigned*>(panel + wgmma::SwizzledOffset(16 * warp + g + 8, n) + 4 * c) = lo;
  }
}

// Rows valid .. 63 of the tile's latent panels p0 .. p0 + 3 as zeros, by one warpgroup: past the
// item's end they hold other positions or stale tiles (anything, NaN included), and P = 0 must
// meet zeros in ō.
__device__ __forceinline__ void ZeroRows(unsigned char* tile, int p0, int valid, int wtid) {
  const int rows = kTile - valid, per_panel = rows * 8;
  for (int i = wtid; i < 4 * per_panel; i += 128) {
    const int p = p0 + i / per_panel, r = valid + i % per_panel / 8, chunk = i % 8;
    *reinterpret_cast<uint4*>(tile + p * kPanelBytes + r * 128 + chunk * 16) = make_uint4(0, 0, 0, 0);
  }
  wgmma::FenceProxyAsync();
}

// ō += P · V over the tile's 64 positions: V = four panels from `v` (dims 256u .. 256u + 255,
// MN-major), P in registers (Local) or a panel in shared memory (Remote).
__device__ __forceinline__ void IssuePvLocal(float (&o0)[64], float (&o1)[64], const unsigned (&pa)[4][4], uint32_t v) {
  const uint64_t desc_v = Opaque(wgmma::Desc128B(v, kPanelBytes, 1024));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    constexpr uint32_t kStep = 16 * 128 >> 4, kHalf = 2 * kPanelBytes >> 4;  // descriptor units
    wgmma::WgmmaRS_m64n128k16<1>(o0, pa[kk], desc_v + kk * kStep);
    wgmma::WgmmaRS_m64n128k16<1>(o1, pa[kk], desc_v + kk * kStep + kHalf);
  }
}
__device__ __forceinline__ void IssuePvRemote(float (&o0)[64], float (&o1)[64], uint32_t p, uint32_t v) {
  const uint64_t desc_p = Opaque(wgmma::Desc128B(p, 16, 1024)), desc_v = Opaque(wgmma::Desc128B(v, kPanelBytes, 1024));
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    constexpr uint32_t kStep = 16 * 128 >> 4, kHalf = 2 * kPanelBytes >> 4;
    wgmma::WgmmaSS_m64n128k16<1>(o0, desc_p + (32 * kk >> 4), desc_v + kk * kStep);
    wgmma::WgmmaSS_m64n128k16<1>(o1, desc_p + (32 * kk >> 4), desc_v + kk * kStep + kHalf);
  }
}

__device__ __forceinline__ void FenceO(float (&o0)[64], float (&o1)[64]) {
  wgmma::FenceRegs(o0);
  wgmma::FenceRegs(o1);
}

// What both warpgroups' pair steps read: the block's shared memory, this lane's place, the loads.
struct Ctx {
  const CUtensorMap* map;
  const PagedDecodeArgs* a;
  unsigned char* base_ptr;
  float *s_max, *s_scale0, *s_scale1;
  uint32_t base;
  uint64_t desc_q;
  int box_rows, wtid, warp, g, c, hh;
  bool loader;        // this warpgroup's loader thread
  TileQueue* queues;  // [warpgroup][buffer], the loaders'
  BlockItems items;
  __device__ uint32_t Tile(int k) const { return base + kTileAt + k * kTileBytes; }
  __device__ unsigned char* TilePtr(int k) const { return base_ptr + kTileAt + k * kTileBytes; }
  __device__ uint32_t Bars(int k) const { return base + kBarAt + 8 * kPanels * k; }
  // The loader refills the panels its warpgroup is the last to read: 0 .. 3 (ō's dims 0 .. 255)
  // for warpgroup 0, 4 .. 8 for warpgroup 1.
  template <int kWg>
  __device__ void Refill(int k) const {
    if (loader) LoadNext(map, *a, items, queues + 2 * kWg + k, Tile(k), Bars(k), kWg == 0 ? 0 : 4, kWg == 0 ? 4 : kPanels, box_rows);
  }
};

// The accumulators a warpgroup carries through an item.
struct Acc {
  float o0[64], o1[64];  // ō: this warpgroup's dims 256wg + [0, 128) and + [128, 256), hi and lo rows
  float s[32];           // S of this warpgroup's tile (m64n64: [4n + e] row g or g + 8, column 8n + 2c + e % 2)
  float l;               // this lane's share of the head's sum over its warpgroup's tiles
  uint32_t parity;       // the phase of this warpgroup's buffer: the tiles it has scored, mod 2
};

// S of tile buffer k into acc.s, waited for.
__device__ __forceinline__ void ScoreTile(const Ctx& x, Acc& acc, const unsigned (&qr)[4][4], int k) {
  ZeroScores(acc.s);
  IssueScores<0, kPanels>(acc.s, qr, x.desc_q, x.Tile(k), x.Bars(k), acc.parity);
  wgmma::Wait<0>();
  wgmma::FenceRegs(acc.s);
  acc.parity ^= 1;
}

// Warpgroup 0's part of a pair (T0 = buffer 0, T1 = buffer 1 if kHas1); kNext: the item has a
// tile after T1, and this scores it (buffer 0) at the end. Enters with acc.s = S(T0).
template <bool kHas1, bool kNext>
__device__ __forceinline__ void Wg0Pair(const Ctx& x, Acc& acc, const unsigned (&qr)[4][4],
                                        int valid0, int valid1) {
  // Softmax of T0's scores against the max the previous pair left.
  float p[16];
  Scores(acc.s, x.a->scale, valid0, x.c, p);
  const float m_old = x.s_max[x.hh], m_new = fmaxf(m_old, QuadMax(p));  // finite: a tile holds a position
  const float f0 = expf(m_old - m_new);                                    // 0 on the item's first tile
  __syncwarp();
  if (x.c == 0) x.s_max[x.hh] = m_new, x.s_scale0[x.hh] = f0;
  ScaleO(acc.o0, acc.o1, f0);
  acc.l = acc.l * f0 + Exponentiate(p, m_new);
  NamedArrive(kScale0Ready, kThreads);
  if (!kHas1 && valid0 < kTile) {  // only an item's last tile is partial
    ZeroRows(x.TilePtr(0), 0, valid0, x.wtid);
    NamedSync(kOwn, 128);
  }
  unsigned pa[4][4];
  PFragments(p, pa);
  FenceO(acc.o0, acc.o1);
  wgmma::Fence();
  IssuePvLocal(acc.o0, acc.o1, pa, x.Tile(0));
  wgmma::Commit();
  wgmma::Wait<0>();
  FenceO(acc.o0, acc.o1);
  // WG1's softmax moved the max by f1: P0 · f1 is WG1's operand; ō_L and l take f1 below.
  NamedSync(kScale1Ready, kThreads);
  const float f1 = x.s_scale1[x.hh];
  StoreP(p, f1, x.warp, x.g, x.c, x.base_ptr + kP0At);
  wgmma::FenceProxyAsync();
  NamedArrive(kP0Ready, kThreads);
  x.Refill<0>(0);  // T0's dims 0 .. 255 are read (its rope panel by S, before the pair)
  if constexpr (kHas1) {
    NamedSync(kP1Ready, kThreads);
    if (!kNext && valid1 < kTile) {
      ZeroRows(x.TilePtr(1), 0, valid1, x.wtid);
      NamedSync(kOwn, 128);
    }
    ScaleO(acc.o0, acc.o1, f1);
    acc.l *= f1;
    FenceO(acc.o0, acc.o1);
    wgmma::Fence();
    IssuePvRemote(acc.o0, acc.o1, x.base + kP1At, x.Tile(1));
    wgmma::Commit();
    if constexpr (kNext) {
      ZeroScores(acc.s);
      IssueScores<0, 4>(acc.s, qr, x.desc_q, x.Tile(0), x.Bars(0), acc.parity);
      wgmma::Wait<4>();  // the remote ō, not the four panels' S behind it
    } else {
      wgmma::Wait<0>();
    }
    x.Refill<0>(1);
    if constexpr (kNext) {
      IssueScores<4, kPanels>(acc.s, qr, x.desc_q, x.Tile(0), x.Bars(0), acc.parity);
      acc.parity ^= 1;
    }
  }
  wgmma::Wait<0>();
  FenceO(acc.o0, acc.o1);
  wgmma::FenceRegs(acc.s);
}

// Warpgroup 1's part of a pair; kNext: the item has a tile after the next T0, and this scores it
// (buffer 1) at the end. Enters with acc.s = S(T1) if kHas1.
template <bool kHas1, bool kNext>
__device__ __forceinline__ void Wg1Pair(const Ctx& x, Acc& acc, const unsigned (&qr)[4][4],
                                        int valid0, int valid1) {
  NamedSync(kScale0Ready, kThreads);
  const float f0 = x.s_scale0[x.hh], m_old = x.s_max[x.hh];
  float p[16], f1 = 1.0f, sum = 0.0f;
  if constexpr (kHas1) {
    Scores(acc.s, x.a->scale, valid1, x.c, p);
    const float m_new = fmaxf(m_old, QuadMax(p));
    f1 = expf(m_old - m_new);
    sum = Exponentiate(p, m_new);
    __syncwarp();
    if (x.c == 0) x.s_max[x.hh] = m_new;
  }
  if (x.c == 0) x.s_scale1[x.hh] = f1;
  const float f = f1 * f0;  // ō_R and l have not yet taken T0's move of the max
  ScaleO(acc.o0, acc.o1, f);
  acc.l = acc.l * f + sum;
  NamedArrive(kScale1Ready, kThreads);
  if constexpr (kHas1) {
    StoreP(p, 1.0f, x.warp, x.g, x.c, x.base_ptr + kP1At);
    wgmma::FenceProxyAsync();
    NamedArrive(kP1Ready, kThreads);
    if (valid1 < kTile) {
      ZeroRows(x.TilePtr(1), 4, valid1, x.wtid);
      NamedSync(kOwn + 1, 128);
    }
    unsigned pa[4][4];
    PFragments(p, pa);
    FenceO(acc.o0, acc.o1);
    wgmma::Fence();
    IssuePvLocal(acc.o0, acc.o1, pa, x.Tile(1) + 4 * kPanelBytes);
    wgmma::Commit();
  }
  NamedSync(kP0Ready, kThreads);
  if (!kHas1 && valid0 < kTile) {
    ZeroRows(x.TilePtr(0), 4, valid0, x.wtid);
    NamedSync(kOwn + 1, 128);
  }
  FenceO(acc.o0, acc.o1);
  wgmma::Fence();
  IssuePvRemote(acc.o0, acc.o1, x.base + kP0At, x.Tile(0) + 4 * kPanelBytes);
  wgmma::Commit();
  if constexpr (kHas1) {
    wgmma::Wait<1>();
    x.Refill<1>(1);
  }
  wgmma::Wait<0>();
  FenceO(acc.o0, acc.o1);
  x.Refill<1>(0);
  if constexpr (kNext) ScoreTile(x, acc, qr, 1);
}

// A block runs the items w0 .. w1 − 1 (persistent: a run of a.block_work; else the item
// blockIdx.x), each exactly as a block of its own would (ō, max and sums from zero, its pairs of
// tiles in order), so the schedule never changes a bit.
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeSeesawKernel(const __grid_constant__ CUtensorMap map, const __grid_constant__ PagedDecodeArgs a, int box_rows, const float* qc,
                          float* part_o, float* part_ml) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = SharedAddress(smem_raw);
  Ctx x;
  x.base = (raw + 1023u) & ~1023u;  // panels at multiples of 1 KB (the swizzle's)
  x.base_ptr = smem_raw + (x.base - raw);
  x.s_max = reinterpret_cast<float*>(x.base_ptr + kMaxAt);
  x.s_scale0 = reinterpret_cast<float*>(x.base_ptr + kScale0At);
  x.s_scale1 = reinterpret_cast<float*>(x.base_ptr + kScale1At);
  float* const s_sum = reinterpret_cast<float*>(x.base_ptr + kSumAt);
  int w0 = static_cast<int>(blockIdx.x), w1 = w0 + 1;
  if (a.block_work != nullptr) {
    w0 = a.block_work[blockIdx.x], w1 = a.block_work[blockIdx.x + 1];
  } else if (w0 >= *a.work_count) {
    w1 = w0;
  }
  if (w0 >= w1) return;  // the whole block: no work this step
  const int64_t h0 = int64_t{blockIdx.y} * kHeads;
  const int tid = threadIdx.x, wg = tid / 128, lane = tid % 32;
  x.map = &map;
  x.a = &a;
  x.box_rows = box_rows;
  x.wtid = tid % 128, x.warp = x.wtid / 32, x.g = lane / 4, x.c = lane % 4, x.hh = 8 * x.warp + x.g;
  x.loader = x.wtid == 0;
  x.desc_q = wgmma::Desc128B(x.base, 16, 1024);
  if (tid == 0) {
    for (int i = 0; i < 2 * kPanels; ++i) tma::MbarInit(x.Bars(0) + 8 * i, 1);
    tma::FenceMbarInit();
  }
  x.items.w0 = w0;
  x.items.held = reinterpret_cast<const int4*>(x.base_ptr + kItemsAt);
  x.items.Fill(a, w1, tid, reinterpret_cast<int4*>(x.base_ptr + kItemsAt));
  __syncthreads();
  x.queues = reinterpret_cast<TileQueue*>(x.base_ptr + kQueueAt);
  if (x.loader) {
    x.queues[2 * wg].Begin(a, x.items, w0, w1, 0, box_rows);
    x.queues[2 * wg + 1].Begin(a, x.items, w0, w1, 1, box_rows);
  }
  if (wg == 0) {
    x.Refill<0>(0), x.Refill<0>(1);
  } else {
    x.Refill<1>(0), x.Refill<1>(1);
  }
  // Launched with LaunchPdl (pdl.cuh). The step's metadata and the latent rows were written
  // before the kernel ahead of this one (AbsorbQuery) passed its own PdlWait, so the loads above
  // may start while it runs; q̄ is its output, read after the wait. Nothing is written before it.
  PdlWait();
  PdlTrigger();

  Acc acc;
  acc.parity = 0;
  unsigned qr[4][4];  // q̄'s rope fragments
  int q_of = -1;      // the sequence whose q̄ the panels hold
  for (int work = w0; work < w1; ++work) {
    const Item item = x.items.Get(a, work);
    const int n = item.Tiles(), len = item.s1 - item.s0;
    if (item.b != q_of) {
      // Every thread is past the previous item's last wgmma wait: nothing reads q̄.
      LoadQueryLatent(a, qc, item.b, h0, tid, x.base_ptr);
      LoadQueryRope(a, qc, item.b, h0 + x.hh, x.c, qr);
      q_of = item.b;
    }
    if (tid < kHeads) x.s_max[tid] = -INFINITY;
    __syncthreads();
#pragma unroll
    for (int i = 0; i < 64; ++i) acc.o0[i] = acc.o1[i] = 0.0f;
    acc.l = 0.0f;
    // The pairs: the common one (a T1 and a tile after it) in the loop, the item's last one or
    // two after it (FlashMLA's shape: every wgmma wait of a step is in straight-line code).
    int t = 0;
    if (wg == 0 || n > 1) ScoreTile(x, acc, qr, wg);  // one copy of the code for both
    if (wg == 0) {
      for (; t + 2 < n; t += 2) Wg0Pair<true, true>(x, acc, qr, kTile, kTile);
      if (t + 1 < n) {
        Wg0Pair<true, false>(x, acc, qr, kTile, len - kTile * (t + 1));
      } else {
        Wg0Pair<false, false>(x, acc, qr, len - kTile * t, 0);
      }
    } else {
      for (; t + 3 < n; t += 2) Wg1Pair<true, true>(x, acc, qr, kTile, kTile);
      if (t + 2 < n) {  // T1 here, and one more tile after it (a pair of its own)
        Wg1Pair<true, false>(x, acc, qr, kTile, kTile);
        t += 2;
      }
      if (t + 1 < n) {
        Wg1Pair<true, false>(x, acc, qr, kTile, len - kTile * (t + 1));
      } else {
        Wg1Pair<false, false>(x, acc, qr, len - kTile * t, 0);
      }
    }

    // The split's unnormalized ō (hi row + lo row) and (max, sum) per head; both warpgroups'
    // sums are on the last max (each took every later scale).
    __syncthreads();
    const float m = x.s_max[x.hh];
    float l = acc.l;
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if (x.c == 0) s_sum[wg * kHeads + x.hh] = l;
    __syncthreads();
    const int64_t head = h0 + x.hh;
    if (head < a.H) {
      float* po = part_o + (work * a.H + head) * kR + 256 * wg + 2 * x.c;
#pragma unroll
      for (int i = 0; i < 16; ++i) {
        *reinterpret_cast<float2*>(po + 8 * i) =
            make_float2(acc.o0[4 * i] + acc.o0[4 * i + 2], acc.o0[4 * i + 1] + acc.o0[4 * i + 3]);
        *reinterpret_cast<float2*>(po + 128 + 8 * i) =
            make_float2(acc.o1[4 * i] + acc.o1[4 * i + 2], acc.o1[4 * i + 1] + acc.o1[4 * i + 3]);
      }
      if (wg == 0 && x.c == 0) {
        part_ml[(work * a.H + head) * 2] = m;
        part_ml[(work * a.H + head) * 2 + 1] = s_sum[x.hh] + s_sum[kHeads + x.hh];
      }
    }
  }
}

// The tensor map of the pool's rows (one per (pool, box) a thread: the pool of a KV storage is
// fixed until it grows, so its map is made once, not each layer's call).
const CUtensorMap& PoolMap(const PagedDecodeArgs& a, int box_rows) {
  thread_local CUtensorMap map;
  thread_local const void* values = nullptr;
  thread_local uint64_t rows = 0;
  thread_local int box = 0;
  const uint64_t want_rows = static_cast<uint64_t>(a.blocks) * a.layers * a.block_size;
  if (values != a.values || rows != want_rows || box != box_rows) {
    std::string error;
    if (!MakeTensorMapBf16Swizzled(&map, a.values, want_rows, kW, kW * 2, static_cast<uint32_t>(box_rows), &error)) {
      std::fprintf(stderr, "kimirt: the seesaw MLA decode's latent pool: %s\n", error.c_str());
      std::abort();
    }
    values = a.values, rows = want_rows, box = box_rows;
  }
  return map;
}

}  // namespace

bool MlaPagedDecodeSeesawSupported(const PagedDecodeArgs& a) {
  // Boxes of a paged block's rows (at most a tile's 64) land at multiples of 1 KB only for blocks
  // of 8 rows or more; a tile must not cross a block unless it starts one.
  const bool blocks_fit = a.block_size % kTile == 0 || (a.block_size >= 8 && kTile % a.block_size == 0);
  return a.kind == 1 && a.r == kR && a.dr == kDr && a.blocks > 0 && blocks_fit;
}

void MlaPagedDecodeSplitSeesaw(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml,
                               cudaStream_t s) {
  if (!MlaPagedDecodeSeesawSupported(a)) {
    std::fprintf(stderr,
                 "kimirt: the seesaw MLA decode takes BF16 latents of %d + %d in blocks of 8, 16, 32 or 64k rows, got "
                 "kind %d, %lld + %lld, blocks of %d\n",
                 kR, kDr, a.kind, static_cast<long long>(a.r), static_cast<long long>(a.dr), a.block_size);
    std::abort();
  }
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(MlaDecodeSeesawKernel, kSmemBytes, true, "MLA decode kernel (seesaw)", &configured);
  const int box_rows = a.block_size < kTile ? a.block_size : kTile;
  const CUtensorMap& map = PoolMap(a, box_rows);
  const bool walk = a.block_work != nullptr;
  const int64_t blocks = walk ? a.persist_blocks : a.num_work;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((a.H + kHeads - 1) / kHeads));
  LaunchPdl("MlaDecodeSeesaw", MlaDecodeSeesawKernel, grid, dim3(kThreads), kSmemBytes, s, map, a, box_rows, qc, part_o,
            part_ml);
  CheckLaunch("MlaDecodeSeesaw");
}

}  // namespace kimirt::cuda
