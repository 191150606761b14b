// Chunked KDA prefill on tensor cores (kernels.h KdaChunked; spec §5.5, numerics in docs/cuda.md
// "Chunked KDA prefill").
//
// One thread block per (sequence, head, block of VB value columns), walking the sequence's chunks
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
// Precision: every MMA operand is split into P BF16 parts (hi, mid, lo: all of F32 for P = 3; hi,
// lo for P = 2) and the cross products of total order < P run as separate MMAs (6 for P = 3, 3
// for P = 2), smallest first; for P = 3 into a zeroed accumulator then added to the running F32
// sum (the tensor cores truncate; docs/cuda.md "Precision" of the decode GEMM). So P = 3 is F32
// math up to summation order; P = 2 is good to ~2⁻¹⁷ per product.
//
// Batch invariance: a block's results depend on its own sequence, head and state slot only; the
// arithmetic of every output element is the same for VB = 32, 64 and 128 (same k order, same MMA
// terms, same fallback loop), so the VB picked from the batch's size does not change a bit.
#include "kimirt/backend/cuda/kda_activations.cuh"
#include "kimirt/backend/cuda/kernels.h"

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
// first. For P = 3 into a zeroed accumulator added once (see the top of the file); for P = 2
// straight into acc (the ≤ 24 truncating accumulations of a chain bias it by ≲ 1e-6, under the
// split's own 2⁻¹⁷).
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
    static_assert(P == 2, "two or three parts");
    Mma(acc, a[1], b[0]);
    Mma(acc, a[0], b[1]);
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
    //    after), one warp per row; the lanes' xor-butterfly sums are identical (a + b == b + a).
    //    All of the warp's loads are issued before any shared-memory store (the compiler cannot
    //    move a load past a store that might alias it), so their latencies overlap.
    {
      constexpr int kRowsPerWarp = kChunk / kWarps;
      float4 qv[kRowsPerWarp], kv[kRowsPerWarp];
      float bl[kRowsPerWarp];
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp + kWarps * i;
        qv[i] = kv[i] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        bl[i] = 0.0f;
        if (r < len) {
          qv[i] = __ldg(reinterpret_cast<const float4*>(a.q + base(r)) + lane);
          kv[i] = __ldg(reinterpret_cast<const float4*>(a.k + base(r)) + lane);
          bl[i] = __ldg(a.beta_logits + (row0 + r) * H + h);
        }
      }
#pragma unroll
      for (int i = 0; i < kRowsPerWarp; ++i) {
        const int r = warp + kWarps * i;
        float sq = qv[i].x * qv[i].x + qv[i].y * qv[i].y + qv[i].z * qv[i].z + qv[i].w * qv[i].w;
        float sk = kv[i].x * kv[i].x + kv[i].y * kv[i].y + kv[i].z * kv[i].z + kv[i].w * kv[i].w;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          sq += __shfl_xor_sync(0xffffffffu, sq, o);
          sk += __shfl_xor_sync(0xffffffffu, sk, o);
        }
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
        const float* const al = al2[bi];
        float x[kBlockRows];
        x[kRef] = 0.0f;
#pragma unroll
        for (int rr = kRef + 1; rr < kBlockRows; ++rr) x[rr] = x[rr - 1] + al[rr];
#pragma unroll
        for (int rr = kRef - 1; rr >= 0; --rr) x[rr] = x[rr + 1] - al[rr + 1];
        float pre = 0.0f, post = 0.0f;
#pragma unroll
        for (int rr = 0; rr <= kRef; ++rr) pre += al[rr];
#pragma unroll
        for (int rr = kRef + 1; rr < kBlockRows; ++rr) post += al[rr];
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
    if (tid < kDim) {
      const int d = tid;
      float blk[kBlocks];
#pragma unroll
      for (int i = 0; i < kBlocks; ++i) blk[i] = Pre[i * kDim + d] + Post[i * kDim + d];
      float acc = 0.0f;
#pragma unroll
      for (int i = 0; i < kBlocks; ++i) {
        Pf[i * kDim + d] = expf(acc + Pre[i * kDim + d]);
        acc += blk[i];
      }
      Gl[d] = expf(acc);
      float suf = 0.0f;
#pragma unroll
      for (int j = kBlocks - 1; j >= 0; --j) {
        Ff[j * kDim + d] = expf(Post[j * kDim + d] + suf);
        suf += blk[j];
      }
#pragma unroll
      for (int i = 1; i < kBlocks; ++i) {
#pragma unroll
        for (int j = 0; j < i; ++j) {
          float s = Post[j * kDim + d];
          for (int b = j + 1; b < i; ++b) s += blk[b];
          Df[PairIndex(i, j) * kDim + d] = expf(s + Pre[i * kDim + d]);
        }
      }
    }
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

    // 3. T = (I − A)^{-1} diag(β) in place of A. N = (I − A)^{-1} = I + A N, unit lower
    //    triangular: first the diagonal blocks N_ii by forward substitution, one thread per
    //    column, then block rows i = 1..3: N_ij = N_ii Σ_{m=j}^{i-1} A_im N_mj.
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

template <int P, int VB>
void Launch(const KdaChunkArgs& a, cudaStream_t s) {
  using L = Smem<VB>;
  // Every call (a microsecond next to a prefill's milliseconds), so it holds on whichever device
  // is current.
  const cudaError_t attr = cudaFuncSetAttribute(KdaChunkKernel<P, VB>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                static_cast<int>(L::kBytes));
  if (attr != cudaSuccess) {
    std::fprintf(stderr, "kimirt: KdaChunked: %zu bytes of shared memory refused: %s\n", L::kBytes,
                 cudaGetErrorString(attr));
    std::abort();
  }
  const dim3 grid(static_cast<unsigned>(a.heads * (kDim / VB)), static_cast<unsigned>(a.batch));
  KdaChunkKernel<P, VB><<<grid, kThreads, L::kBytes, s>>>(a);
  CheckLaunch("KdaChunked");
}

int SmCount() {
  static const int count = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 132;
    }
    return n;
  }();
  return count;
}

}  // namespace

int KdaChunkValueBlock(int64_t batch, int64_t heads) {
  // The narrowest blocks (most parallelism, each repeating the per-chunk work on q, k and the
  // decays) whose count still fits in one wave; past one wave, the widest.
  for (int vb : {32, 64}) {
    if (batch * heads * (kDim / vb) <= SmCount()) return vb;
  }
  return 128;
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
  const int vb = value_block != 0 ? value_block : KdaChunkValueBlock(a.batch, a.heads);
  if (bf16_operands) {
    vb == 32 ? Launch<2, 32>(a, s) : vb == 64 ? Launch<2, 64>(a, s) : Launch<2, 128>(a, s);
  } else {
    vb == 32 ? Launch<3, 32>(a, s) : vb == 64 ? Launch<3, 64>(a, s) : Launch<3, 128>(a, s);
  }
}

}  // namespace kimirt::cuda
