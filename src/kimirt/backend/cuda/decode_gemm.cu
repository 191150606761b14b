// Decode GEMM on tensor cores for BF16-held weights (kernels.h, docs/cuda.md "Decode GEMM"):
// y [m, n] = x [m, k] · w [n, k]ᵀ for 1 ≤ m ≤ kGemvMaxRows, every weight byte read once per call
// whatever m is, and each row's bits independent of the other rows (Backend::RowInvariantRows).
//
// Why tensor cores: at 64 rows the FP32 cores would need 2.4e12 weights/s × 2 × 64 ≈ 300 TFLOP/s
// to keep up with HBM, 4.5× what they have. mma.sync m16n8k16 BF16 → FP32 has the rate; to keep
// F32 accuracy the activation is split in two BF16 parts, x = x_hi + x_lo (x_hi = bf16(x),
// x_lo = bf16(x − x_hi), 16 of F32's 24 mantissa bits, relative error ≤ 2⁻¹⁶), and each weight
// tile is multiplied by both. The weight is BF16 already, so its products are exact.
//
// Layout: the weight is the MMA's A operand (16 output columns × 16 k, row-major = w's own
// layout), the rows of x are its B operand (16 k × 8 rows), so rows pad to 8, 16, 32 or 64
// (kTiles = 1, 2, 4, 8 tiles of 8) and the padding is zeros. Each lane loads 16 bytes of a weight
// row (8 consecutive k) and the same 8 k of its x rows; the 32 k of a step are assigned to the two
// MMAs' k slots by the same permutation for A and B (Step below), so they multiply matching
// pairs. x is split once per call into scratch (SplitXKernel) for 2 tiles and more; for 1 tile
// the GEMM splits it in registers (LoadSplitX), one launch fewer, with the same SplitOne.
//
// Row invariance: a row is one column of the B tile; its accumulator sees the same MMAs in the
// same order (k slices ascending; per 32-k step the four MMAs of Step, then one F32 add) in every
// kTiles instantiation; the split of k across blocks (`splits`) and the order the
// splits are summed in depend on n and k only, never on m.
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/kernels.h"

namespace kimirt::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kColTiles = 2;                              // 16-column MMA tiles per warp
constexpr int64_t kBlockCols = kWarps * kColTiles * 16;  // 128 output columns per block
constexpr int64_t kStepK = 32;                            // k per step: two m16n8k16 k-slots
constexpr int kUnroll = 4;                                // steps whose weight loads go out together
constexpr int64_t kSliceQuantum = kStepK * kUnroll;
// Split k across blocks until about two blocks per multiprocessor of an H200 (132) exist, but
// never into slices under kMinSliceK (their partial sums would cost more than they save). A
// constant, not the device's count, so a model's bits are the same on every GPU.
constexpr int64_t kTargetBlocks = 264;
constexpr int64_t kMinSliceK = 512;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

struct Plan {
  int tiles = 1;         // 8-row tiles: 1, 2, 4 or 8
  int64_t m_pad = 0;     // tiles · 8
  int64_t k_pad = 0;     // k rounded up to a step
  int64_t slice = 0;     // k per split, a multiple of kSliceQuantum
  int64_t splits = 1;    // from n and k only
  size_t x_bytes = 0;    // x_hi and x_lo, m_pad · k_pad BF16 each (SplitXKernel; none for 1 tile)
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
  p.x_bytes = p.tiles == 1 ? 0 : CeilDiv(static_cast<int64_t>(2 * p.m_pad * p.k_pad * sizeof(uint16_t)), 256) * 256;
  p.part_bytes = p.splits > 1 ? static_cast<size_t>(p.splits * m * n) * sizeof(float) : 0;
  return p;
}

// One x value as BF16 bits hi + lo (x = hi + lo to 2⁻¹⁶ relative). A non-finite hi gets lo = 0,
// so ±inf stays ±inf instead of inf − inf = NaN. The one definition both SplitXKernel and the GEMM's
// own split (1 tile) use, so a row gets the same bits either way.
__device__ __forceinline__ void SplitOne(float v, uint32_t& hi, uint32_t& lo) {
  const __nv_bfloat16 h = __float2bfloat16_rn(v);
  const float hf = __bfloat162float(h);
  hi = __bfloat16_as_ushort(h);
  lo = __bfloat16_as_ushort(__float2bfloat16_rn(isfinite(hf) ? v - hf : 0.0f));
}

// x [m, k] F32 → x_hi, x_lo, BF16, zero-padded to [m_pad, k_pad], stored in the order the
// warps read them: for each 32-k step s and 8-row tile, 32 lanes × 8 values, lane g·4 + t holding
// row tile·8 + g at k = 32s + 8t .. +7 (Step). So a warp's load of one tile is 512 contiguous
// bytes. For 2 tiles and more; 1 tile splits in the GEMM (LoadSplitX).
__global__ void SplitXKernel(const float* x, int64_t m, int64_t k, int tiles, int64_t k_pad, uint16_t* hi,
                             uint16_t* lo) {
  const int64_t total = tiles * 8 * k_pad;
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < total; i += int64_t{gridDim.x} * blockDim.x) {
    const int64_t e = i % 8, lane = i / 8 % 32, tile = i / 256 % tiles, step = i / (256 * tiles);
    const int64_t r = tile * 8 + lane / 4, c = step * kStepK + lane % 4 * 8 + e;
    uint32_t h, l;
    SplitOne(r < m && c < k ? x[r * k + c] : 0.0f, h, l);
    hi[i] = static_cast<uint16_t>(h);
    lo[i] = static_cast<uint16_t>(l);
  }
}

// For 1 tile (m ≤ 8), with no SplitXKernel launch: x[row][kk .. kk+7] read here (zeros past m or
// k) and split by SplitOne, packed as SplitXKernel stores them (element e in bits 16·(e%2) of
// word e/2). `vec`: x rows 16-byte aligned and k % 8 == 0, so the 8 are all in or all out.
__device__ __forceinline__ void LoadSplitX(const float* x, int64_t row, int64_t kk, int64_t m, int64_t k, bool vec,
                                           uint4& xh, uint4& xl) {
  float v[8];
  if (vec && row < m && kk < k) {
    const float4 a = __ldg(reinterpret_cast<const float4*>(x + row * k + kk));
    const float4 b = __ldg(reinterpret_cast<const float4*>(x + row * k + kk + 4));
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  } else {
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = row < m && kk + e < k ? __ldg(x + row * k + kk + e) : 0.0f;
  }
  uint32_t h[8], l[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) SplitOne(v[e], h[e], l[e]);
  xh = make_uint4(h[0] | h[1] << 16, h[2] | h[3] << 16, h[4] | h[5] << 16, h[6] | h[7] << 16);
  xl = make_uint4(l[0] | l[1] << 16, l[2] | l[3] << 16, l[4] | l[5] << 16, l[6] | l[7] << 16);
}

// 16 bytes of the weight, read once: no L1 allocation, it will not be read again this call.
__device__ __forceinline__ uint4 LoadStreaming(const uint16_t* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
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

// d += a · b, m16n8k16, BF16 in, F32 accumulate (PTX ISA "Matrix fragments for mma.m16n8k16").
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                    uint32_t b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One step: 32 k starting at the lane's k0 + 8·t. Lane (g = lane/4, t = lane%4) holds, as 16-byte
// words, weight rows g (`row_g`) and g + 8 (`row_g8`) and x row g, each at k = 8t .. 8t+7. The
// fragment layout puts MMA k slots 2t, 2t+1 and 2t+8, 2t+9 in this lane (A regs 0/1 and 2/3, B reg
// 0 and 1), so MMA 1 takes physical k 8t+0..3 (words .x, .y) and MMA 2 takes 8t+4..7 (.z, .w):
// both operands use the same map, every k of the step is used once.
//
// The step's four MMAs (lo, then hi) start from zero and their sum is added to `acc` by an F32
// add: the tensor cores' own accumulation truncates (rounds toward zero), which over a long chain
// (k = 9216: 1152 MMAs) biases the result by up to ~1e-5 relative; chains of 4 whose results are
// added with round-to-nearest keep the error at F32's level.
__device__ __forceinline__ void Step(float (&acc)[4], const uint4& row_g, const uint4& row_g8, const uint4& xh,
                                     const uint4& xl) {
  float d[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  Mma(d, row_g.x, row_g8.x, row_g.y, row_g8.y, xl.x, xl.y);
  Mma(d, row_g.z, row_g8.z, row_g.w, row_g8.w, xl.z, xl.w);
  Mma(d, row_g.x, row_g8.x, row_g.y, row_g8.y, xh.x, xh.y);
  Mma(d, row_g.z, row_g8.z, row_g.w, row_g8.w, xh.z, xh.w);
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] += d[i];
}

// Block (blockIdx.x, blockIdx.y): 128 columns × k slice blockIdx.y; warp: 32 columns (two MMA
// tiles) × all kTiles row tiles. out: y when splits = 1, else the slice's [m, n] partial.
template <int kTiles, bool kVec>
__global__ void __launch_bounds__(kWarps * 32)
    DecodeGemmKernel(const uint16_t* __restrict__ w, const float* __restrict__ x, bool x_vec,
                     const uint16_t* __restrict__ x_hi, const uint16_t* __restrict__ x_lo, float* __restrict__ out,
                     int64_t m, int64_t n, int64_t k, int64_t k_pad, int64_t slice) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int64_t col0 = int64_t{blockIdx.x} * kBlockCols + warp * (kColTiles * 16);
  const int64_t k_begin = int64_t{blockIdx.y} * slice;
  const int64_t k_end = k_begin + slice < k_pad ? k_begin + slice : k_pad;
  out += int64_t{blockIdx.y} * m * n;

  float acc[kColTiles][kTiles][4];
#pragma unroll
  for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
    for (int r = 0; r < kTiles; ++r) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][r][i] = 0.0f;
    }
  }

  for (int64_t kb = k_begin; kb < k_end; kb += kSliceQuantum) {
    // All of this round's weight loads first, so kUnroll · kColTiles · 2 are in flight per lane.
    uint4 wr[kUnroll][kColTiles][2];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t kk = kb + u * kStepK + 8 * t;
#pragma unroll
      for (int c = 0; c < kColTiles; ++c) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          wr[u][c][h] = kb + u * kStepK < k_end ? LoadW<kVec>(w, col0 + c * 16 + h * 8 + g, kk, n, k)
                                                : make_uint4(0, 0, 0, 0);
        }
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (kb + u * kStepK >= k_end) break;  // a step past the slice: skipped, the same for every m
      const int64_t step = (kb + u * kStepK) / kStepK;
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
        uint4 xh, xl;
        if constexpr (kTiles == 1) {
          LoadSplitX(x, g, step * kStepK + 8 * t, m, k, x_vec, xh, xl);
        } else {
          const int64_t xi = ((step * kTiles + r) * 32 + lane) * 8;  // SplitXKernel's order
          xh = __ldg(reinterpret_cast<const uint4*>(x_hi + xi));
          xl = __ldg(reinterpret_cast<const uint4*>(x_lo + xi));
        }
#pragma unroll
        for (int c = 0; c < kColTiles; ++c) Step(acc[c][r], wr[u][c][0], wr[u][c][1], xh, xl);
      }
    }
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

// y = Σ_s part[s], s ascending: the same order for every element and every m.
__global__ void SumSplitsKernel(const float* part, int64_t splits, int64_t mn, float* y) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < mn; i += int64_t{gridDim.x} * blockDim.x) {
    float s = part[i];
    for (int64_t j = 1; j < splits; ++j) s += part[j * mn + i];
    y[i] = s;
  }
}

template <int kTiles>
void Launch(bool vec, dim3 grid, const uint16_t* w, const float* x, bool x_vec, const uint16_t* hi,
            const uint16_t* lo, float* out, int64_t m, int64_t n, int64_t k, const Plan& p, cudaStream_t s) {
  if (vec) {
    DecodeGemmKernel<kTiles, true><<<grid, kWarps * 32, 0, s>>>(w, x, x_vec, hi, lo, out, m, n, k, p.k_pad, p.slice);
  } else {
    DecodeGemmKernel<kTiles, false><<<grid, kWarps * 32, 0, s>>>(w, x, x_vec, hi, lo, out, m, n, k, p.k_pad, p.slice);
  }
}

unsigned GridFor(int64_t n) { return static_cast<unsigned>(std::min<int64_t>(CeilDiv(n, 256), 65536)); }

}  // namespace

size_t DecodeGemmScratchBytes(int64_t m, int64_t n, int64_t k) {
  const Plan p = MakePlan(m, n, k);
  return p.x_bytes + p.part_bytes;
}

int64_t DecodeGemmSplits(int64_t n, int64_t k) { return MakePlan(1, n, k).splits; }

void DecodeGemm(const float* x, const void* w_bf16, float* y, int64_t m, int64_t n, int64_t k, void* scratch,
                cudaStream_t s) {
  if (m == 0 || n == 0) return;
  if (m > kGemvMaxRows || k <= 0) {
    std::fprintf(stderr, "kimirt: DecodeGemm takes 1..%lld rows and k > 0, got m=%lld k=%lld\n",
                 static_cast<long long>(kGemvMaxRows), static_cast<long long>(m), static_cast<long long>(k));
    std::abort();
  }
  const Plan p = MakePlan(m, n, k);
  uint16_t* hi = nullptr;
  uint16_t* lo = nullptr;
  if (p.tiles > 1) {  // 1 tile: the GEMM splits x itself (LoadSplitX)
    hi = static_cast<uint16_t*>(scratch);
    lo = hi + p.m_pad * p.k_pad;
    SplitXKernel<<<GridFor(p.m_pad * p.k_pad), 256, 0, s>>>(x, m, k, p.tiles, p.k_pad, hi, lo);
    CheckLaunch("DecodeGemm split x");
  }
  const auto* w = static_cast<const uint16_t*>(w_bf16);
  const bool vec = k % 8 == 0 && reinterpret_cast<uintptr_t>(w) % 16 == 0;
  const bool x_vec = k % 8 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0;
  float* out = p.splits > 1 ? reinterpret_cast<float*>(static_cast<char*>(scratch) + p.x_bytes) : y;
  const dim3 grid(static_cast<unsigned>(CeilDiv(n, kBlockCols)), static_cast<unsigned>(p.splits));
  switch (p.tiles) {
    case 1: Launch<1>(vec, grid, w, x, x_vec, hi, lo, out, m, n, k, p, s); break;
    case 2: Launch<2>(vec, grid, w, x, x_vec, hi, lo, out, m, n, k, p, s); break;
    case 4: Launch<4>(vec, grid, w, x, x_vec, hi, lo, out, m, n, k, p, s); break;
    default: Launch<8>(vec, grid, w, x, x_vec, hi, lo, out, m, n, k, p, s); break;
  }
  CheckLaunch("DecodeGemm");
  if (p.splits > 1) {
    SumSplitsKernel<<<GridFor(m * n), 256, 0, s>>>(out, p.splits, m * n, y);
    CheckLaunch("DecodeGemm sum splits");
  }
}

}  // namespace kimirt::cuda
