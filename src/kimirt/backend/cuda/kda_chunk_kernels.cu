// Chunked KDA prefill on tensor cores (kernels.h KdaChunked; spec §5.5, numerics in docs/cuda.md
// "Chunked KDA prefill"). Two forms: the fused kernel below (the F32 mode), then the BF16 prefill
// mode's chunk-parallel kernels (map, prep, state; their own comment further down).
//
// The fused kernel: one thread block per (sequence, head, block of VB value columns), walking the sequence's chunks
// of 64 tokens in order with its [K, VB] slice of the state in shared memory (F32 throughout).
// Value columns never mix in the delta rule (every product contracts over key channels or
// tokens), so the VB-column slices of one head are independent; only the per-chunk work on q, k
// and the decays is repeated in each. Per chunk, with Γ_r = Σ_{r'≤r} α_{r'} (spec §5.5):
//   1. q̂, k̂ (l2norm), β; the decay factors, always as exp of a sum of α taken directly (never a
//      difference of two long sums: the CPU reference's argument, cpu/kda_kernels.cpp);
//   2. the masked scores A[r,c] = −β_r Σ_d k̂_r k̂_c e^{Γ_r−Γ_c} (r > c) and
//      Aqk[r,c] = Σ_d q̂_r k̂_c e^{Γ_r−Γ_c} (r ≥ c), as MMAs over 16-row blocks (below);
//   3. T = (I − A)^{-1} diag(β) by blocks of 16 (F32 CUDA cores);
//   4. Y = V − (K̂ ⊙ e^Γ) S and O = (Q̂ ⊙ e^Γ) S (MMAs sharing the S fragments);
//   5. V' = T Y  (= U − W S of the spec, with W = T (K̂ ⊙ e^Γ), U = T V);
//   6. O += Aqk V', stored;
//   7. S ← e^{Γ_63} ⊙_rows S + (K̂ ⊙ e^{Γ_63 − Γ})ᵀ V'.
// Rows past the sequence's end pad the last chunk with k̂ = q̂ = v = β = α = 0, which leaves every
// product above exactly as for the shorter chunk.
//
// Decays inside a chunk. Row block i (rows 16i .. 16i+15) has a reference row m_i = 16i + 8; the
// stored operands are QM_r = q̂_r e^{Γ_r − Γ_{m_i}}, KM_r = k̂_r e^{Γ_r − Γ_{m_i}} and
// KR_r = k̂_r e^{Γ_{m_i} − Γ_r}, each exponent a direct sum of at most 8 α's. Then
//   e^{Γ_r − Γ_c} = QM_r/q̂_r · e^{Γ_{m_i} − Γ_{m_j}} · KR_c/k̂_c  for r in block i, c in block j ≤ i,
// so a score block (i, j) is one 16×16×128 MMA of (QM or KM) · D_ij (a per-channel scale applied
// as the fragments load, D_ii = 1) against KR; e^{Γ_r} = KM_r/k̂_r · P_i and e^{Γ_63 − Γ_c} =
// KR_c/k̂_c · F_j likewise. Every scale factor (P, F, D, e^{Γ_63}) is ≤ 1; the stored operands are
// within e^{±60} of q̂, k̂ as long as no 8 consecutive α of a channel sum below −60 — always for
// K3 (α > −5, spec §5.3). A chunk where some channel exceeds that (only an unbounded softplus
// gate can) runs token by token instead (the recurrent kernel's loop on the state in shared
// memory): exact, slower, and decided by the chunk's own α alone.
//
// Precision: every MMA operand is split into P = 3 BF16 parts (hi, mid, lo: all of F32) and the
// cross products of total order < 3 run as 6 separate MMAs, smallest first, into a zeroed
// accumulator then added to the running F32 sum (the tensor cores truncate; docs/cuda.md
// "Precision" of the decode GEMM): F32 math up to summation order. (The prep kernel below uses
// the same helpers with P = 1: one BF16 part.)
//
// Batch invariance: a block's results depend on its own sequence, head and state slot only; the
// arithmetic of every output element is the same for VB = 32, 64 and 128 (same k order, same MMA
// terms, same fallback loop), so the VB picked from the batch's size does not change a bit.
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/kda_activations.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/mma_bf16.cuh"

#include <cuda_bf16.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kChunk = 64;
constexpr int kDim = kKdaChunkHeadDim;  // K = V
constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kBlockRows = 16;                    // row blocks of a chunk (the MMA's m)
constexpr int kBlocks = kChunk / kBlockRows;      // 4
constexpr int kRef = 8;                           // reference row within a block
constexpr float kMaxLocalExponent = 60.0f;        // |Γ_r − Γ_{m_i}| allowed on the MMA path
// Row strides in floats. 136 ≡ 8 (mod 32): the float2 loads of A fragments (8 rows × 4 pairs
// per half warp) hit 32 distinct banks; VB + 4 ≡ 4 (mod 32): the column loads of B fragments
// (rows 2t, 2t+1 × 8 columns) too.
constexpr int kXs = kDim + 8;
constexpr int kTs = kChunk + 8;
constexpr int kSolveTmp = 3 * kBlockRows * kBlockRows;

static_assert(kThreads == 2 * kDim, "the decay phase runs two threads per key channel");
static_assert(kWarps == 2 * kBlocks, "steps 4-6 give each warp one row block and half the columns");

// Shared memory of one block, in floats. QM's space holds V' from step 5 on, KM's holds Y.
template <int VB>
struct Smem {
  static constexpr int kVs = VB + 4;
  static constexpr int kQm = 0;
  static constexpr int kKm = kQm + kChunk * kXs;
  static constexpr int kKr = kKm + kChunk * kXs;
  static constexpr int kS = kKr + kChunk * kXs;       // state slice [K][VB]
  static constexpr int kA = kS + kDim * kVs;          // A, then T [64][64]
  static constexpr int kAqk = kA + kChunk * kTs;      // Aqk [64][64]
  static constexpr int kTmp = kAqk + kChunk * kTs;    // block solve scratch
  static constexpr int kP = kTmp + kSolveTmp;         // P_i = e^{Γ_{m_i}}            [4][K]
  static constexpr int kF = kP + kBlocks * kDim;      // F_j = e^{Γ_63 − Γ_{m_j}}     [4][K]
  static constexpr int kD = kF + kBlocks * kDim;      // D_ij = e^{Γ_{m_i} − Γ_{m_j}}, i > j [6][K]
  static constexpr int kGl = kD + 6 * kDim;           // e^{Γ_63}                      [K]
  static constexpr int kPre = kGl + kDim;             // Σ α over rows 16i .. m_i      [4][K]
  static constexpr int kPost = kPre + kBlocks * kDim; // Σ α over rows m_i+1 .. 16i+15 [4][K]
  static constexpr int kBeta = kPost + kBlocks * kDim;
  static constexpr int kRq = kBeta + kChunk;          // 1/‖q_r‖ (with eps)
  static constexpr int kRk = kRq + kChunk;
  static constexpr int kFloats = kRk + kChunk;
  static constexpr size_t kBytes = sizeof(float) * kFloats;
  static_assert(kChunk * kVs <= kChunk * kXs, "Y and V' fit in KM's and QM's space");
};

__device__ __forceinline__ int PairIndex(int i, int j) { return i * (i - 1) / 2 + j; }  // i > j

__device__ __forceinline__ float2 Ld2(const float* p) { return *reinterpret_cast<const float2*>(p); }
__device__ __forceinline__ float2 Mul2(float2 a, float2 b) { return make_float2(a.x * b.x, a.y * b.y); }

// x0, x1 as P BF16 parts each, packed as MMA registers (x0 in the low half: one cvt.rn.bf16x2
// per part). Each remainder is exact in F32 and each part takes the next 8 significant bits
// (decode_gemm.cu SplitOne); the operands here are finite by construction.
template <int P>
__device__ __forceinline__ void SplitPair(float x0, float x1, uint32_t (&r)[P]) {
#pragma unroll
  for (int p = 0; p < P; ++p) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    r[p] = *reinterpret_cast<const uint32_t*>(&h);
    if (p + 1 < P) {
      x0 -= __low2float(h);
      x1 -= __high2float(h);
    }
  }
}

// A fragment (16 × 16, row-major) of the m16n8k16 MMA at k0: fa(row, k) gives {A[row][k],
// A[row][k+1]} for even k. Lane g·4 + t holds rows g, g+8 and columns 2t, 2t+1, 2t+8, 2t+9.
template <int P, class FA>
__device__ __forceinline__ void LoadA(const FA& fa, int k0, uint32_t (&a)[P][4]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float2 x[4] = {fa(g, k0 + 2 * t), fa(g + 8, k0 + 2 * t), fa(g, k0 + 2 * t + 8), fa(g + 8, k0 + 2 * t + 8)};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    uint32_t r[P];
    SplitPair<P>(x[i].x, x[i].y, r);
#pragma unroll
    for (int p = 0; p < P; ++p) a[p][i] = r[p];
  }
}

// B fragment (16 k × 8 n) at (k0, n0): fb(k, n) gives {B[k][n], B[k+1][n]} for even k. Lane
// g·4 + t holds column g, rows 2t, 2t+1, 2t+8, 2t+9.
template <int P, class FB>
__device__ __forceinline__ void LoadB(const FB& fb, int k0, int n0, uint32_t (&b)[P][2]) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const float2 x[2] = {fb(k0 + 2 * t, n0 + g), fb(k0 + 2 * t + 8, n0 + g)};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    uint32_t r[P];
    SplitPair<P>(x[i].x, x[i].y, r);
#pragma unroll
    for (int p = 0; p < P; ++p) b[p][i] = r[p];
  }
}

__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// acc += A·B over one k16 step, as the cross products of the parts of total order < P, smallest
// first: for P = 3 into a zeroed accumulator added once (see the top of the file); for P = 1 one
// MMA straight into acc.
template <int P>
__device__ __forceinline__ void MmaSplit(float (&acc)[4], const uint32_t (&a)[P][4], const uint32_t (&b)[P][2]) {
  if constexpr (P == 3) {
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    Mma(c, a[2], b[0]);
    Mma(c, a[0], b[2]);
    Mma(c, a[1], b[1]);
    Mma(c, a[1], b[0]);
    Mma(c, a[0], b[1]);
    Mma(c, a[0], b[0]);
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += c[i];
  } else {
    static_assert(P == 1, "one or three parts");
    Mma(acc, a[0], b[0]);
  }
}

// A warp's 16 × 8·NT tile: acc[nt] += A[0:16, 0:16·k_steps] · B[0:16·k_steps, n0 + 8nt ..].
template <int P, int NT, class FA, class FB>
__device__ __forceinline__ void WarpGemm(float (&acc)[NT][4], int k_steps, const FA& fa, const FB& fb, int n0) {
  for (int ks = 0; ks < k_steps; ++ks) {
    uint32_t a[P][4];
    LoadA<P>(fa, 16 * ks, a);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t b[P][2];
      LoadB<P>(fb, 16 * ks, n0 + 8 * nt, b);
      MmaSplit<P>(acc[nt], a, b);
    }
  }
}

// Two A tiles against the same B columns (B's fragments loaded once for both).
template <int P, int NT, class FA1, class FA2, class FB>
__device__ __forceinline__ void WarpGemm2(float (&acc1)[NT][4], float (&acc2)[NT][4], int k_steps, const FA1& fa1,
                                          const FA2& fa2, const FB& fb, int n0) {
  for (int ks = 0; ks < k_steps; ++ks) {
    uint32_t a1[P][4], a2[P][4];
    LoadA<P>(fa1, 16 * ks, a1);
    LoadA<P>(fa2, 16 * ks, a2);
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      uint32_t b[P][2];
      LoadB<P>(fb, 16 * ks, n0 + 8 * nt, b);
      MmaSplit<P>(acc1[nt], a1, b);
      MmaSplit<P>(acc2[nt], a2, b);
    }
  }
}

// WarpGemm with one BF16 part whose operands come as packed pairs already: fa(row, k) gives
// {A[row][k], A[row][k+1]} and fb(k, n) gives {B[k][n], B[k+1][n]} as BF16x2 (low half first),
// so values held as BF16 go to the tensor cores without a round trip through F32.
template <int NT, class FA, class FB>
__device__ __forceinline__ void WarpGemmPacked(float (&acc)[NT][4], int k_steps, const FA& fa, const FB& fb, int n0) {
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  for (int ks = 0; ks < k_steps; ++ks) {
    const int k0 = 16 * ks;
    const uint32_t a[4] = {fa(g, k0 + 2 * t), fa(g + 8, k0 + 2 * t), fa(g, k0 + 2 * t + 8), fa(g + 8, k0 + 2 * t + 8)};
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const uint32_t b[2] = {fb(k0 + 2 * t, n0 + 8 * nt + g), fb(k0 + 2 * t + 8, n0 + 8 * nt + g)};
      Mma(acc[nt], a, b);
    }
  }
}

// Row and column of accumulator element e of n-tile nt for this lane (C layout of m16n8).
__device__ __forceinline__ int AccRow(int e) { return ((threadIdx.x & 31) >> 2) + (e >= 2 ? 8 : 0); }
__device__ __forceinline__ int AccCol(int nt, int e) { return 8 * nt + 2 * (threadIdx.x & 3) + (e & 1); }

// Asks L2 for the 128-byte line holding p (no register, no wait).
__device__ __forceinline__ void PrefetchL2(const void* p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

// The rows a block reads in the next chunk (global rows `first` .. min(first + 64, end)): q, k and
// α of head h (512 bytes each), v's VB columns, the beta logits; so the next chunk's first loads
// come from L2. Called while the tensor cores are busy with this chunk.
__device__ __forceinline__ void PrefetchNextChunk(const KdaChunkArgs& a, int64_t first, int64_t end, int64_t H,
                                                  int h, int64_t col0, int vb) {
  const int64_t rows = end - first < kChunk ? end - first : kChunk;
  const int lines_v = vb * 4 / 128, per_row = 3 * 4 + lines_v;  // 128-byte lines per row
  for (int i = threadIdx.x; i < rows * per_row; i += kThreads) {
    const int64_t r = first + i / per_row;
    const int l = i % per_row;
    const int64_t at = (r * H + h) * kDim;
    const float* p = l < 4 ? a.q + at + 32 * l
                           : l < 8 ? a.k + at + 32 * (l - 4) : l < 12 ? a.alpha + at + 32 * (l - 8) : a.v + at + col0 + 32 * (l - 12);
    PrefetchL2(p);
  }
  if (threadIdx.x < rows) PrefetchL2(a.beta_logits + (first + threadIdx.x) * H + h);
}

// The squared norms of a row of q and of k held as one float4 a lane, summed over the warp (the
// lanes' xor-butterfly sums are identical: a + b == b + a).
__device__ __forceinline__ void WarpSumSquares(float4 q, float4 k, float& sq, float& sk) {
  sq = q.x * q.x + q.y * q.y + q.z * q.z + q.w * q.w;
  sk = k.x * k.x + k.y * k.y + k.z * k.z + k.w * k.w;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    sq += __shfl_xor_sync(0xffffffffu, sq, o);
    sk += __shfl_xor_sync(0xffffffffu, sk, o);
  }
}

// The fused kernel's step 1 loads: rows r = warp + 8i (i < 8) of a chunk (global row row0 + r,
// head h; zero past len): q and k as one float4 a lane, their squared norms summed over the warp
// and β's logit. All loads are issued before any use, so their latencies overlap. (The prep
// kernel, at 80 registers, loads four rows at a time itself.)
struct WarpRows {
  static constexpr int kRows = kChunk / kWarps;
  float4 q[kRows], k[kRows];
  float sq[kRows], sk[kRows], bl[kRows];
};
__device__ __forceinline__ void LoadWarpRows(const KdaChunkArgs& a, int len, int64_t row0, int h, WarpRows& w) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < WarpRows::kRows; ++i) {
    const int r = warp + kWarps * i;
    const int64_t at = ((row0 + r) * a.heads + h) * kDim;
    w.q[i] = w.k[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    w.bl[i] = 0.0f;
    if (r < len) {
      w.q[i] = __ldg(reinterpret_cast<const float4*>(a.q + at) + lane);
      w.k[i] = __ldg(reinterpret_cast<const float4*>(a.k + at) + lane);
      w.bl[i] = __ldg(a.beta_logits + (row0 + r) * a.heads + h);
    }
  }
#pragma unroll
  for (int i = 0; i < WarpRows::kRows; ++i) WarpSumSquares(w.q[i], w.k[i], w.sq[i], w.sk[i]);
}

// A row block's decays for one channel from its 16 α: x_r = Γ_r − Γ_{m} (m = the block's
// reference row) as a direct sum outward from m, and the block's partial sums Σ α over rows
// 0 .. m (pre) and m+1 .. 15 (post), from which ChunkFactors builds the chunk-level factors.
__device__ __forceinline__ void BlockDecays(const float (&al)[kBlockRows], float (&x)[kBlockRows], float& pre,
                                            float& post) {
  x[kRef] = 0.0f;
#pragma unroll
  for (int rr = kRef + 1; rr < kBlockRows; ++rr) x[rr] = x[rr - 1] + al[rr];
#pragma unroll
  for (int rr = kRef - 1; rr >= 0; --rr) x[rr] = x[rr + 1] - al[rr + 1];
  pre = 0.0f;
  post = 0.0f;
#pragma unroll
  for (int rr = 0; rr <= kRef; ++rr) pre += al[rr];
#pragma unroll
  for (int rr = kRef + 1; rr < kBlockRows; ++rr) post += al[rr];
}

// Chunk-level decay factors per channel d = tid < 128 from the row blocks' partial sums Pre, Post
// (Σ α over rows 16i .. m_i and m_i+1 .. 16i+15): P_i = e^{Γ_{m_i}}, F_j = e^{Γ_63 − Γ_{m_j}},
// D_ij = e^{Γ_{m_i} − Γ_{m_j}} (i > j) and e^{Γ_63}, each the exp of one sum of α of one sign.
// A channel's sums are read before any of its factors is written, so Pf and Ff may be Pre and
// Post (the prep kernel's layout); Gl may be global memory (the prep's record).
__device__ __forceinline__ void ChunkFactors(const float* Pre, const float* Post, float* Pf, float* Ff, float* Df,
                                             float* Gl) {
  const int tid = threadIdx.x;
  if (tid < kDim) {
    const int d = tid;
    float pre[kBlocks], post[kBlocks], blk[kBlocks];
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      pre[i] = Pre[i * kDim + d];
      post[i] = Post[i * kDim + d];
      blk[i] = pre[i] + post[i];
    }
    float acc = 0.0f;
#pragma unroll
    for (int i = 0; i < kBlocks; ++i) {
      Pf[i * kDim + d] = expf(acc + pre[i]);
      acc += blk[i];
    }
    Gl[d] = expf(acc);
    float suf = 0.0f;
#pragma unroll
    for (int j = kBlocks - 1; j >= 0; --j) {
      Ff[j * kDim + d] = expf(post[j] + suf);
      suf += blk[j];
    }
#pragma unroll
    for (int i = 1; i < kBlocks; ++i) {
#pragma unroll
      for (int j = 0; j < i; ++j) {
        float s = post[j];
        for (int b = j + 1; b < i; ++b) s += blk[b];
        Df[PairIndex(i, j) * kDim + d] = expf(s + pre[i]);
      }
    }
  }
}

// T = (I − A)^{-1} diag(β) in place of A ([64][kTs], strictly lower triangular, zero above), by
// 16-row blocks on the CUDA cores in F32. N = (I − A)^{-1} = I + A N, unit lower triangular:
// first the diagonal blocks N_ii by forward substitution, one thread per column, then block rows
// i = 1..3: N_ij = N_ii Σ_{m=j}^{i-1} A_im N_mj. Starts and ends with every thread in step.
// Threads 64 .. 255, idle while the diagonal blocks are solved, run side(i, n) meanwhile (i =
// tid − 64 of n = 192); side must not touch Am, Tmp or Beta.
template <class Side>
__device__ __forceinline__ void InvertUnitLower(float* Am, float* Tmp, const float* Beta, const Side& side) {
  const int tid = threadIdx.x;
  {
    float n[kBlockRows] = {};
    const int i = (tid >> 4) & (kBlocks - 1), c = tid & 15;  // meaningful for tid < 64
    float* const Mi = Am + 16 * i * kTs + 16 * i;
    if (tid < 16 * kBlocks) {
#pragma unroll
      for (int rr = 0; rr < kBlockRows; ++rr) {
        float s = 0.0f;
#pragma unroll
        for (int m = 0; m < rr; ++m) s += Mi[rr * kTs + m] * n[m];  // n[m] = 0 for m < c
        n[rr] = rr < c ? 0.0f : (rr == c ? 1.0f : s);
      }
    } else {
      side(tid - 16 * kBlocks, kThreads - 16 * kBlocks);
    }
    __syncthreads();  // every column read A_ii before any is overwritten
    if (tid < 16 * kBlocks) {
#pragma unroll
      for (int rr = 0; rr < kBlockRows; ++rr) Mi[rr * kTs + c] = n[rr];
    }
    __syncthreads();
  }
  // Four columns per thread (float4 rows of N and of the scratch): i·64 threads per block row.
  for (int i = 1; i < kBlocks; ++i) {
    for (int e = tid; e < i * 64; e += kThreads) {
      const int j = e >> 6, rr = (e >> 2) & 15, c0 = (e & 3) * 4;
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int m = j; m < i; ++m) {
        const float* const arow = Am + (16 * i + rr) * kTs + 16 * m;
        const float* const nblk = Am + 16 * m * kTs + 16 * j + c0;
#pragma unroll
        for (int x = 0; x < kBlockRows; ++x) {
          const float av = arow[x];
          const float4 n4 = *reinterpret_cast<const float4*>(nblk + x * kTs);
          s.x += av * n4.x, s.y += av * n4.y, s.z += av * n4.z, s.w += av * n4.w;
        }
      }
      *reinterpret_cast<float4*>(Tmp + (j * 16 + rr) * 16 + c0) = s;
    }
    __syncthreads();
    for (int e = tid; e < i * 64; e += kThreads) {
      const int j = e >> 6, rr = (e >> 2) & 15, c0 = (e & 3) * 4;
      const float* const nrow = Am + (16 * i + rr) * kTs + 16 * i;
      float4 s = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      for (int x = 0; x <= rr; ++x) {
        const float nv = nrow[x];
        const float4 t4 = *reinterpret_cast<const float4*>(Tmp + (j * 16 + x) * 16 + c0);
        s.x += nv * t4.x, s.y += nv * t4.y, s.z += nv * t4.z, s.w += nv * t4.w;
      }
      *reinterpret_cast<float4*>(Am + (16 * i + rr) * kTs + 16 * j + c0) = s;
    }
    __syncthreads();
  }
  for (int e = tid; e < kChunk * kChunk; e += kThreads) Am[(e >> 6) * kTs + (e & 63)] *= Beta[e & 63];
  __syncthreads();
}

template <int P, int VB>
__global__ void __launch_bounds__(kThreads, 1) KdaChunkKernel(KdaChunkArgs a) {
  using L = Smem<VB>;
  constexpr int kVs = L::kVs;
  constexpr int kNvb = kDim / VB;
  constexpr int NT = VB / 16;  // n-tiles of a warp's half of the columns
  extern __shared__ float4 smem_f4[];
  float* const sm = reinterpret_cast<float*>(smem_f4);
  float* const QM = sm + L::kQm;
  float* const KM = sm + L::kKm;
  float* const KR = sm + L::kKr;
  float* const S = sm + L::kS;
  float* const Am = sm + L::kA;
  float* const Aqk = sm + L::kAqk;
  float* const Tmp = sm + L::kTmp;
  float* const Pf = sm + L::kP;
  float* const Ff = sm + L::kF;
  float* const Df = sm + L::kD;
  float* const Gl = sm + L::kGl;
  float* const Pre = sm + L::kPre;
  float* const Post = sm + L::kPost;
  float* const Beta = sm + L::kBeta;
  float* const Rq = sm + L::kRq;
  float* const Rk = sm + L::kRk;
  float* const VP = QM;  // V' [64][VB] from step 5
  float* const Y = KM;   // Y [64][VB] from step 4

  const int64_t H = a.heads;
  const int h = static_cast<int>(blockIdx.x) / kNvb, vb = static_cast<int>(blockIdx.x) % kNvb;
  const int64_t seq = blockIdx.y;
  const int64_t bos = a.cu_seqlens != nullptr ? a.cu_seqlens[seq] : 0;
  const int64_t T = a.cu_seqlens != nullptr ? a.cu_seqlens[seq + 1] - bos : a.tokens;
  const int64_t slot = a.slots != nullptr ? a.slots[seq] : 0;
  const int64_t col0 = int64_t{vb} * VB;  // first value column of this block
  float* const state = a.state + (slot * H + h) * kDim * kDim + col0;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(kDim));  // as the CPU reference computes it

  for (int i = tid; i < kDim * VB; i += kThreads) S[(i / VB) * kVs + i % VB] = state[(i / VB) * kDim + i % VB];
  __syncthreads();

  for (int64_t t0 = 0; t0 < T; t0 += kChunk) {
    const int len = static_cast<int>(T - t0 < kChunk ? T - t0 : kChunk);
    const int64_t row0 = bos + t0;
    auto base = [&](int r) { return ((row0 + r) * H + h) * kDim; };  // element (r, head h, channel 0)

    // 1. Normalized q̂, k̂ (spec §3.4: eps inside the sqrt of the sum; q scaled by 1/sqrt(K)
    //    after), one warp per row (LoadWarpRows: all loads before any shared-memory store, which
    //    the compiler could not move a load past).
    {
      WarpRows w;
      LoadWarpRows(a, len, row0, h, w);
      const float4* const qv = w.q;
      const float4* const kv = w.k;
      const float* const bl = w.bl;
#pragma unroll
      for (int i = 0; i < WarpRows::kRows; ++i) {
        const int r = warp + kWarps * i;
        const float sq = w.sq[i], sk = w.sk[i];
        const float rq = 1.0f / sqrtf(sq + 1e-6f), rk = 1.0f / sqrtf(sk + 1e-6f);
        const float4 qn = make_float4(qv[i].x * rq * q_scale, qv[i].y * rq * q_scale, qv[i].z * rq * q_scale,
                                      qv[i].w * rq * q_scale);
        const float4 kn = make_float4(kv[i].x * rk, kv[i].y * rk, kv[i].z * rk, kv[i].w * rk);
        reinterpret_cast<float4*>(QM + r * kXs)[lane] = qn;
        reinterpret_cast<float4*>(KM + r * kXs)[lane] = kn;
        reinterpret_cast<float4*>(KR + r * kXs)[lane] = kn;
        if (lane == 0) {
          Beta[r] = r < len ? KdaSigmoid(bl[i]) : 0.0f;
          Rq[r] = rq;
          Rk[r] = rk;
        }
      }
    }
    __syncthreads();

    // 2. Decays within each row block, two threads per channel (blocks 2·half, 2·half + 1):
    //    x_r = Γ_r − Γ_{m_i} as a direct sum outward from the reference row.
    bool unsafe = false;
    {
      const int d = tid & (kDim - 1), half = tid / kDim;
      float al2[2][kBlockRows];  // both blocks' loads first (see step 1)
#pragma unroll
      for (int bi = 0; bi < 2; ++bi) {
#pragma unroll
        for (int rr = 0; rr < kBlockRows; ++rr) {
          const int r = kBlockRows * (2 * half + bi) + rr;
          al2[bi][rr] = r < len ? __ldg(a.alpha + base(r) + d) : 0.0f;
        }
      }
#pragma unroll
      for (int bi = 0; bi < 2; ++bi) {
        const int i = 2 * half + bi, r0 = kBlockRows * i;
        float x[kBlockRows], pre, post;
        BlockDecays(al2[bi], x, pre, post);
#pragma unroll
        for (int rr = 0; rr < kBlockRows; ++rr) {
          unsafe |= !(fabsf(x[rr]) <= kMaxLocalExponent);
          const float e = expf(x[rr]), ei = __frcp_rn(e);  // |x| ≤ 60 where used: e and 1/e normal
          const int at = (r0 + rr) * kXs + d;
          QM[at] *= e;
          KM[at] *= e;
          KR[at] *= ei;
        }
        Pre[i * kDim + d] = pre;
        Post[i * kDim + d] = post;
      }
    }
    if (__syncthreads_or(unsafe)) {
      // Some channel decays too fast for the factored form: this chunk token by token (spec
      // §5.4 in the CPU reference's order), thread j owning state column j. The scratch lives in
      // Aqk's space, unused on this path.
      float* const kn = Aqk;
      float* const qn = Aqk + kDim;
      float* const dec = Aqk + 2 * kDim;
      for (int r = 0; r < len; ++r) {
        if (tid < kDim) {
          kn[tid] = a.k[base(r) + tid] * Rk[r];
          qn[tid] = a.q[base(r) + tid] * Rq[r] * q_scale;
          dec[tid] = expf(a.alpha[base(r) + tid]);
        }
        __syncthreads();
        if (tid < VB) {
          float p = 0.0f;
          for (int d = 0; d < kDim; ++d) {
            const float s = S[d * kVs + tid] * dec[d];
            S[d * kVs + tid] = s;
            p += kn[d] * s;
          }
          const float delta = Beta[r] * (a.v[base(r) + col0 + tid] - p);
          float out = 0.0f;
          for (int d = 0; d < kDim; ++d) {
            const float s = S[d * kVs + tid] + kn[d] * delta;
            S[d * kVs + tid] = s;
            out += qn[d] * s;
          }
          a.o[base(r) + col0 + tid] = out;
        }
        __syncthreads();
      }
      continue;
    }

    // Chunk-level factors per channel, from the blocks' sums (all sums of α of one sign).
    ChunkFactors(Pre, Post, Pf, Ff, Df, Gl);
    __syncthreads();

    // 2b. Score blocks: the 10 block pairs j ≤ i × {A, Aqk}, 20 MMA tiles over the 8 warps;
    //     the blocks above the diagonal are zero.
    for (int e = tid; e < kChunk * kChunk; e += kThreads) {
      const int r = e / kChunk, c = e % kChunk;
      if (c / kBlockRows > r / kBlockRows) Am[r * kTs + c] = Aqk[r * kTs + c] = 0.0f;
    }
    for (int u = warp; u < kBlocks * (kBlocks + 1); u += kWarps) {
      const bool is_qk = u & 1;
      int i = 0, j = u >> 1;  // pair index → (i, j), j ≤ i, row by row
      while (j > i) j -= ++i;
      float* const out = is_qk ? Aqk : Am;
      const float* const X = (is_qk ? QM : KM) + 16 * i * kXs;
      const float* const Kc = KR + 16 * j * kXs;
      const float* const scale = Df + (i > j ? PairIndex(i, j) : 0) * kDim;
      const bool scaled = i > j;
      float acc[2][4] = {};
      auto fa = [&](int row, int k) {
        const float2 x = Ld2(X + row * kXs + k);
        return scaled ? Mul2(x, Ld2(scale + k)) : x;
      };
      auto fb = [&](int k, int n) { return Ld2(Kc + n * kXs + k); };  // B[k = d][n = c] = KR[c][d]
      WarpGemm<P, 2>(acc, kDim / 16, fa, fb, 0);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * i + AccRow(e), c = 16 * j + AccCol(nt, e);
          out[r * kTs + c] = is_qk ? (r >= c ? acc[nt][e] : 0.0f) : (r > c ? -Beta[r] * acc[nt][e] : 0.0f);
        }
      }
    }
    __syncthreads();

    // 3. T = (I − A)^{-1} diag(β) in place of A.
    InvertUnitLower(Am, Tmp, Beta, [](int, int) {});

    // 4. Warp (row block rb, column half ch): Y = V − (K̂⊙e^Γ) S and O = (Q̂⊙e^Γ) S for its
    //    16 rows × VB/2 columns, S's fragments shared by the two.
    const int rb = warp >> 1, n0 = (warp & 1) * (VB / 2);
    float o[NT][4] = {};
    {
      float y[NT][4] = {};
      const float* const Pr = Pf + rb * kDim;
      const float* const Kr = KM + 16 * rb * kXs;
      const float* const Qr = QM + 16 * rb * kXs;
      auto fk = [&](int row, int k) { return Mul2(Ld2(Kr + row * kXs + k), Ld2(Pr + k)); };
      auto fq = [&](int row, int k) { return Mul2(Ld2(Qr + row * kXs + k), Ld2(Pr + k)); };
      auto fs = [&](int k, int n) { return make_float2(S[k * kVs + n], S[(k + 1) * kVs + n]); };
      PrefetchNextChunk(a, bos + t0 + kChunk, bos + T, H, h, col0, VB);
      WarpGemm2<P, NT>(y, o, kDim / 16, fk, fq, fs, n0);
      float vv[NT][4];  // all loads before the first store (see step 1)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * rb + AccRow(e);
          vv[nt][e] = r < len ? __ldg(a.v + base(r) + col0 + n0 + AccCol(nt, e)) : 0.0f;
        }
      }
      __syncthreads();  // KM's space becomes Y
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) Y[(16 * rb + AccRow(e)) * kVs + n0 + AccCol(nt, e)] = vv[nt][e] - y[nt][e];
      }
    }
    __syncthreads();

    // 5. V' = T Y (T is lower triangular: k-steps past the row block are zero).
    {
      float vp[NT][4] = {};
      const float* const Tr = Am + 16 * rb * kTs;
      auto ft = [&](int row, int k) { return Ld2(Tr + row * kTs + k); };
      auto fy = [&](int k, int n) { return make_float2(Y[k * kVs + n], Y[(k + 1) * kVs + n]); };
      WarpGemm<P, NT>(vp, rb + 1, ft, fy, n0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) VP[(16 * rb + AccRow(e)) * kVs + n0 + AccCol(nt, e)] = vp[nt][e];
      }
    }
    __syncthreads();

    // 6. O += Aqk V', stored for the real rows.
    auto fvp = [&](int k, int n) { return make_float2(VP[k * kVs + n], VP[(k + 1) * kVs + n]); };
    {
      const float* const Qk = Aqk + 16 * rb * kTs;
      auto fqk = [&](int row, int k) { return Ld2(Qk + row * kTs + k); };
      WarpGemm<P, NT>(o, rb + 1, fqk, fvp, n0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int r = 16 * rb + AccRow(e);
          if (r < len) a.o[base(r) + col0 + n0 + AccCol(nt, e)] = o[nt][e];
        }
      }
    }

    // 7. S ← e^{Γ_63} ⊙_rows S + (K̂ ⊙ e^{Γ_63 − Γ})ᵀ V': warp (32 key rows, column half). The
    //    A operand is KR transposed, scaled by F of each token's block (k and k+1 share one).
    {
      const int d0 = 32 * (warp >> 1);
      float s1[NT][4] = {}, s2[NT][4] = {};
      auto fe = [&](int dbase) {
        return [&, dbase](int row, int k) {
          const int d = dbase + row;
          const float f = Ff[(k >> 4) * kDim + d];
          return make_float2(KR[k * kXs + d] * f, KR[(k + 1) * kXs + d] * f);
        };
      };
      WarpGemm2<P, NT>(s1, s2, kChunk / 16, fe(d0), fe(d0 + 16), fvp, n0);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int c = n0 + AccCol(nt, e);
          const int da = d0 + AccRow(e), db = da + 16;
          S[da * kVs + c] = Gl[da] * S[da * kVs + c] + s1[nt][e];
          S[db * kVs + c] = Gl[db] * S[db * kVs + c] + s2[nt][e];
        }
      }
    }
    __syncthreads();
  }

  for (int i = tid; i < kDim * VB; i += kThreads) state[(i / VB) * kDim + i % VB] = S[(i / VB) * kVs + i % VB];
}

// ---------------------------------------------------------------------------------------------
// BF16 prefill mode: the chunk-parallel form (docs/cuda.md "Chunked KDA prefill"). Three kernels:
//   KdaChunkMapKernel   one block: global chunk index → (sequence, chunk within it), and each
//                       sequence's first global chunk (the chunk split is per sequence, from
//                       its own start, as above);
//   KdaChunkPrepKernel  one block per (chunk, head), all in parallel: everything that does not
//                       depend on the state, stored per chunk as BF16 (a "record", below);
//   KdaStateKernel      one block per (sequence, head, VB value columns) walking its chunks in
//                       order with its [K, VB] state slice in registers (F32):
//                         V' = U − W S,  O = Q̃ S + Aqk V',  S ← e^{Γ_63} ⊙_rows S + K̃ᵀ V',
//                       the next chunk's record streaming into shared memory (cp.async) while
//                       the tensor cores work on this one.
// With W = T (K̂ ⊙ e^Γ), U = T V, Q̃ = Q̂ ⊙ e^Γ, K̃ = K̂ ⊙ e^{Γ_63 − Γ}: V' is the spec's U − W S,
// the same function as the fused kernel above (spec §5.5).
//
// Precision: every MMA operand is one BF16 part (F32 accumulation), as FLA's chunk_kda; the
// decays, norms and the triangular solve in F32 on the CUDA cores, the state in F32 registers
// between chunks (only its operand copy is BF16). The BF16 prefill mode's inputs come from GEMMs
// on BF16-rounded activations, so this adds errors of the size its inputs already carry.
//
// Decays: a chunk the factored form can take (above) scales its operands as the fused kernel
// does; a chunk where some 8 consecutive α of a channel sum below −60 computes its scores and
// operands directly from the chunk's cumulative sums G_r = Σ_{r' ≤ r} α (every factor
// e^{G_r − G_c}, r ≥ c, and e^{G_r}, e^{G_63 − G_r} is ≤ 1: no overflow however fast the decay)
// on the CUDA cores: slower, as safe, decided by the chunk's own α alone.
//
// Batch invariance: a record depends on its own chunk's rows only; a state block's arithmetic
// per output element (k order, MMA terms) is the same for VB = 32, 64, 128; the map only moves
// where records live.

using Bf16Bits = uint16_t;  // raw BF16 in shared memory and in the records

// A record (per chunk and head), in BF16 elements: W [64][128], Q̃ [64][128], U [64][128],
// K̃ᵀ [128][64], Aqk [64][64] (zero above the diagonal), then e^{Γ_63} [128] as F32.
constexpr int kRecW = 0;
constexpr int kRecQ = kRecW + kChunk * kDim;
constexpr int kRecU = kRecQ + kChunk * kDim;
constexpr int kRecKt = kRecU + kChunk * kDim;
constexpr int kRecAqk = kRecKt + kDim * kChunk;
constexpr int kRecGl = kRecAqk + kChunk * kChunk;
constexpr size_t kRecBytes = sizeof(Bf16Bits) * kRecGl + sizeof(float) * kDim;  // 74,240
static_assert(kRecBytes % 16 == 0, "records stay 16-byte aligned for cp.async");

__device__ __forceinline__ Bf16Bits ToBf16(float x) { return static_cast<Bf16Bits>(PackBf16(x, 0.0f) & 0xffffu); }
__device__ __forceinline__ float FromBf16(Bf16Bits b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }
__device__ __forceinline__ float2 FromBf16x2(uint32_t u) {
  return make_float2(__uint_as_float(u << 16), __uint_as_float(u & 0xffff0000u));
}

// Element (row, col) of a BF16 [rows][L] array in shared memory whose 16-byte pieces are
// swizzled: piece p of row r sits at p ^ (r & 7). An ldmatrix phase (8 consecutive rows, one
// piece each) then hits 32 distinct banks, with no padding.
template <int L>
__device__ __forceinline__ int Swz(int row, int col) {
  static_assert(L == 64 || L == 128, "eight or sixteen pieces a row");
  return row * L + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}
// Four 8 × 8 BF16 matrices from shared memory (ldmatrix .x4): lane l gives the address of row
// l % 8 of matrix l / 8 (16 contiguous bytes); d[j] is matrix j in the MMA fragment layout (lane
// g·4 + t: row g, columns 2t, 2t + 1). One instruction where 4-byte loads take four.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&d)[4], const Bf16Bits* p) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(d[0]), "=r"(d[1]), "=r"(d[2]), "=r"(d[3])
               : "r"(s)
               : "memory");
}

// acc[nt] += A[r0 .. r0 + 15][0 .. 16·k_steps) · B[..][n0 + 8·nt ..] (nt < N) over swizzled BF16
// arrays: A row-major with rows of LA elements, B stored transposed (Bt[n][k], rows of LB, so a
// fragment's pairs along k are adjacent). Fragments by ldmatrix: A's four matrices are rows
// r0 + 8·(m & 1) .., columns k0 + 8·(m >> 1); one load of B covers two n-tiles, matrices rows
// n + 8·(m >> 1) .., columns k0 + 8·(m & 1). A lane's row is fixed, so only the swizzled piece
// changes with k. The k loop unrolled U times (the state kernel's register budget decides: 80
// for 3 blocks/SM).
template <int LA, int LB, int N, int U>
__device__ __forceinline__ void WarpMmaBf16(float (&acc)[N][4], const Bf16Bits* a_rows, int r0, const Bf16Bits* bt,
                                            int n0, int k_steps) {
  static_assert(N % 2 == 0, "B fragments come two n-tiles at a time");
  const int lane = threadIdx.x & 31, i = lane & 7, m = lane >> 3;
  const int ra = r0 + i + 8 * (m & 1), ca = 8 * (m >> 1);
  const int rb = n0 + i + 8 * (m >> 1), cb = 8 * (m & 1);
#pragma unroll U
  for (int ks = 0; ks < k_steps; ++ks) {
    uint32_t a[4];
    LdMatrixX4(a, a_rows + Swz<LA>(ra, 16 * ks + ca));
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      uint32_t b[4];
      LdMatrixX4(b, bt + Swz<LB>(rb + 16 * np, 16 * ks + cb));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      Mma(acc[2 * np], a, b0);
      Mma(acc[2 * np + 1], a, b1);
    }
  }
}
// The same for two A operands (rows of equal length) against one B: B's fragments loaded once.
template <int LA, int LB, int N, int U>
__device__ __forceinline__ void WarpMmaBf16x2(float (&acc1)[N][4], float (&acc2)[N][4], const Bf16Bits* a1_rows,
                                              const Bf16Bits* a2_rows, int r0, const Bf16Bits* bt, int n0,
                                              int k_steps) {
  static_assert(N % 2 == 0, "B fragments come two n-tiles at a time");
  const int lane = threadIdx.x & 31, i = lane & 7, m = lane >> 3;
  const int ra = r0 + i + 8 * (m & 1), ca = 8 * (m >> 1);
  const int rb = n0 + i + 8 * (m >> 1), cb = 8 * (m & 1);
#pragma unroll U
  for (int ks = 0; ks < k_steps; ++ks) {
    uint32_t a1[4], a2[4];
    LdMatrixX4(a1, a1_rows + Swz<LA>(ra, 16 * ks + ca));
    LdMatrixX4(a2, a2_rows + Swz<LA>(ra, 16 * ks + ca));
#pragma unroll
    for (int np = 0; np < N / 2; ++np) {
      uint32_t b[4];
      LdMatrixX4(b, bt + Swz<LB>(rb + 16 * np, 16 * ks + cb));
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
      Mma(acc1[2 * np], a1, b0);
      Mma(acc1[2 * np + 1], a1, b1);
      Mma(acc2[2 * np], a2, b0);
      Mma(acc2[2 * np + 1], a2, b1);
    }
  }
}

__device__ __forceinline__ int64_t SeqBegin(const KdaChunkArgs& a, int64_t b) {
  return a.cu_seqlens != nullptr ? a.cu_seqlens[b] : 0;
}
__device__ __forceinline__ int64_t SeqLen(const KdaChunkArgs& a, int64_t b) {
  return a.cu_seqlens != nullptr ? a.cu_seqlens[b + 1] - a.cu_seqlens[b] : a.tokens;
}

// The map, for `capacity` global chunks (KdaChunked's bound from the call's rows and batch):
// chunk_seq[g] = the sequence of chunk g (−1 past the call's chunks), chunk_idx[g] = its chunk
// within the sequence, chunk_first[b] = sequence b's first global chunk. One block; a block-wide
// inclusive scan of the sequences' chunk counts, kThreads sequences at a time.
__global__ void __launch_bounds__(kThreads, 1) KdaChunkMapKernel(KdaChunkArgs a, int capacity, int32_t* chunk_seq,
                                                              int32_t* chunk_idx, int32_t* chunk_first) {
  extern __shared__ float4 smem_f4[];
  int* const scan = reinterpret_cast<int*>(smem_f4);
  const int tid = threadIdx.x;
  int running = 0;
  for (int64_t b0 = 0; b0 < a.batch; b0 += kThreads) {
    const int64_t b = b0 + tid;
    const int n = b < a.batch ? static_cast<int>((SeqLen(a, b) + kChunk - 1) / kChunk) : 0;
    scan[tid] = n;
    __syncthreads();
    for (int off = 1; off < kThreads; off <<= 1) {
      const int x = tid >= off ? scan[tid - off] : 0;
      __syncthreads();
      scan[tid] += x;
      __syncthreads();
    }
    const int first = running + scan[tid] - n;
    if (b < a.batch) {
      chunk_first[b] = first;
      for (int c = 0; c < n && first + c < capacity; ++c) {
        chunk_seq[first + c] = static_cast<int32_t>(b);
        chunk_idx[first + c] = c;
      }
    }
    running += scan[kThreads - 1];
    __syncthreads();  // scan is rewritten next round
  }
  if (running > capacity) __trap();  // a.tokens below the rows cu_seqlens names: KdaChunked's contract
  for (int g = running + tid; g < capacity; g += kThreads) chunk_seq[g] = -1;
}

// 2^{x log2 e} on the MUFU with subnormal results flushed (ex2.approx.ftz: no range fix-up, as
// __expf is without -ftz). The prep's factored path uses it at |x| ≤ 60 only, where e^x is normal.
__device__ __forceinline__ float ExpFtz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504f));
  return y;
}

// Shared memory of the prep kernel, in bytes: 75,008, so three blocks fit on an SM (228 KB).
// KM, QM, KR: BF16 [64][128], unpadded and swizzled (Swz<128>: the 8 rows of an ldmatrix phase,
// or of a fragment's 4-byte loads, hit 32 distinct banks); from the W and U products on, QM's
// space holds V (BF16 [64][128], swizzled). Am: A, then T, F32 [64][kTs]. The small arrays
// share space by phase: 1/‖q‖, 1/‖k‖ (steps 1-2), then D (the score blocks), then the solve's
// scratch; Pre, Post (step 2) become P, F in place (ChunkFactors); e^{Γ_63} goes straight to
// the record.
struct PrepSmem {
  static constexpr int kKm = 0;
  static constexpr int kQm = kKm + 2 * kChunk * kDim;
  static constexpr int kKr = kQm + 2 * kChunk * kDim;
  static constexpr int kV = kQm;
  static constexpr int kA = kKr + 2 * kChunk * kDim;  // A, then T: F32 [64][kTs]
  static constexpr int kD = kA + 4 * kChunk * kTs;    // D [6][128]; before it Rq, Rk; after it Tmp
  static constexpr int kRq = kD;
  static constexpr int kRk = kRq + 4 * kChunk;
  static constexpr int kTmp = kD;
  static constexpr int kP = kD + 4 * 6 * kDim;        // Pre, then P [4][128]
  static constexpr int kF = kP + 4 * kBlocks * kDim;  // Post, then F [4][128]
  static constexpr int kBeta = kF + 4 * kBlocks * kDim;
  static constexpr size_t kBytes = kBeta + 4 * kChunk;
  static_assert(4 * kSolveTmp <= kP - kD && kRk + 4 * kChunk <= kP, "Rq, Rk and the solve's scratch fit in D's space");
  static_assert(3 * (kBytes + 1024) <= 228 * 1024, "three blocks an SM (1 KB of each is the driver's)");
  // The direct path's F32 scratch (cumulative sums G [64][128], one 16-channel slice of q̂, k̂
  // [64][16] each) in KM, QM and KR's space.
  static_assert(4 * (kChunk * kDim + 2 * kChunk * 16) <= kA, "the direct path's scratch fits");
};

// One work item of the prep kernel: global chunk g, head h (nothing for a g past the call's
// chunks). Eight warps; every phase spreads its work over all of them.
__device__ __forceinline__ void PrepChunk(const KdaChunkArgs& a, int g, int h, const int32_t* chunk_seq,
                                          const int32_t* chunk_idx, uint8_t* records) {
  using L = PrepSmem;
  extern __shared__ float4 smem_f4[];
  uint8_t* const sm = reinterpret_cast<uint8_t*>(smem_f4);
  Bf16Bits* const KM = reinterpret_cast<Bf16Bits*>(sm + L::kKm);
  Bf16Bits* const QM = reinterpret_cast<Bf16Bits*>(sm + L::kQm);
  Bf16Bits* const KR = reinterpret_cast<Bf16Bits*>(sm + L::kKr);
  Bf16Bits* const VS = reinterpret_cast<Bf16Bits*>(sm + L::kV);
  float* const Am = reinterpret_cast<float*>(sm + L::kA);
  float* const Tmp = reinterpret_cast<float*>(sm + L::kTmp);
  float* const Df = reinterpret_cast<float*>(sm + L::kD);
  float* const Rq = reinterpret_cast<float*>(sm + L::kRq);
  float* const Rk = reinterpret_cast<float*>(sm + L::kRk);
  float* const Pre = reinterpret_cast<float*>(sm + L::kP);
  float* const Post = reinterpret_cast<float*>(sm + L::kF);
  float* const Pf = Pre;
  float* const Ff = Post;
  float* const Beta = reinterpret_cast<float*>(sm + L::kBeta);

  const int32_t seq = chunk_seq[g];
  if (seq < 0) return;
  const int64_t t0 = int64_t{chunk_idx[g]} * kChunk;
  const int64_t T = SeqLen(a, seq);
  const int len = static_cast<int>(T - t0 < kChunk ? T - t0 : kChunk);
  const int64_t row0 = SeqBegin(a, seq) + t0;
  // Row r of the chunk (head h) is r·rs past row 0: 32-bit offsets (r·rs < 64 · 65535 · 128).
  const int rs = static_cast<int>(a.heads) * kDim;
  const int64_t at0 = (row0 * a.heads + h) * kDim;
  const float* const qg = a.q + at0;
  const float* const kg = a.k + at0;
  const float* const vg = a.v + at0;
  const float* const alg = a.alpha + at0;
  Bf16Bits* const rec = reinterpret_cast<Bf16Bits*>(records + (int64_t{g} * a.heads + h) * static_cast<int64_t>(kRecBytes));
  float* const rec_gl = reinterpret_cast<float*>(rec + kRecGl);
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(kDim));

  // 1. The rows' 1/‖q‖ (times 1/sqrt(K)), 1/‖k‖ (spec §3.4, eps inside the sqrt) and β: warp w
  //    sums rows w + 8i (i < 8), four at a time (registers), and lane i < 8 finishes row w + 8i;
  //    the values themselves are read again in step 2 (from L2). α's rows (four 128-byte lines
  //    each) are asked into L2 now for step 2, so its HBM reads overlap q's and k's.
  if (tid < 4 * len) PrefetchL2(alg + (tid >> 2) * rs + 32 * (tid & 3));
  {
    const int my_row = warp + kWarps * lane;  // lanes < 8
    const float bl = lane < WarpRows::kRows && my_row < len ? __ldg(a.beta_logits + (row0 + my_row) * a.heads + h) : 0.0f;
    float sq[WarpRows::kRows], sk[WarpRows::kRows];
    // Row pointers stepped by 8 rows (a 64-bit add each, not an address from r·rs).
    const float4* qp = reinterpret_cast<const float4*>(qg + warp * rs) + lane;
    const float4* kp = reinterpret_cast<const float4*>(kg + warp * rs) + lane;
#pragma unroll
    for (int i0 = 0; i0 < WarpRows::kRows; i0 += 4) {
      float4 qv[4], kv[4];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        qv[j] = kv[j] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (warp + kWarps * (i0 + j) < len) {
          qv[j] = __ldg(qp);
          kv[j] = __ldg(kp);
        }
        qp += 2 * rs;  // 8 rows of rs floats, in float4s
        kp += 2 * rs;
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) WarpSumSquares(qv[j], kv[j], sq[i0 + j], sk[i0 + j]);
    }
    float my_sq = sq[0], my_sk = sk[0];
#pragma unroll
    for (int i = 1; i < WarpRows::kRows; ++i) {
      if (lane == i) my_sq = sq[i], my_sk = sk[i];
    }
    if (lane < WarpRows::kRows) {
      Beta[my_row] = my_row < len ? KdaSigmoid(bl) : 0.0f;
      Rq[my_row] = q_scale * rsqrtf(my_sq + 1e-6f);
      Rk[my_row] = rsqrtf(my_sk + 1e-6f);
    }
  }
  __syncthreads();

  // 2. Decays within each row block as in the fused kernel (x_r = Γ_r − Γ_{m_i}, a direct sum
  //    outward from the reference row): thread (channels 2p, 2p + 1; row block i) with p = tid %
  //    64, i = tid / 64. The operands QM, KM, KR are written as BF16 pairs (each is rounded to
  //    BF16 as an MMA operand anyway).
  bool unsafe = false;
  {
    const int c2 = 2 * (tid & 63), i = tid >> 6, r0 = kBlockRows * i;
    float x0[kBlockRows], x1[kBlockRows];
    {
      float al0[kBlockRows], al1[kBlockRows], pre0, post0, pre1, post1;
      const float2* ap = reinterpret_cast<const float2*>(alg + r0 * rs + c2);
#pragma unroll
      for (int rr = 0; rr < kBlockRows; ++rr, ap += rs / 2) {
        float2 al = make_float2(0.0f, 0.0f);
        if (r0 + rr < len) al = __ldg(ap);
        al0[rr] = al.x;
        al1[rr] = al.y;
      }
      BlockDecays(al0, x0, pre0, post0);
      BlockDecays(al1, x1, pre1, post1);
      *reinterpret_cast<float2*>(Pre + i * kDim + c2) = make_float2(pre0, pre1);
      *reinterpret_cast<float2*>(Post + i * kDim + c2) = make_float2(post0, post1);
    }
    const float2* qp = reinterpret_cast<const float2*>(qg + r0 * rs + c2);
    const float2* kp = reinterpret_cast<const float2*>(kg + r0 * rs + c2);
#pragma unroll
    for (int rr = 0; rr < kBlockRows; ++rr, qp += rs / 2, kp += rs / 2) {
      const int r = r0 + rr;
      float2 qd = make_float2(0.0f, 0.0f), kd = qd;
      if (r < len) {
        qd = __ldg(qp);
        kd = __ldg(kp);
      }
      unsafe |= !(fabsf(x0[rr]) <= kMaxLocalExponent) || !(fabsf(x1[rr]) <= kMaxLocalExponent);
      // The fast exponential (relative error ~1e-6 at |x| ≤ 60) for operands rounded to BF16.
      const float e0 = ExpFtz(x0[rr]), e1 = ExpFtz(x1[rr]), ei0 = ExpFtz(-x0[rr]), ei1 = ExpFtz(-x1[rr]);
      const float rq = Rq[r], rk = Rk[r];
      const float k0 = kd.x * rk, k1 = kd.y * rk;
      const int at = Swz<kDim>(r, c2);
      *reinterpret_cast<uint32_t*>(QM + at) = PackBf16(qd.x * rq * e0, qd.y * rq * e1);
      *reinterpret_cast<uint32_t*>(KM + at) = PackBf16(k0 * e0, k1 * e1);
      *reinterpret_cast<uint32_t*>(KR + at) = PackBf16(k0 * ei0, k1 * ei1);
    }
  }
  Bf16Bits* const rec_aqk = rec + kRecAqk;
  if (!__syncthreads_or(unsafe)) {
    ChunkFactors(Pre, Post, Pf, Ff, Df, rec_gl);
    __syncthreads();
    // Score blocks: the 10 block pairs j ≤ i × {A, Aqk} (the fused kernel's step 2b with one
    // BF16 part, fragments by ldmatrix); A into shared memory for the solve, Aqk straight into
    // the record. Aqk's six blocks above the diagonal are zero
    // (16-byte stores: block b's 16 rows × 2 pieces); A's are never read.
    if (tid < 6 * 32) {
      const int b = tid >> 5, i = b < 3 ? 0 : b < 5 ? 1 : 2, j = b < 3 ? b + 1 : b < 5 ? b - 1 : 3;
      *reinterpret_cast<uint4*>(rec_aqk + (16 * i + ((tid & 31) >> 1)) * kChunk + 16 * j + 8 * (tid & 1)) =
          make_uint4(0u, 0u, 0u, 0u);
    }
    // Warp w < 6 takes the block pair (i, j), i > j, of PairIndex w; warps 6 and 7 two diagonal
    // blocks each (a quarter of the work: no scaling). A pair's A and Aqk share the B operand
    // KR_j, scaled by D_ij (per channel k) once for both.
    const int t = lane & 3;
    const int pairs = warp < 6 ? 1 : 2;
    for (int pr = 0; pr < pairs; ++pr) {
      int i = 2 * (warp - 6) + pr, j = i;
      if (warp < 6) {
        i = warp < 1 ? 1 : warp < 3 ? 2 : 3;
        j = warp - PairIndex(i, 0);
      }
      const bool scaled = i > j;
      const float* const scale = Df + (scaled ? PairIndex(i, j) : 0) * kDim;
      // ldmatrix rows: A's matrix m = lane / 8 is rows 16i + 8(m & 1) .., columns 8(m >> 1) ..;
      // B's (KR's rows are B's columns) rows 16j + 8(m >> 1) .., columns 8(m & 1) ...
      const int ra = 16 * i + (lane & 7) + 8 * ((lane >> 3) & 1), ca = 8 * (lane >> 4);
      const int rb = 16 * j + (lane & 7) + 8 * (lane >> 4), cb = 8 * ((lane >> 3) & 1);
      float acc_k[2][4] = {}, acc_q[2][4] = {};
#pragma unroll 2
      for (int ks = 0; ks < kDim / 16; ++ks) {
        uint32_t fk[4], fq[4], fb[4];
        LdMatrixX4(fb, KR + Swz<kDim>(rb, 16 * ks + cb));
        LdMatrixX4(fk, KM + Swz<kDim>(ra, 16 * ks + ca));
        LdMatrixX4(fq, QM + Swz<kDim>(ra, 16 * ks + ca));
        if (scaled) {  // register m: columns (k) 16ks + 8(m & 1) + 2t, + 1
          const float2 s0 = Ld2(scale + 16 * ks + 2 * t), s1 = Ld2(scale + 16 * ks + 8 + 2 * t);
#pragma unroll
          for (int m = 0; m < 4; ++m) {
            const float2 y = Mul2(FromBf16x2(fb[m]), m & 1 ? s1 : s0);
            fb[m] = PackBf16(y.x, y.y);
          }
        }
        const uint32_t b0[2] = {fb[0], fb[1]}, b1[2] = {fb[2], fb[3]};
        Mma(acc_k[0], fk, b0);
        Mma(acc_k[1], fk, b1);
        Mma(acc_q[0], fq, b0);
        Mma(acc_q[1], fq, b1);
      }
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = 16 * i + AccRow(e), c = 16 * j + AccCol(nt, e);  // c even: c, c + 1
          *reinterpret_cast<uint32_t*>(rec_aqk + r * kChunk + c) =
              PackBf16(r >= c ? acc_q[nt][e] : 0.0f, r >= c + 1 ? acc_q[nt][e + 1] : 0.0f);
          *reinterpret_cast<float2*>(Am + r * kTs + c) = make_float2(
              r > c ? -Beta[r] * acc_k[nt][e] : 0.0f, r > c + 1 ? -Beta[r] * acc_k[nt][e + 1] : 0.0f);
        }
      }
    }
  } else {
    // Direct path (a channel decays too fast for the factored form): scores from the
    // cumulative sums on the CUDA cores, thread tid owning entries (r, c) = (tid / 64 + 4m,
    // tid % 64), m < 16; then the operands with factors 1 (P = F = 1, e^{Γ_63} from G).
    float* const G = reinterpret_cast<float*>(sm + L::kKm);  // [64][128]
    float* const qs = G + kChunk * kDim;                     // q̂, k̂ of 16 channels [64][16]
    float* const ks = qs + kChunk * 16;
    if (tid < kDim) {
      float acc = 0.0f;
      for (int r = 0; r < kChunk; ++r) {
        acc += r < len ? alg[r * rs + tid] : 0.0f;
        G[r * kDim + tid] = acc;
      }
    }
    float sa[16] = {}, sq[16] = {};
    const int c = tid & 63;
    for (int d0 = 0; d0 < kDim; d0 += 16) {
      __syncthreads();  // G written; the previous slice read
      for (int e = tid; e < kChunk * 16; e += kThreads) {
        const int r = e >> 4, dd = e & 15;
        qs[e] = r < len ? qg[r * rs + d0 + dd] * Rq[r] : 0.0f;
        ks[e] = r < len ? kg[r * rs + d0 + dd] * Rk[r] : 0.0f;
      }
      __syncthreads();
#pragma unroll
      for (int m = 0; m < 16; ++m) {
        const int r = (tid >> 6) + 4 * m;
        if (c > r) continue;
        for (int dd = 0; dd < 16; ++dd) {
          const float f = expf(G[r * kDim + d0 + dd] - G[c * kDim + d0 + dd]);  // ≤ 1
          const float kc = ks[c * 16 + dd] * f;
          sq[m] += qs[r * 16 + dd] * kc;
          sa[m] += ks[r * 16 + dd] * kc;
        }
      }
    }
#pragma unroll
    for (int m = 0; m < 16; ++m) {
      const int r = (tid >> 6) + 4 * m;
      Am[r * kTs + c] = r > c ? -Beta[r] * sa[m] : 0.0f;
      rec_aqk[r * kChunk + c] = ToBf16(r >= c ? sq[m] : 0.0f);
    }
    const float g63 = tid < kDim ? G[(kChunk - 1) * kDim + tid] : 0.0f;
    __syncthreads();  // G read: KM, QM, KR's space becomes the operands again
    if (tid < kDim) {
      const int d = tid;
      float acc = 0.0f;  // G again, the same additions in the same order
      for (int r = 0; r < kChunk; ++r) {
        const bool in = r < len;
        acc += in ? alg[r * rs + d] : 0.0f;
        const float kn = in ? kg[r * rs + d] * Rk[r] : 0.0f, qn = in ? qg[r * rs + d] * Rq[r] : 0.0f;
        const float e = expf(acc);
        const int at = Swz<kDim>(r, d);
        QM[at] = ToBf16(qn * e);
        KM[at] = ToBf16(kn * e);
        KR[at] = ToBf16(kn * expf(g63 - acc));
      }
      for (int i = 0; i < kBlocks; ++i) Pf[i * kDim + d] = Ff[i * kDim + d] = 1.0f;
      rec_gl[d] = expf(g63);
    }
  }
  __syncthreads();

  // 3. T = (I − A)^{-1} diag(β) in place of A (F32). Meanwhile the threads the diagonal blocks
  //    leave idle write the record's Q̃ = QM·P and K̃ᵀ = (KR·F)ᵀ, a 16-byte piece at a time:
  //    pieces 0 .. 1023 are Q̃'s (row r, channels 8p ..), 1024 .. 2047 K̃ᵀ's (channel d, rows 8p
  //    .., one row block: one F).
  auto write_q_kt = [&](int first, int step) {
    for (int e = first; e < 2 * kChunk * kDim / 8; e += step) {
      uint32_t w[4];
      if (e < kChunk * kDim / 8) {
        const int r = e >> 4, c = 8 * (e & 15);
        const uint4 x = *reinterpret_cast<const uint4*>(QM + Swz<kDim>(r, c));
        const uint32_t xs[4] = {x.x, x.y, x.z, x.w};
        const float* const p = Pf + (r / kBlockRows) * kDim + c;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          const float2 y = Mul2(FromBf16x2(xs[m]), Ld2(p + 2 * m));
          w[m] = PackBf16(y.x, y.y);
        }
        *reinterpret_cast<uint4*>(rec + kRecQ + r * kDim + c) = make_uint4(w[0], w[1], w[2], w[3]);
      } else {
        const int d = (e - kChunk * kDim / 8) & (kDim - 1), r = 8 * ((e - kChunk * kDim / 8) >> 7);
        const float f = Ff[(r / kBlockRows) * kDim + d];
#pragma unroll
        for (int m = 0; m < 4; ++m) {
          w[m] = PackBf16(FromBf16(KR[Swz<kDim>(r + 2 * m, d)]) * f, FromBf16(KR[Swz<kDim>(r + 2 * m + 1, d)]) * f);
        }
        *reinterpret_cast<uint4*>(rec + kRecKt + d * kChunk + r) = make_uint4(w[0], w[1], w[2], w[3]);
      }
    }
  };
  if (tid < 4 * len) PrefetchL2(vg + (tid >> 2) * rs + 32 * (tid & 3));  // V's rows, for step 4
  InvertUnitLower(Am, Tmp, Beta, write_q_kt);

  // 4. V (rows past the end zero) as BF16 into QM's space, row-major: warp w rows w + 8i, a
  //    lane's 4 channels (asked into L2 before the solve).
  {
    float4 v[WarpRows::kRows];
    const float4* vp = reinterpret_cast<const float4*>(vg + warp * rs) + lane;
#pragma unroll
    for (int i = 0; i < WarpRows::kRows; ++i, vp += 2 * rs) {
      v[i] = warp + kWarps * i < len ? __ldg(vp) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }
#pragma unroll
    for (int i = 0; i < WarpRows::kRows; ++i) {
      *reinterpret_cast<uint2*>(VS + Swz<kDim>(warp + kWarps * i, 4 * lane)) =
          make_uint2(PackBf16(v[i].x, v[i].y), PackBf16(v[i].z, v[i].w));
    }
  }
  __syncthreads();

  // 5. W = T (K̂ ⊙ e^Γ) and U = T V: warp w owns columns 16w .. 16w + 15 of both for all four
  //    row blocks (T is lower triangular: k-steps up to the row block; 10 a warp). B fragments
  //    by ldmatrix .trans from the row-major KM and V. e^{Γ_k} = e^{x_k} P_{blk(k)}: KM holds
  //    k̂ e^{x}, so each k-step's product (one row block of k) is scaled by its P per column
  //    after the MMA, in F32.
  {
    const int n0 = 16 * warp, gq = lane >> 2, t = lane & 3;
    // ldmatrix .trans rows: matrix m = lane / 8 is rows (k) 8(m & 1) .., columns n0 + 8(m >> 1) ..
    const int rk = (lane & 7) + 8 * ((lane >> 3) & 1), ck = n0 + 8 * (lane >> 4);
    auto store = [&](const float (&acc)[2][4], Bf16Bits* out, int rb) {
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          *reinterpret_cast<uint32_t*>(out + (16 * rb + AccRow(e)) * kDim + n0 + AccCol(nt, e)) =
              PackBf16(acc[nt][e], acc[nt][e + 1]);
        }
      }
    };
#pragma unroll 1
    for (int rb = 0; rb < kBlocks; ++rb) {
      float w[2][4] = {}, u[2][4] = {};
      const float* const Tr = Am + (16 * rb + gq) * kTs + 2 * t;
      for (int ks = 0; ks <= rb; ++ks) {
        uint32_t fa[4], fk[4], fv[4];
#pragma unroll
        for (int m = 0; m < 4; ++m) {  // rows gq + 8(m & 1), columns 16ks + 2t + 8(m >> 1)
          const float2 x = Ld2(Tr + 8 * (m & 1) * kTs + 16 * ks + 8 * (m >> 1));
          fa[m] = PackBf16(x.x, x.y);
        }
        Ldmatrix4Trans(fk, KM + Swz<kDim>(16 * ks + rk, ck));
        Ldmatrix4Trans(fv, VS + Swz<kDim>(16 * ks + rk, ck));
        float p[2][4] = {};
        const uint32_t k0[2] = {fk[0], fk[1]}, k1[2] = {fk[2], fk[3]}, v0[2] = {fv[0], fv[1]}, v1[2] = {fv[2], fv[3]};
        Mma(p[0], fa, k0);
        Mma(p[1], fa, k1);
        Mma(u[0], fa, v0);
        Mma(u[1], fa, v1);
#pragma unroll
        for (int nt = 0; nt < 2; ++nt) {
          const float2 pk = Ld2(Pf + ks * kDim + n0 + 8 * nt + 2 * t);
          w[nt][0] += p[nt][0] * pk.x;
          w[nt][1] += p[nt][1] * pk.y;
          w[nt][2] += p[nt][2] * pk.x;
          w[nt][3] += p[nt][3] * pk.y;
        }
      }
      store(w, rec + kRecW, rb);
      store(u, rec + kRecU, rb);
    }
  }
}

// Persistent over the work items (chunk, head), item = g·H + h < 2^31 (LaunchChunkParallel's
// check): block b takes b, b + gridDim.x, ... (an item's arithmetic is the same whichever block
// takes it). kMinBlocks = 3 (80 registers, the default) or 2 (128 registers, the A/B build
// KdaChunkPrepOnly offers). No L2 prefetch of the next item's rows: at 3 blocks an SM the other
// blocks cover an item's first loads, and 396 items' rows in flight (128 KB each) already fill
// most of the 50 MB L2 the records also stream through.
template <int kMinBlocks>
__global__ void __launch_bounds__(kThreads, kMinBlocks)
    KdaChunkPrepKernel(KdaChunkArgs a, int64_t items, const int32_t* chunk_seq, const int32_t* chunk_idx,
                       uint8_t* records) {
  const int H = static_cast<int>(a.heads);
  for (int64_t item = blockIdx.x; item < items; item += gridDim.x) {
    // No barrier between items: the next item's first phase writes only β, 1/‖q‖ and 1/‖k‖,
    // which this item's last phase (W, U) does not read, and its first barrier waits for every
    // warp; so a warp done with W and U starts the next item's loads at once.
    PrepChunk(a, static_cast<int>(item) / H, static_cast<int>(item) % H, chunk_seq, chunk_idx, records);
  }
}

// Shared memory of the state kernel, in bytes; BF16 arrays swizzled (Swz), unpadded except U.
// Set A (W, Q̃, U's VB columns) is read by the first products of a chunk (V' = U − W S, Q̃ S),
// set B (K̃ᵀ, Aqk, e^{Γ_63}) by the last ones: each streams in while the other is in use.
template <int VB>
struct StateSmem {
  static constexpr int kUs = VB + 8;  // U's row stride: 16-byte rows, fragment rows on distinct banks
  static constexpr int kW = 0;
  static constexpr int kQ = kW + 2 * kChunk * kDim;
  static constexpr int kU = kQ + 2 * kChunk * kDim;
  static constexpr int kKt = kU + 2 * kChunk * kUs;
  static constexpr int kAqk = kKt + 2 * kDim * kChunk;
  static constexpr int kGl = kAqk + 2 * kChunk * kChunk;
  static constexpr int kSt = kGl + 4 * kDim;  // S transposed, BF16 [VB][128]
  static constexpr int kVt = kSt + 2 * VB * kDim;  // V' transposed, BF16 [VB][64]
  static constexpr size_t kBytes = kVt + 2 * VB * kChunk;
  static_assert(kU % 16 == 0 && kKt % 16 == 0 && kGl % 16 == 0 && kSt % 16 == 0, "16-byte pieces");
};

template <int VB>
__global__ void __launch_bounds__(kThreads, VB == 32 ? 3 : VB == 64 ? 2 : 1)
    KdaStateKernel(KdaChunkArgs a, const int32_t* chunk_first, const uint8_t* records) {
  using L = StateSmem<VB>;
  constexpr int kNvb = kDim / VB;
  constexpr int NT = VB / 16;  // n-tiles of a warp's half of the columns (W S, Q̃ S, Aqk V')
  constexpr int NS = VB / 8;   // n-tiles of a warp's state rows (all VB columns)
  // The k loops over S unrolled twice where registers allow (VB = 32 has 80 for 3 blocks/SM).
  constexpr int kUnrollS = VB == 32 ? 1 : 2;
  extern __shared__ float4 smem_f4[];
  uint8_t* const sm = reinterpret_cast<uint8_t*>(smem_f4);
  Bf16Bits* const Ws = reinterpret_cast<Bf16Bits*>(sm + L::kW);
  Bf16Bits* const Qs = reinterpret_cast<Bf16Bits*>(sm + L::kQ);
  Bf16Bits* const Us = reinterpret_cast<Bf16Bits*>(sm + L::kU);
  Bf16Bits* const Kts = reinterpret_cast<Bf16Bits*>(sm + L::kKt);
  Bf16Bits* const Aqs = reinterpret_cast<Bf16Bits*>(sm + L::kAqk);
  float* const Gls = reinterpret_cast<float*>(sm + L::kGl);
  Bf16Bits* const St = reinterpret_cast<Bf16Bits*>(sm + L::kSt);
  Bf16Bits* const Vt = reinterpret_cast<Bf16Bits*>(sm + L::kVt);

  const int64_t H = a.heads;
  const int h = static_cast<int>(blockIdx.x) / kNvb, vb = static_cast<int>(blockIdx.x) % kNvb;
  const int64_t seq = blockIdx.y;
  const int64_t T = SeqLen(a, seq);
  if (T <= 0) return;  // the state keeps its bits
  const int64_t bos = SeqBegin(a, seq);
  const int64_t slot = a.slots != nullptr ? a.slots[seq] : 0;
  const int col0 = vb * VB;
  float* const state = a.state + (slot * H + h) * kDim * kDim + col0;
  const int nch = static_cast<int>((T + kChunk - 1) / kChunk);
  const int64_t first = chunk_first[seq];
  const int tid = threadIdx.x, warp = tid >> 5;
  auto record = [&](int c) {
    return reinterpret_cast<const Bf16Bits*>(records + ((first + c) * H + h) * static_cast<int64_t>(kRecBytes));
  };
  // Piece p of row r goes to its swizzled place; a thread's rows step by a multiple of 8, so
  // r & 7 and with it the swizzle stay fixed and every address is a constant offset from the
  // first (few registers).
  constexpr int kUPieces = VB / 8;  // 16-byte pieces of a row of U's VB columns
  auto load_a = [&](const Bf16Bits* rec) {  // W, Q̃ (16 pieces a row), U's columns
    const int r = tid / 16, p = tid % 16;
#pragma unroll
    for (int j = 0; j < kChunk / 16; ++j) {
      CpAsync16(Ws + Swz<kDim>(r, 8 * p) + 16 * j * kDim, rec + kRecW + (r + 16 * j) * kDim + 8 * p);
      CpAsync16(Qs + Swz<kDim>(r, 8 * p) + 16 * j * kDim, rec + kRecQ + (r + 16 * j) * kDim + 8 * p);
    }
    const int ru = tid / kUPieces, pu = tid % kUPieces;
#pragma unroll
    for (int j = 0; j < kChunk * kUPieces / kThreads; ++j) {
      const int row = ru + j * (kThreads / kUPieces);
      CpAsync16(Us + row * L::kUs + 8 * pu, rec + kRecU + row * kDim + col0 + 8 * pu);
    }
  };
  auto load_b = [&](const Bf16Bits* rec) {  // K̃ᵀ, Aqk (8 pieces a row); e^{Γ_63}
    const int r8 = tid / 8, p8 = tid % 8;
#pragma unroll
    for (int j = 0; j < kDim / 32; ++j) {
      CpAsync16(Kts + Swz<kChunk>(r8, 8 * p8) + 32 * j * kChunk, rec + kRecKt + (r8 + 32 * j) * kChunk + 8 * p8);
    }
#pragma unroll
    for (int j = 0; j < kChunk / 32; ++j) {
      CpAsync16(Aqs + Swz<kChunk>(r8, 8 * p8) + 32 * j * kChunk, rec + kRecAqk + (r8 + 32 * j) * kChunk + 8 * p8);
    }
    if (tid < kDim / 4) CpAsync16(Gls + 4 * tid, rec + kRecGl + 8 * tid);
  };
  // Records come from HBM (the prep kernel's output is far larger than L2): one bulk prefetch
  // into L2 two chunks ahead hides that latency behind this chunk's work.
  auto prefetch = [&](int c) {
    if (tid == 0 && c < nch) mma::PrefetchL2(record(c), static_cast<uint32_t>(kRecBytes));
  };
  static_assert(kThreads % kUPieces == 0 && (kChunk * kUPieces) % kThreads == 0, "U's pieces split evenly");

  // The state slice: warp w holds key rows 16w .. 16w + 15, all VB columns, as MMA accumulators;
  // St is its BF16 copy, transposed (the B operand of W S and Q̃ S).
  // Column AccCol(nt, e) ≡ AccCol(0, e) (mod 8), so the swizzle of element (nt, e) of a
  // transposed store is element (0, e)'s plus 8·nt rows: four offsets a thread keeps.
  float s[NS][4];
  auto store_st = [&] {
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      Bf16Bits* const at = St + Swz<kDim>(AccCol(0, e), 16 * warp + AccRow(e));
#pragma unroll
      for (int nt = 0; nt < NS; ++nt) at[8 * nt * kDim] = ToBf16(s[nt][e]);
    }
  };
#pragma unroll
  for (int nt = 0; nt < NS; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) s[nt][e] = state[(16 * warp + AccRow(e)) * kDim + AccCol(nt, e)];
  }
  store_st();
  load_a(record(0));
  CpAsyncCommit();
  prefetch(1);

  const int rb = warp >> 1, n0 = (warp & 1) * (VB / 2);
  for (int c = 0; c < nch; ++c) {
    CpAsyncWait<0>();
    __syncthreads();  // set A of chunk c and St in place; every warp is past chunk c − 1's set B
    load_b(record(c));
    CpAsyncCommit();
    prefetch(c + 2);

    // V' = U − W S and O = Q̃ S for 16 rows × VB/2 columns: at VB = 64, 128 in one pass (S's
    // fragments shared); at VB = 32 one after the other (y and o never live together, so 80
    // registers hold 3 blocks an SM without spilling).
    float y[NT][4] = {}, o[NT][4] = {};
    if constexpr (VB == 32) {
      WarpMmaBf16<kDim, kDim, NT, kUnrollS>(y, Ws, 16 * rb, St, n0, kDim / 16);
    } else {
      WarpMmaBf16x2<kDim, kDim, NT, kUnrollS>(y, o, Ws, Qs, 16 * rb, St, n0, kDim / 16);
    }
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * rb + AccRow(e), col = n0 + AccCol(0, e);
      const int vt_at = Swz<kChunk>(col, r), u_at = r * L::kUs + col;  // n0 ≡ 0 (mod 8)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        Vt[vt_at + 8 * nt * kChunk] = ToBf16(FromBf16(Us[u_at + 8 * nt]) - y[nt][e]);
      }
    }
    if constexpr (VB == 32) WarpMmaBf16<kDim, kDim, NT, kUnrollS>(o, Qs, 16 * rb, St, n0, kDim / 16);
    __syncthreads();  // V' in place; every warp is done with set A and St
    if (c + 1 < nch) load_a(record(c + 1));
    CpAsyncCommit();
    CpAsyncWait<1>();
    __syncthreads();  // set B of chunk c in place

    // O += Aqk V' (lower triangular: k-steps up to the row block), stored for the real rows.
    {
      const int64_t t0 = int64_t{c} * kChunk;
      const int len = static_cast<int>(T - t0 < kChunk ? T - t0 : kChunk);
      WarpMmaBf16<kChunk, kChunk, NT, 1>(o, Aqs, 16 * rb, Vt, n0, rb + 1);
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
#pragma unroll
        for (int e = 0; e < 4; e += 2) {
          const int r = 16 * rb + AccRow(e);
          if (r < len) {
            *reinterpret_cast<float2*>(a.o + ((bos + t0 + r) * H + h) * kDim + col0 + n0 + AccCol(nt, e)) =
                make_float2(o[nt][e], o[nt][e + 1]);
          }
        }
      }
    }
    // S ← e^{Γ_63} ⊙_rows S + K̃ᵀ V' (warp: its 16 key rows, all VB columns), then its BF16 copy
    // (St was last read before the barrier above).
#pragma unroll
    for (int nt = 0; nt < NS; ++nt) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[nt][e] *= Gls[16 * warp + AccRow(e)];
    }
    WarpMmaBf16<kChunk, kChunk, NS, kChunk / 16>(s, Kts, 16 * warp, Vt, 0, kChunk / 16);
    store_st();
  }
#pragma unroll
  for (int nt = 0; nt < NS; ++nt) {
#pragma unroll
    for (int e = 0; e < 4; ++e) state[(16 * warp + AccRow(e)) * kDim + AccCol(nt, e)] = s[nt][e];
  }
}

template <int P, int VB>
void Launch(const KdaChunkArgs& a, cudaStream_t s) {
  using L = Smem<VB>;
  // Every call (a microsecond next to a prefill's milliseconds), so it holds on whichever device
  // is current.
  AllowDynamicSmem(KdaChunkKernel<P, VB>, L::kBytes, false, "KdaChunked", nullptr);
  const dim3 grid(static_cast<unsigned>(a.heads * (kDim / VB)), static_cast<unsigned>(a.batch));
  KdaChunkKernel<P, VB><<<grid, kThreads, L::kBytes, s>>>(a);
  CheckLaunch("KdaChunked");
}

// Σ_b ceil(T_b / 64) ≤ tokens / 64 + batch: the chunks a call can have (the map's capacity).
int64_t ChunkCapacity(int64_t tokens, int64_t batch) { return tokens / kChunk + batch; }

template <class Kernel>
void AllowSmem(Kernel kernel, size_t bytes) {
  // Every call (a microsecond next to a prefill's milliseconds), so it holds on whichever device
  // is current. The carveout asks for all of the unified L1/shared memory as shared memory, so
  // the state kernel's 3 (VB = 32) or 2 (64) blocks fit on an SM.
  AllowDynamicSmem(kernel, bytes, true, "KdaChunked", nullptr);
}

// The prep kernel's launch: as many persistent blocks as are resident at once (kMinBlocks per SM
// by design; asked, so that a device fitting fewer does not run a second wave of whole persistent
// blocks).
template <int kMinBlocks>
void LaunchPrep(const KdaChunkArgs& a, cudaStream_t s, int64_t items, const int32_t* chunk_seq,
                const int32_t* chunk_idx, uint8_t* records) {
  auto* const kernel = KdaChunkPrepKernel<kMinBlocks>;
  AllowSmem(kernel, PrepSmem::kBytes);
  static const int per_sm = [kernel] {
    int n = 0;
    const cudaError_t err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, kernel, kThreads, PrepSmem::kBytes);
    return err == cudaSuccess && n > 0 ? n : 1;
  }();
  const int64_t resident = int64_t{per_sm} * SmCount();
  const unsigned blocks = static_cast<unsigned>(items < resident ? items : resident);
  kernel<<<blocks, kThreads, PrepSmem::kBytes, s>>>(a, items, chunk_seq, chunk_idx, records);
}

// The BF16 mode's three launches (map, prep, state) on a.scratch; without `state` only the first
// two (KdaChunkPrepOnly). prep_per_sm picks the prep kernel's build: 3 (80 registers, the
// default) or 2 (128 registers).
void LaunchChunkParallel(const KdaChunkArgs& a, cudaStream_t s, int vb, bool state = true, int prep_per_sm = 3) {
  const int64_t capacity = ChunkCapacity(a.tokens, a.batch);
  if (a.scratch == nullptr || a.tokens < 0 || capacity * a.heads > 0x7fffffff) {
    std::fprintf(stderr, "kimirt: KdaChunked: the BF16 mode needs scratch (KdaChunkScratchBytes) and the call's "
                 "rows in tokens (%lld rows, %lld heads)\n", static_cast<long long>(a.tokens),
                 static_cast<long long>(a.heads));
    std::abort();
  }
  uint8_t* const records = static_cast<uint8_t*>(a.scratch);
  int32_t* const chunk_seq = reinterpret_cast<int32_t*>(records + static_cast<size_t>(capacity * a.heads) * kRecBytes);
  int32_t* const chunk_idx = chunk_seq + capacity;
  int32_t* const chunk_first = chunk_idx + capacity;
  KdaChunkMapKernel<<<1, kThreads, sizeof(int) * kThreads, s>>>(a, static_cast<int>(capacity), chunk_seq, chunk_idx,
                                                                 chunk_first);
  CheckLaunch("KdaChunked map");
  if (capacity == 0) return;
  const int64_t items = capacity * a.heads;
  if (prep_per_sm == 2) {
    LaunchPrep<2>(a, s, items, chunk_seq, chunk_idx, records);
  } else {
    LaunchPrep<3>(a, s, items, chunk_seq, chunk_idx, records);
  }
  CheckLaunch("KdaChunked prep");
  if (!state) return;
  auto run_state = [&](auto kernel, size_t bytes) {
    AllowSmem(kernel, bytes);
    const dim3 grid(static_cast<unsigned>(a.heads * (kDim / vb)), static_cast<unsigned>(a.batch));
    kernel<<<grid, kThreads, bytes, s>>>(a, chunk_first, records);
    CheckLaunch("KdaChunked state");
  };
  if (vb == 32) {
    run_state(KdaStateKernel<32>, StateSmem<32>::kBytes);
  } else if (vb == 64) {
    run_state(KdaStateKernel<64>, StateSmem<64>::kBytes);
  } else {
    run_state(KdaStateKernel<128>, StateSmem<128>::kBytes);
  }
}

}  // namespace

int KdaChunkValueBlock(int64_t batch, int64_t heads, bool bf16_operands) {
  if (bf16_operands) {
    // The state kernel: 32 columns (3 blocks per SM) while all blocks fit in one wave, else 64
    // (2 per SM; each block then loads a head's records for twice the columns).
    return 4 * batch * heads <= 3 * SmCount() ? 32 : 64;
  }
  // The narrowest blocks (most parallelism, each repeating the per-chunk work on q, k and the
  // decays) whose count still fits in one wave; past one wave, the widest.
  for (int vb : {32, 64}) {
    if (batch * heads * (kDim / vb) <= SmCount()) return vb;
  }
  return 128;
}

size_t KdaChunkScratchBytes(int64_t tokens, int64_t batch, int64_t heads) {
  const int64_t capacity = ChunkCapacity(tokens, batch);
  return static_cast<size_t>(capacity * heads) * kRecBytes + sizeof(int32_t) * static_cast<size_t>(2 * capacity + batch);
}

void KdaChunked(const KdaChunkArgs& a, cudaStream_t s, bool bf16_operands, int value_block) {
  if (a.head_dim != kKdaChunkHeadDim || a.batch < 0 || a.batch > 65535 || a.heads < 1 || a.heads > 65535 ||
      (a.cu_seqlens == nullptr && (a.batch > 1 || a.slots != nullptr || a.tokens < 0)) ||
      (value_block != 0 && value_block != 32 && value_block != 64 && value_block != 128)) {
    std::fprintf(stderr, "kimirt: KdaChunked: head dim %lld, batch %lld, heads %lld, value block %d (needs %d, "
                 "<= 65535, 1..65535, 0/32/64/128)\n",
                 static_cast<long long>(a.head_dim), static_cast<long long>(a.batch), static_cast<long long>(a.heads),
                 value_block, kKdaChunkHeadDim);
    std::abort();
  }
  for (const void* p : {static_cast<const void*>(a.q), static_cast<const void*>(a.k), static_cast<const void*>(a.v),
                        static_cast<const void*>(a.alpha), static_cast<const void*>(a.o)}) {
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
      std::fprintf(stderr, "kimirt: KdaChunked: q, k, v, alpha and o must be 16-byte aligned\n");
      std::abort();
    }
  }
  if (a.batch == 0) return;
  const int vb = value_block != 0 ? value_block : KdaChunkValueBlock(a.batch, a.heads, bf16_operands);
  if (bf16_operands) {
    LaunchChunkParallel(a, s, vb);
  } else {
    vb == 32 ? Launch<3, 32>(a, s) : vb == 64 ? Launch<3, 64>(a, s) : Launch<3, 128>(a, s);
  }
}

void KdaChunkPrepOnly(const KdaChunkArgs& a, cudaStream_t s, int prep_blocks_per_sm) {
  if (a.head_dim != kKdaChunkHeadDim || a.batch < 1 || a.batch > 65535 || a.heads < 1 || a.heads > 65535 ||
      (prep_blocks_per_sm != 0 && prep_blocks_per_sm != 2 && prep_blocks_per_sm != 3)) {
    std::fprintf(stderr, "kimirt: KdaChunkPrepOnly: head dim %lld, batch %lld, heads %lld, prep blocks per SM %d "
                 "(0, 2 or 3)\n", static_cast<long long>(a.head_dim), static_cast<long long>(a.batch),
                 static_cast<long long>(a.heads), prep_blocks_per_sm);
    std::abort();
  }
  LaunchChunkParallel(a, s, 0, false, prep_blocks_per_sm == 2 ? 2 : 3);
}

}  // namespace kimirt::cuda
