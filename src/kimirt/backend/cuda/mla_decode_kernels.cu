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
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/mma_bf16.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

#include <cstdio>
#include <cstdlib>

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
constexpr int kSStride = kTile + 1;
static_assert(kRopeSteps <= kWarps && kLatSteps % kWarps == 0, "k-steps dealt evenly");

struct Smem {
  // The tile's rows as BF16 [position][latent ‖ rope]; before the first tile, q̄'s hi and lo
  // parts [2][kHeads][kRowStride] (the same size), read once into registers.
  __nv_bfloat16 rows[kTile][kRowStride];
  float s_lat[kWarps][kHeads][kSStride];     // each warp's partial scores, latent k-steps
  float s_rope[kRopeSteps][kHeads][kSStride];  // and rope k-steps (warps 0..3)
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

// One tile's rows in flight in registers: kind 1 (BF16) 72 chunks of 16 bytes a row, kind 2
// (FP8) 36. Eight threads a row (tid / 8; 32 rows × 8 = 256 threads), thread tid % 8 taking
// chunks tid % 8 + 8i: the row's place in the pool is worked out once a tile, in 32-bit math.
template <int kKind>
struct TileRegs {
  static constexpr int kRowBytes = kKind == 1 ? kW * 2 : kW;
  static constexpr int kChunksPerRow = kRowBytes / 16;
  static constexpr int kPerThread = (kChunksPerRow + 7) / 8;
  static_assert(kTile * 8 == kThreads, "eight threads a row");
  uint4 v[kPerThread];
  float sl = 1.0f, sr = 1.0f;  // the row's scales (FP8)

  __device__ void Load(const PagedDecodeArgs& a, const int32_t* table, int64_t t0, int64_t s1) {
    const int j = threadIdx.x / 8, sub = threadIdx.x % 8;
    const bool valid = t0 + j < s1;
    int64_t row = 0;
    if (valid) {
      const int p = static_cast<int>(t0) + j, bs = a.block_size;  // positions fit int32 (SetDecodeStep)
      row = (int64_t{table[p / bs]} * a.layers + a.layer) * bs + p % bs;
    }
    const unsigned char* src = static_cast<const unsigned char*>(a.values) + row * kRowBytes;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = sub + 8 * i;
      v[i] = valid && e < kChunksPerRow ? mma::LoadStreaming(src + e * 16) : make_uint4(0, 0, 0, 0);
    }
    if (kKind == 2 && sub == 0) {
      sl = valid ? a.scales[row * 2] : 0.0f;
      sr = valid ? a.scales[row * 2 + 1] : 0.0f;
    }
  }

  __device__ void Store(Smem& sm) const {
    const int j = threadIdx.x / 8, sub = threadIdx.x % 8;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int e = sub + 8 * i;
      if (e >= kChunksPerRow) continue;
      if (kKind == 1) {
        *reinterpret_cast<uint4*>(&sm.rows[j][e * 8]) = v[i];
      } else {
        const unsigned w[4] = {v[i].x, v[i].y, v[i].z, v[i].w};
        uint4 lo, hi;
        lo.x = Fp8x2ToBf16x2(w[0] & 0xffff), lo.y = Fp8x2ToBf16x2(w[0] >> 16);
        lo.z = Fp8x2ToBf16x2(w[1] & 0xffff), lo.w = Fp8x2ToBf16x2(w[1] >> 16);
        hi.x = Fp8x2ToBf16x2(w[2] & 0xffff), hi.y = Fp8x2ToBf16x2(w[2] >> 16);
        hi.z = Fp8x2ToBf16x2(w[3] & 0xffff), hi.w = Fp8x2ToBf16x2(w[3] >> 16);
        *reinterpret_cast<uint4*>(&sm.rows[j][e * 16]) = lo;
        *reinterpret_cast<uint4*>(&sm.rows[j][e * 16 + 8]) = hi;
      }
    }
    if (sub == 0) {
      sm.scale_lat[j] = sl;
      sm.scale_rope[j] = sr;
    }
  }
};

// Block (work item = split [s0, s1) of sequence b, heads h0 .. h0 + 15). Writes the split's
// unnormalized ō [kR] and (max, sum) per head to part_o / part_ml, as the CUDA-core split does.
template <int kKind>
__global__ void __launch_bounds__(kThreads) MlaDecodeTcKernel(PagedDecodeArgs a, const float* qc, float* part_o,
                                                              float* part_ml) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Smem& sm = *reinterpret_cast<Smem*>(smem_raw);
  const int64_t work = blockIdx.x;
  if (work >= *a.work_count) return;  // the whole block: past this step's work list
  const int64_t b = a.work[3 * work], s0 = a.work[3 * work + 1], s1 = a.work[3 * work + 2];
  const int64_t h0 = int64_t{blockIdx.y} * kHeads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
  const int32_t* table = a.tables + a.table_begin[b];

  // The first tile's loads go out before the query is staged.
  TileRegs<kKind> regs;
  regs.Load(a, table, s0, s1);

  // q̄ hi / lo into the rows buffer, then this warp's k-steps' A fragments into registers:
  // latent k-steps warp·4 .. warp·4 + 3, and rope k-step warp for warps 0..3.
  {
    __nv_bfloat16(*q)[kHeads][kRowStride] = reinterpret_cast<__nv_bfloat16(*)[kHeads][kRowStride]>(&sm.rows[0][0]);
    for (int i = tid; i < kHeads * kW; i += kThreads) {
      const int hh = i / kW, e = i % kW;
      const float v = h0 + hh < a.H ? qc[((b * a.H) + h0 + hh) * kW + e] : 0.0f;
      Split2(v, q[0][hh][e], q[1][hh][e]);
    }
  }
  __syncthreads();
  unsigned qa[2][kLatPerWarp + 1][4];  // [hi/lo][k-step][fragment]
  {
    const __nv_bfloat16(*q)[kHeads][kRowStride] =
        reinterpret_cast<const __nv_bfloat16(*)[kHeads][kRowStride]>(&sm.rows[0][0]);
    const int r = lane % 16, c8 = (lane / 16) * 8;
#pragma unroll
    for (int part = 0; part < 2; ++part) {
#pragma unroll
      for (int k = 0; k < kLatPerWarp; ++k) Ldmatrix4(qa[part][k], &q[part][r][(warp * kLatPerWarp + k) * 16 + c8]);
      if (warp < kRopeSteps) Ldmatrix4(qa[part][kLatPerWarp], &q[part][r][kR + warp * 16 + c8]);
    }
  }
  __syncthreads();  // the query is in registers; the buffer takes rows from here on
  regs.Store(sm);
  __syncthreads();

  // Softmax state of head hs = tid / 16 (its 16 threads hold the same values).
  const int hs = tid / 16, js = (tid % 16) * 2;
  float m = -INFINITY, l = 0.0f;
  float acc[kDimsPerWarp / 8][4];
#pragma unroll
  for (int n = 0; n < kDimsPerWarp / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;

  for (int64_t t0 = s0; t0 < s1; t0 += kTile) {
    const bool more = t0 + kTile < s1;
    if (more) regs.Load(a, table, t0 + kTile, s1);  // in flight during this tile's math

    // 1. Partial scores over this warp's k-steps, all 32 positions (4 n-tiles of 8).
    {
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
          Ldmatrix4(bfr, &sm.rows[(2 * np + mi / 2) * 8 + r8][col + (mi % 2) * 8]);
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
#pragma unroll
      for (int part = 0; part < 2; ++part) {
#pragma unroll
        for (int k = 0; k < 2; ++k) Ldmatrix4(pa[part][k], &sm.p[part][r][k * 16 + c8]);
      }
#pragma unroll
      for (int np = 0; np < kDimsPerWarp / 16; ++np) {  // n-tiles 2np, 2np + 1
        float d[2][4] = {};
#pragma unroll
        for (int k = 0; k < 2; ++k) {
          unsigned bfr[4];
          // Matrices: positions k·16 + 0..7 / 8..15 at dims n0, then at n0 + 8 (transposed).
          Ldmatrix4Trans(bfr, &sm.rows[k * 16 + (lane % 8) + ((lane / 8) % 2) * 8]
                                      [warp * kDimsPerWarp + np * 16 + (lane / 16) * 8]);
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
    __syncthreads();  // every warp is done with this tile's rows and P
    if (more) {
      regs.Store(sm);
      __syncthreads();
    }
  }

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

template <int kKind>
void Launch(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml, cudaStream_t s) {
  static bool configured = false;  // the attribute is per function; setting it again is harmless
  if (!configured) {
    const cudaError_t e = cudaFuncSetAttribute(MlaDecodeTcKernel<kKind>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                               static_cast<int>(sizeof(Smem)));
    if (e != cudaSuccess) {
      std::fprintf(stderr, "kimirt: MLA decode kernel: %s\n", cudaGetErrorString(e));
      std::abort();
    }
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>(a.num_work), static_cast<unsigned>((a.H + kHeads - 1) / kHeads));
  MlaDecodeTcKernel<kKind><<<grid, kThreads, sizeof(Smem), s>>>(a, qc, part_o, part_ml);
  CheckLaunch("MlaDecodeTc");
}

}  // namespace

bool MlaPagedDecodeTcSupported(const PagedDecodeArgs& a) {
  return a.r == kR && a.dr == kDr && (a.kind == 1 || a.kind == 2);
}

void MlaPagedDecodeSplitTc(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml, cudaStream_t s) {
  if (!MlaPagedDecodeTcSupported(a)) {
    std::fprintf(stderr, "kimirt: the tensor-core MLA decode takes BF16 or FP8 latents of %d + %d, got kind %d, %lld + %lld\n",
                 kR, kDr, a.kind, static_cast<long long>(a.r), static_cast<long long>(a.dr));
    std::abort();
  }
  if (a.kind == 1) {
    Launch<1>(a, qc, part_o, part_ml, s);
  } else {
    Launch<2>(a, qc, part_o, part_ml, s);
  }
}

}  // namespace kimirt::cuda
