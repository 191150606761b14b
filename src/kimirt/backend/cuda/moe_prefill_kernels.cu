// The routed experts of a prefill call on tensor cores (kernels.h MoePrefillExperts; spec §7.2;
// issue 13 item 2, issue 14 item 1; docs/cuda.md "Prefill GEMMs on tensor cores").
//
// The (token, slot) choices are already grouped by expert on the device (MoeGroupByExpert). Four
// launches, none waiting on the host:
//   1. z rounded to BF16 once ([T, De]; tc::RoundToBf16);
//   2. the tile schedule: one warp scans the active experts' group sizes into a list of
//      (expert, first group row) tiles of 128 rows — how many lives on the device only;
//   3. gate/up: a block per (tile, 64 intermediate columns) multiplies its tile's z rows
//      (gathered through `order`) by 64 gate rows and the same 64 up rows of the expert in one
//      128-column tile (tc_tile.cuh), applies the GLU in registers and writes h in BF16
//      ([n, I], group row order);
//   4. down: a block per (tile, 128 output columns), h rows (contiguous within an expert) times
//      the down rows, F32 into grouped [n, De] — what MoeCombine reads.
// The grids are sized by the upper bound of tiles, ceil(n / 128) + min(E, n) (each active expert
// adds at most one partial tile); blocks past the device's count leave at once.
//
// Weights are BF16 (on the wgmma tile, wgmma_tile.cuh) or MXFP4 (decoded to BF16 in shared memory
// by the mma.sync tile): the same values, the same MMAs in the same order, so the same bits. Each output element is one accumulator over its
// own row, k ascending: a token's result never depends on the other tokens of the call.
#include <cuda_bf16.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/env_switch.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/tc_tile.cuh"
#include "kimirt/backend/cuda/wgmma_tile.cuh"

namespace kimirt::cuda {
namespace {

constexpr int kGluCols = tc::kBN / 2;  // intermediate columns of one gate/up tile (gate and up rows)

size_t Align256(size_t b) { return (b + 255) / 256 * 256; }

struct Schedule {
  const int32_t* tile_group;  // [tiles]: the active-expert index a of each tile
  const int32_t* tile_row;    // [tiles]: its first group row
  const int32_t* num_tiles;
  const int32_t* order;
  const int32_t* active;
  const int32_t* begin;
  int64_t k;
};

// One warp, 32 active experts at a time: tile counts, an inclusive warp scan, the tiles written.
__global__ void TileScheduleKernel(const int32_t* begin, const int32_t* num_active, int32_t* tile_group,
                                   int32_t* tile_row, int32_t* num_tiles) {
  const int lane = threadIdx.x;
  const int A = *num_active;
  int carry = 0;
  for (int base = 0; base < A; base += 32) {
    const int a = base + lane;
    const int b0 = a < A ? begin[a] : 0;
    const int count = a < A ? begin[a + 1] - b0 : 0;
    const int tiles = (count + tc::kBM - 1) / tc::kBM;
    int incl = tiles;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, incl, off);
      if (lane >= off) incl += v;
    }
    const int at = carry + incl - tiles;
    for (int j = 0; j < tiles; ++j) {
      tile_group[at + j] = a;
      tile_row[at + j] = b0 + j * tc::kBM;
    }
    carry += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) *num_tiles = carry;
}

__device__ __forceinline__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
// The GLU of spec §3.3 (as cuda::Glu): kind 0 silu(a)·u; kind 1 SiTU, the gate branch taking
// sigmoid of the raw a, the up branch soft-capped when has_b2.
__device__ __forceinline__ float GluValue(float a, float u, int kind, float b1, bool has_b2, float b2) {
  if (kind == 0) return a * Sigmoid(a) * u;
  return b1 * tanhf(a / b1) * Sigmoid(a) * (has_b2 ? b2 * tanhf(u / b2) : u);
}

__device__ __forceinline__ uint32_t Bf16Bits(float v) { return __bfloat16_as_ushort(__float2bfloat16_rn(v)); }

// The block's tile, or false when it is past the device's tile count.
struct Tile {
  int64_t g0, g_end;
  int32_t e;
};
__device__ __forceinline__ bool TileOf(const Schedule& sc, Tile& t) {
  const int tile = static_cast<int>(blockIdx.y);
  if (tile >= *sc.num_tiles) return false;
  const int a = sc.tile_group[tile];
  t.g0 = sc.tile_row[tile];
  t.g_end = sc.begin[a + 1];
  t.e = sc.active[a];
  return true;
}

template <bool kMxfp4>
__global__ void __launch_bounds__(tc::kThreads, 2)
    MoeGateUpKernel(const uint16_t* zb, int64_t De, int64_t I, Schedule sc, ExpertPointerTable w, int kind, float b1,
                    bool has_b2, float b2, uint16_t* h) {
  extern __shared__ __align__(128) uint8_t smem[];
  Tile t;
  if (!TileOf(sc, t)) return;
  const int64_t i0 = blockIdx.x * int64_t{kGluCols};
  const int row0 = threadIdx.x >> 3;
  const uint16_t* a_rows[tc::kRowsPerThread];
#pragma unroll
  for (int i = 0; i < tc::kRowsPerThread; ++i) {
    const int64_t g = t.g0 + row0 + tc::kLoadRows * i;
    a_rows[i] = g < t.g_end ? zb + static_cast<int64_t>(sc.order[g] / sc.k) * De : nullptr;
  }
  // Tile row j: gate row i0 + j for j < 64, up row i0 + j − 64 after.
  float acc[4][4][4];
  if constexpr (kMxfp4) {
    const int j = threadIdx.x >> 1;
    const int64_t r = i0 + (j % kGluCols);
    tc::BRowsMxfp4 b{nullptr, nullptr, w.tiled};
    if (r < I) {
      const bool up = j >= kGluCols;
      b.codes = static_cast<const uint8_t*>((up ? w.up : w.gate)[t.e]) + (w.tiled ? Mxfp4TiledRow(r, De) : r * (De / 2));
      b.scales = (up ? w.up_scales : w.gate_scales)[t.e] + r * (De / 32);
    }
    tc::TileMma<true, true>(smem, a_rows, b, De, zb, acc);
  } else {
    tc::BRowsBf16 b;
#pragma unroll
    for (int i = 0; i < tc::kRowsPerThread; ++i) {
      const int j = row0 + tc::kLoadRows * i;
      const int64_t r = i0 + (j % kGluCols);
      b.rows[i] = r < I ? static_cast<const uint16_t*>((j >= kGluCols ? w.up : w.gate)[t.e]) + r * De : nullptr;
    }
    tc::TileMma<false, true>(smem, a_rows, b, De, zb, acc);
  }
  // n tiles 0, 1 are gate columns, 2, 3 the up columns of the same intermediate index.
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 2; ++ni) {
#pragma unroll
      for (int f = 0; f < 4; f += 2) {
        const int64_t g = t.g0 + tc::TileRowOf(mi, f), i = i0 + tc::TileColOf<true>(ni, f);
        if (g >= t.g_end || i >= I) continue;
        const float v0 = GluValue(acc[mi][ni][f], acc[mi][ni + 2][f], kind, b1, has_b2, b2);
        const float v1 = GluValue(acc[mi][ni][f + 1], acc[mi][ni + 2][f + 1], kind, b1, has_b2, b2);
        *reinterpret_cast<uint32_t*>(h + g * I + i) = Bf16Bits(v0) | Bf16Bits(v1) << 16;
      }
    }
  }
}

template <bool kMxfp4>
__global__ void __launch_bounds__(tc::kThreads, 2)
    MoeDownKernel(const uint16_t* h, int64_t De, int64_t I, Schedule sc, const void* const* w2,
                  const uint8_t* const* s2, bool codes_tiled, float* grouped) {
  extern __shared__ __align__(128) uint8_t smem[];
  Tile t;
  if (!TileOf(sc, t)) return;
  const int64_t d0 = blockIdx.x * int64_t{tc::kBN};
  const int row0 = threadIdx.x >> 3;
  const uint16_t* a_rows[tc::kRowsPerThread];
#pragma unroll
  for (int i = 0; i < tc::kRowsPerThread; ++i) {
    const int64_t g = t.g0 + row0 + tc::kLoadRows * i;
    a_rows[i] = g < t.g_end ? h + g * I : nullptr;
  }
  float acc[4][4][4];
  if constexpr (kMxfp4) {
    const int64_t d = d0 + (threadIdx.x >> 1);
    tc::BRowsMxfp4 b{nullptr, nullptr, codes_tiled};
    if (d < De) {
      b.codes = static_cast<const uint8_t*>(w2[t.e]) + (codes_tiled ? Mxfp4TiledRow(d, I) : d * (I / 2));
      b.scales = s2[t.e] + d * (I / 32);
    }
    tc::TileMma<true, false>(smem, a_rows, b, I, h, acc);
  } else {
    tc::BRowsBf16 b;
#pragma unroll
    for (int i = 0; i < tc::kRowsPerThread; ++i) {
      const int64_t d = d0 + row0 + tc::kLoadRows * i;
      b.rows[i] = d < De ? static_cast<const uint16_t*>(w2[t.e]) + d * I : nullptr;
    }
    tc::TileMma<false, false>(smem, a_rows, b, I, h, acc);
  }
#pragma unroll
  for (int mi = 0; mi < 4; ++mi) {
#pragma unroll
    for (int ni = 0; ni < 4; ++ni) {
#pragma unroll
      for (int f = 0; f < 4; f += 2) {
        const int64_t g = t.g0 + tc::TileRowOf(mi, f), d = d0 + tc::TileColOf<false>(ni, f);
        if (g >= t.g_end || d >= De) continue;  // De even: d + 1 < De too
        *reinterpret_cast<float2*>(grouped + g * De + d) = make_float2(acc[mi][ni][f], acc[mi][ni][f + 1]);
      }
    }
  }
}

// BF16 experts on wgmma (wgmma_tile.cuh): the same tiles, rows and sums as the two kernels above,
// so the same bits (and MXFP4, still on the mma.sync tile, keeps giving BF16's bits:
// CudaBackendMoePrefill.*); 8% faster on kl48's experts at 8K tokens (docs/cuda.md).
// kTiled: the weights decode-tiled (ExpertPointerTable::tiled): the row bases DecodeTiledRow,
// TileGemm offsetting them by DecodeTiledK, the same values in the same places.
template <bool kTiled>
__global__ void __launch_bounds__(wgmma::kTileThreads, 1)
    MoeGateUpWgmmaKernel(const uint16_t* zb, int64_t De, int64_t I, Schedule sc, ExpertPointerTable w, int kind,
                         float b1, bool has_b2, float b2, uint16_t* h) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Tile t;
  if (!TileOf(sc, t)) return;
  const int64_t i0 = blockIdx.x * int64_t{kGluCols};
  const int row0 = threadIdx.x / 8;
  const uint16_t* a_rows[4];
  const uint16_t* b_rows[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t g = t.g0 + row0 + 32 * i;
    a_rows[i] = g < t.g_end ? zb + static_cast<int64_t>(sc.order[g] / sc.k) * De : nullptr;
    // Tile row j: gate row i0 + j for j < 64, up row i0 + j − 64 after.
    const int j = row0 + 32 * i;
    const int64_t r = i0 + (j % kGluCols);
    b_rows[i] = r < I ? static_cast<const uint16_t*>((j >= kGluCols ? w.up : w.gate)[t.e]) +
                            (kTiled ? DecodeTiledRow(r, De) : r * De)
                      : nullptr;
  }
  float acc[64];
  wgmma::TileGemm<kTiled>(smem_raw, a_rows, b_rows, De, zb, acc);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t g = t.g0 + wgmma::TileAccRow(half);
    if (g >= t.g_end) continue;
#pragma unroll
    for (int j = 0; j < kGluCols / 8; ++j) {  // gate columns j, up columns j + 8: the same i
      const int64_t i = i0 + wgmma::TileAccCol(j);
      if (i >= I) continue;
      const int f = 4 * j + 2 * half, u = 4 * (j + kGluCols / 8) + 2 * half;
      const float v0 = GluValue(acc[f], acc[u], kind, b1, has_b2, b2);
      const float v1 = GluValue(acc[f + 1], acc[u + 1], kind, b1, has_b2, b2);
      *reinterpret_cast<uint32_t*>(h + g * I + i) = Bf16Bits(v0) | Bf16Bits(v1) << 16;
    }
  }
}

template <bool kTiled>
__global__ void __launch_bounds__(wgmma::kTileThreads, 1)
    MoeDownWgmmaKernel(const uint16_t* h, int64_t De, int64_t I, Schedule sc, const void* const* w2, float* grouped) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  Tile t;
  if (!TileOf(sc, t)) return;
  const int64_t d0 = blockIdx.x * int64_t{wgmma::kTileRows};
  const int row0 = threadIdx.x / 8;
  const uint16_t* a_rows[4];
  const uint16_t* b_rows[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t g = t.g0 + row0 + 32 * i, d = d0 + row0 + 32 * i;
    a_rows[i] = g < t.g_end ? h + g * I : nullptr;
    b_rows[i] = d < De ? static_cast<const uint16_t*>(w2[t.e]) + (kTiled ? DecodeTiledRow(d, I) : d * I) : nullptr;
  }
  float acc[64];
  wgmma::TileGemm<kTiled>(smem_raw, a_rows, b_rows, I, h, acc);
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int64_t g = t.g0 + wgmma::TileAccRow(half);
    if (g >= t.g_end) continue;
#pragma unroll
    for (int j = 0; j < wgmma::kTileRows / 8; ++j) {
      const int64_t d = d0 + wgmma::TileAccCol(j);
      if (d >= De) continue;  // De even: d + 1 < De too
      *reinterpret_cast<float2*>(grouped + g * De + d) = make_float2(acc[4 * j + 2 * half], acc[4 * j + 2 * half + 1]);
    }
  }
}

// Scratch: z in BF16 [T, De] ‖ h [n, I] BF16 ‖ the schedule (tile_group, tile_row [ub], count).
struct Layout {
  size_t zb = 0, h = 0, sched = 0, total = 0;
  int64_t ub = 0;
};
Layout LayoutOf(int64_t T, int64_t k, int64_t De, int64_t I, int64_t max_active) {
  Layout l;
  const int64_t n = T * k;
  l.ub = (n + tc::kBM - 1) / tc::kBM + max_active;
  l.zb = 0;
  l.h = Align256(static_cast<size_t>(T * De) * sizeof(uint16_t));
  l.sched = l.h + Align256(static_cast<size_t>(n * I) * sizeof(uint16_t));
  l.total = l.sched + Align256(static_cast<size_t>(2 * l.ub + 1) * sizeof(int32_t));
  return l;
}

template <bool kMxfp4>
void Launch(const uint16_t* zb, int64_t De, int64_t I, const Schedule& sc, int64_t ub, const ExpertPointerTable& w,
            int kind, float beta, bool has_linear_beta, float linear_beta, uint16_t* h, float* grouped, cudaStream_t s) {
  // BF16 experts on wgmma unless KIMIRT_PREFILL_GEMM_WGMMA=0 (read once, as PrefillGemm's switch);
  // decode-tiled ones always (the mma.sync tile reads row-major BF16 weights only; MXFP4 codes either way).
  static const bool wgmma_tiles = EnvSwitchOn("KIMIRT_PREFILL_GEMM_WGMMA");
  if (!kMxfp4 && (wgmma_tiles || w.tiled)) {
    static std::atomic<uint64_t> configured[4] = {};  // per kernel: per device
    const auto gate_up = w.tiled ? MoeGateUpWgmmaKernel<true> : MoeGateUpWgmmaKernel<false>;
    const auto down = w.tiled ? MoeDownWgmmaKernel<true> : MoeDownWgmmaKernel<false>;
    AllowDynamicSmem(gate_up, wgmma::kTileSmemBytes, true, "MoeGateUp (wgmma)", &configured[w.tiled ? 1 : 0]);
    AllowDynamicSmem(down, wgmma::kTileSmemBytes, true, "MoeDown (wgmma)", &configured[w.tiled ? 3 : 2]);
    const dim3 gate_grid(static_cast<unsigned>((I + kGluCols - 1) / kGluCols), static_cast<unsigned>(ub));
    gate_up<<<gate_grid, wgmma::kTileThreads, wgmma::kTileSmemBytes, s>>>(zb, De, I, sc, w, kind, beta,
                                                                          has_linear_beta, linear_beta, h);
    CheckLaunch("MoeGateUp (wgmma)");
    const dim3 down_grid(static_cast<unsigned>((De + wgmma::kTileRows - 1) / wgmma::kTileRows),
                         static_cast<unsigned>(ub));
    down<<<down_grid, wgmma::kTileThreads, wgmma::kTileSmemBytes, s>>>(h, De, I, sc, w.down, grouped);
    CheckLaunch("MoeDown (wgmma)");
    return;
  }
  const size_t smem = kMxfp4 ? tc::kSmemMxfp4 : tc::kSmemBf16;
  tc::AllowSharedMemory(reinterpret_cast<const void*>(MoeGateUpKernel<kMxfp4>), smem, "MoeGateUp");
  tc::AllowSharedMemory(reinterpret_cast<const void*>(MoeDownKernel<kMxfp4>), smem, "MoeDown");
  const dim3 gate_grid(static_cast<unsigned>((I + kGluCols - 1) / kGluCols), static_cast<unsigned>(ub));
  MoeGateUpKernel<kMxfp4><<<gate_grid, tc::kThreads, smem, s>>>(zb, De, I, sc, w, kind, beta, has_linear_beta,
                                                                linear_beta, h);
  CheckLaunch("MoeGateUp");
  const dim3 down_grid(static_cast<unsigned>((De + tc::kBN - 1) / tc::kBN), static_cast<unsigned>(ub));
  MoeDownKernel<kMxfp4><<<down_grid, tc::kThreads, smem, s>>>(h, De, I, sc, w.down, w.down_scales, w.tiled, grouped);
  CheckLaunch("MoeDown");
}

}  // namespace

bool MoePrefillSupports(int64_t De, int64_t I, bool mxfp4) {
  const int64_t q = mxfp4 ? 32 : 8;
  return De > 0 && I > 0 && De % q == 0 && I % q == 0;
}

size_t MoePrefillScratchBytes(int64_t T, int64_t k, int64_t De, int64_t I, int64_t max_active) {
  return LayoutOf(T, k, De, I, max_active).total;
}

void MoePrefillExperts(const float* z, int64_t T, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De,
                       int64_t I, const ExpertPointerTable& w, bool mxfp4, int kind, float beta, bool has_linear_beta,
                       float linear_beta, void* scratch, float* grouped, cudaStream_t s) {
  const auto fail = [&](const char* what) {
    std::fprintf(stderr, "kimirt: MoE prefill of %lld tokens x top-%lld, experts %lld x %lld%s: %s\n",
                 static_cast<long long>(T), static_cast<long long>(k), static_cast<long long>(I),
                 static_cast<long long>(De), mxfp4 ? " MXFP4" : " BF16", what);
    std::abort();
  };
  if (T < 1 || k < 1 || max_active < 1) fail("tokens, top-k and experts must be at least 1");
  if (!MoePrefillSupports(De, I, mxfp4)) fail(mxfp4 ? "widths must be multiples of 32" : "widths must be multiples of 8");
  const Layout l = LayoutOf(T, k, De, I, max_active);
  if (l.ub > 65535) fail("more row tiles than the grid takes (65535)");
  if (T * k > INT32_MAX) fail("more slots than int32 group rows");
  if (reinterpret_cast<uintptr_t>(scratch) % 256 != 0) fail("scratch must be 256-byte aligned");
  uint8_t* base = static_cast<uint8_t*>(scratch);
  uint16_t* zb = reinterpret_cast<uint16_t*>(base + l.zb);
  uint16_t* h = reinterpret_cast<uint16_t*>(base + l.h);
  int32_t* tile_group = reinterpret_cast<int32_t*>(base + l.sched);
  int32_t* tile_row = tile_group + l.ub;
  int32_t* num_tiles = tile_row + l.ub;
  tc::RoundToBf16(z, T, De, De, zb, s);
  TileScheduleKernel<<<1, 32, 0, s>>>(g.begin, g.num_active, tile_group, tile_row, num_tiles);
  CheckLaunch("MoeTileSchedule");
  const Schedule sc{tile_group, tile_row, num_tiles, g.order, g.active, g.begin, k};
  if (mxfp4) {
    Launch<true>(zb, De, I, sc, l.ub, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s);
  } else {
    Launch<false>(zb, De, I, sc, l.ub, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s);
  }
}

}  // namespace kimirt::cuda
