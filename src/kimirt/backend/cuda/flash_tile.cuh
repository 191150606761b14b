// What the MLA prefill kernels (mla_prefill_kernels.cu on mma.sync, mla_prefill_wgmma.cu on
// wgmma) share of a flash-attention tile: a lane's query fragments, the exponential, the online
// softmax; one definition, so they keep each other's bits. Its own header: the host emulations
// of the kernels that include ldmatrix_mma.cuh turn that file into host C++ and take no inline
// PTX they do not replace.
#pragma once

#include <cmath>

#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"

namespace kimirt::cuda {

// 2^x by the SFU alone (ex2.approx.ftz: ~2 ulp, results below 2^-126 flushed to zero, -inf → +0),
// for the attention kernels' softmax: exp2f wraps the same instruction in a rescaling for
// subnormal results (four more instructions a value), which probabilities that small never need.
// Every kernel of a family uses this one, so they keep each other's bits.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// A thread block's work item of an MlaPrefillPlan: head h of a tile of block_q queries from the
// sequence's new token t0. Positions and rows fit int32 (PlanMlaPrefill checks); element offsets
// are int64.
struct PrefillBlock {
  int64_t h, key_begin;  // key_begin: the sequence's first row of kv and ks
  int t0, q_row, count, start;
  int keys;       // the sequence's valid key rows: start + count
  int num_tiles;  // key tiles of block_k the block's last query sees
};
__device__ __forceinline__ PrefillBlock BlockOf(const MlaPrefillArgs& a, int block_q, int block_k) {
  PrefillBlock b;
  b.h = blockIdx.x % a.H;
  const int64_t tile = blockIdx.x / a.H;
  const int32_t* meta = a.seqs + 4 * a.tiles[2 * tile];
  b.t0 = a.tiles[2 * tile + 1];
  b.q_row = meta[0];
  b.count = meta[1];
  b.start = meta[2];
  b.key_begin = meta[3];
  b.keys = b.start + b.count;
  const int t_end = b.t0 + block_q < b.count ? b.t0 + block_q : b.count;
  b.num_tiles = (b.start + t_end + block_k - 1) / block_k;
  return b;
}

// The A fragments of a lane's query rows g and g + 8 over DQ columns (t = lane % 4), rounded to
// BF16: `lo` and `hi` point at the rows' F32 values, or are null for rows past the new tokens
// (zeros, never stored).
template <int DQ>
__device__ __forceinline__ void QueryFragments(const float* lo, const float* hi, int t, unsigned (&qa)[DQ / 16][4]) {
#pragma unroll
  for (int kk = 0; kk < DQ / 16; ++kk) {
    const int col = kk * 16 + 2 * t;
    const float2 z = make_float2(0.0f, 0.0f);
    const float2 a0 = lo != nullptr ? *reinterpret_cast<const float2*>(lo + col) : z;
    const float2 a1 = hi != nullptr ? *reinterpret_cast<const float2*>(hi + col) : z;
    const float2 a2 = lo != nullptr ? *reinterpret_cast<const float2*>(lo + col + 8) : z;
    const float2 a3 = hi != nullptr ? *reinterpret_cast<const float2*>(hi + col + 8) : z;
    qa[kk][0] = PackBf16(a0.x, a0.y);
    qa[kk][1] = PackBf16(a1.x, a1.y);
    qa[kk][2] = PackBf16(a2.x, a2.y);
    qa[kk][3] = PackBf16(a3.x, a3.y);
  }
}

// A lane's two query rows (g and g + 8 of its 16-row m-tile): running max of the raw scores, and
// this lane's share of the running sum (the quad's four shares are added at the end).
struct SoftmaxRows {
  float m_lo = -INFINITY, m_hi = -INFINITY, l_lo = 0.0f, l_hi = 0.0f;
};

// One 64-key tile for a lane's two rows, in the m16n8 C-fragment layout (s[n][0..1]: row g, keys
// key0 + 8n + 2t, + 1; s[n][2..3]: row g + 8): the causal mask when the tile reaches past the
// block's first row (`diagonal`), the rows' new max over the quad that shares them, the scores
// turned into probabilities exp2(s·scale2 − max·scale2) summed into r, o rescaled by the change
// of max, and P rounded to BF16 as the A fragments of the tile's four k16 steps (the C fragments
// of key pairs 2kk, 2kk + 1 are the A fragment of keys 16kk .. 16kk + 15).
template <int DV>
__device__ __forceinline__ void SoftmaxTile(float (&s)[8][4], float (&o)[DV / 8][4], unsigned (&pa)[4][4],
                                            SoftmaxRows& r, bool diagonal, int key0, int t, int pos_lo, int pos_hi,
                                            float scale2) {
  if (diagonal) {
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      const int k = key0 + n * 8 + 2 * t;
      if (k > pos_lo) s[n][0] = -INFINITY;
      if (k + 1 > pos_lo) s[n][1] = -INFINITY;
      if (k > pos_hi) s[n][2] = -INFINITY;
      if (k + 1 > pos_hi) s[n][3] = -INFINITY;
    }
  }
  float mx_lo = r.m_lo, mx_hi = r.m_hi;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    mx_lo = fmaxf(mx_lo, fmaxf(s[n][0], s[n][1]));
    mx_hi = fmaxf(mx_hi, fmaxf(s[n][2], s[n][3]));
  }
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 1));
  mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, 2));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 1));
  mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, 2));
  // Finite: key 0 is in every row's past and tile 0 comes first.
  const float corr_lo = Exp2Ftz((r.m_lo - mx_lo) * scale2);  // 0 on the first tile (m = -inf)
  const float corr_hi = Exp2Ftz((r.m_hi - mx_hi) * scale2);
  r.m_lo = mx_lo;
  r.m_hi = mx_hi;
  const float off_lo = mx_lo * scale2, off_hi = mx_hi * scale2;
  float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
    s[n][0] = Exp2Ftz(fmaf(s[n][0], scale2, -off_lo));
    s[n][1] = Exp2Ftz(fmaf(s[n][1], scale2, -off_lo));
    s[n][2] = Exp2Ftz(fmaf(s[n][2], scale2, -off_hi));
    s[n][3] = Exp2Ftz(fmaf(s[n][3], scale2, -off_hi));
    sum_lo += s[n][0] + s[n][1];
    sum_hi += s[n][2] + s[n][3];
  }
  r.l_lo = r.l_lo * corr_lo + sum_lo;
  r.l_hi = r.l_hi * corr_hi + sum_hi;
#pragma unroll
  for (int n = 0; n < DV / 8; ++n) {
    o[n][0] *= corr_lo;
    o[n][1] *= corr_lo;
    o[n][2] *= corr_hi;
    o[n][3] *= corr_hi;
  }
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    pa[kk][0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
}

// The end of a lane's two rows: their sums over the quad that shares them (the same bits on all
// four lanes), then O / l stored at out_lo and out_hi (columns 8n + 2t, + 1 of each row), or not
// at all for a null row (past the new tokens).
template <int DV>
__device__ __forceinline__ void StoreRows(const SoftmaxRows& r, const float (&o)[DV / 8][4], float* out_lo,
                                          float* out_hi, int t) {
  float l0 = r.l_lo, l1 = r.l_hi;
  l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
  l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
  l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
  const float inv_lo = 1.0f / l0, inv_hi = 1.0f / l1;
#pragma unroll
  for (int n = 0; n < DV / 8; ++n) {
    if (out_lo != nullptr) *reinterpret_cast<float2*>(out_lo + n * 8 + 2 * t) = make_float2(o[n][0] * inv_lo, o[n][1] * inv_lo);
    if (out_hi != nullptr) *reinterpret_cast<float2*>(out_hi + n * 8 + 2 * t) = make_float2(o[n][2] * inv_hi, o[n][3] * inv_hi);
  }
}

}  // namespace kimirt::cuda
