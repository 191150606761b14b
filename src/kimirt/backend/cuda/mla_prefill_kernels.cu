// MLA prefill attention on tensor cores (kernels.h MlaPrefillAttention; spec §6.4; issue 14):
// flash-attention style, FA2's register layout on Hopper's mma.sync m16n8k16 (BF16 in, F32
// accumulate).
//
// One thread block = a query tile of one sequence × one head, 4 warps of 16·M query rows each
// (kernels.h kMlaPrefillVariants: M = 1, the queries' BF16 A-fragments in registers for the
// whole block; M = 2, the queries in shared memory, each K / V fragment read feeding both
// m-tiles). Keys go by in tiles of 64 (absolute positions 0, 64, 128, ... of the sequence),
// single- or double-buffered in shared memory by cp.async: the key tile [64, dn + dr] assembled
// from the head's k_nope (kv row, first dn) and the shared k_s, the value tile [64, dv] from the
// kv row after dn. Per tile a warp computes its 16 × 64 scores per m-tile (S = Q Kᵀ, F32), masks
// the causal future with -inf, keeps each row's running max and sum (online softmax, exp2 of
// pre-scaled scores), rounds P to BF16 as the A operand of O += P V (the C fragments of S are
// laid out as the A fragments of P: no shared memory trip).
//
// Row independence (batch invariance and chunk invariance): a query row's arithmetic is the
// same whatever block it is in. Key tiles start at absolute multiples of 64 from position 0, a
// row sees them in order, and a tile entirely in a row's future leaves that row's state bit for
// bit unchanged (max unchanged, correction exp2(0) = 1, p = 0); an mma's output row depends on
// its own A row only, and the row max / sum are reduced across the four threads of that row
// alone. So a row's bits depend on its query and its sequence's keys and values only, not on how
// the new tokens are cut into calls, nor on the other sequences of a call.
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/flash_tile.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/mla_prefill_wgmma.h"

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace kimirt::cuda {
namespace {

constexpr int kBlockK = 64;  // keys per tile (absolute: row independence rests on it)
constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
// Shared-memory rows padded by 8 BF16 (16 bytes): rows of 200 or 136 elements lie 16 bytes apart
// modulo 128, so the 8 row addresses of an ldmatrix hit 8 distinct bank groups.
constexpr int kPad = 8;
constexpr float kLog2e = 1.4426950408889634f;

// M: 16-row m-tiles per warp (a K or V fragment read from shared memory feeds M mma); with
// M > 1 the block's queries wait in shared memory as BF16 (registers hold them for M = 1).
// STAGES: key tiles in flight (2: the next one loads while this one is used).
template <int DN, int DR, int DV, int M, int STAGES>
struct PrefillTile {
  static constexpr int kDq = DN + DR;
  static constexpr int kBlockQ = kWarps * 16 * M;  // queries per thread block
  static constexpr int kKStride = kDq + kPad;      // elements (K and Q rows)
  static constexpr int kVStride = DV + kPad;
  static constexpr int kKElems = kBlockK * kKStride;
  static constexpr int kVElems = kBlockK * kVStride;
  static constexpr int kQElems = M > 1 ? kBlockQ * kKStride : 0;
  static constexpr size_t kSmemBytes =
      static_cast<size_t>(STAGES * (kKElems + kVElems) + kQElems) * sizeof(__nv_bfloat16);
  static_assert(DN % 16 == 0 && DR % 16 == 0 && DV % 16 == 0, "head widths must be multiples of 16");
  static_assert(M == 1 || M == 2, "one or two m-tiles a warp");
  static_assert(STAGES == 1 || STAGES == 2, "one or two key tiles in flight");
};



template <int DN, int DR, int DV, int M, int STAGES>
__global__ void __launch_bounds__(kThreads) MlaPrefillKernel(MlaPrefillArgs a) {
  using L = PrefillTile<DN, DR, DV, M, STAGES>;
  constexpr int DQ = L::kDq;
  constexpr int DKV = DN + DV;  // a kv row per head: k_nope ‖ v
  extern __shared__ __align__(128) unsigned char smem_raw[];
  __nv_bfloat16* const k_smem = reinterpret_cast<__nv_bfloat16*>(smem_raw);  // [STAGES][kBlockK][kKStride]
  __nv_bfloat16* const v_smem = k_smem + STAGES * L::kKElems;                // [STAGES][kBlockK][kVStride]
  __nv_bfloat16* const q_smem = v_smem + STAGES * L::kVElems;                // [kBlockQ][kKStride] (M > 1)

  const int64_t H = a.H;
  const PrefillBlock blk = BlockOf(a, L::kBlockQ, kBlockK);
  const int64_t h = blk.h, key_begin = blk.key_begin;
  const int t0 = blk.t0, q_row = blk.q_row, count = blk.count, start = blk.start, keys = blk.keys;
  const int num_tiles = blk.num_tiles;

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;  // fragment row group and column pair
  // m-tile mt of this warp: the block's rows warp·16M + 16mt ..; this thread's two of them.
  int r_lo[M], pos_lo[M], pos_hi[M];
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
    r_lo[mt] = t0 + (warp * M + mt) * 16 + g;
    pos_lo[mt] = start + r_lo[mt];
    pos_hi[mt] = pos_lo[mt] + 8;
  }

  const __nv_bfloat16* kv = static_cast<const __nv_bfloat16*>(a.kv) + key_begin * H * DKV + h * DKV;
  const __nv_bfloat16* ks = static_cast<const __nv_bfloat16*>(a.ks) + key_begin * DR;

  // Key tile j into buffer `buf`: rows past the sequence's end are zero-filled.
  auto load_tile = [&](int j, int buf) {
    __nv_bfloat16* kd = k_smem + buf * L::kKElems;
    __nv_bfloat16* vd = v_smem + buf * L::kVElems;
    constexpr int kChunksK = DQ / 8, kChunksV = DV / 8;  // 16-byte chunks per row
    for (int i = threadIdx.x; i < kBlockK * kChunksK; i += kThreads) {
      const int row = i / kChunksK, ch = i % kChunksK;
      const int key = j * kBlockK + row;
      const bool valid = key < keys;
      const __nv_bfloat16* src = kv;
      if (valid) src = ch < DN / 8 ? kv + int64_t{key} * H * DKV + ch * 8 : ks + int64_t{key} * DR + (ch - DN / 8) * 8;
      CpAsync16(kd + row * L::kKStride + ch * 8, src, valid);
    }
    for (int i = threadIdx.x; i < kBlockK * kChunksV; i += kThreads) {
      const int row = i / kChunksV, ch = i % kChunksV;
      const int key = j * kBlockK + row;
      const bool valid = key < keys;
      CpAsync16(vd + row * L::kVStride + ch * 8, valid ? kv + int64_t{key} * H * DKV + DN + ch * 8 : kv, valid);
    }
  };

  if constexpr (STAGES == 2) {
    load_tile(0, 0);
    CpAsyncCommit();
  }

  // The query rows rounded to BF16 (rows past the new tokens: zeros, never stored): as A-fragments
  // in registers (M = 1), or in shared memory for ldmatrix (M > 1; the first barrier publishes it).
  unsigned qa[M == 1 ? DQ / 16 : 1][4];
  if constexpr (M == 1) {
    QueryFragments<DQ>(r_lo[0] < count ? a.q + ((int64_t{q_row} + r_lo[0]) * H + h) * DQ : nullptr,
                       r_lo[0] + 8 < count ? a.q + ((int64_t{q_row} + r_lo[0] + 8) * H + h) * DQ : nullptr, c, qa);
  } else {
    for (int i = threadIdx.x; i < L::kBlockQ * (DQ / 2); i += kThreads) {
      const int row = i / (DQ / 2), pair = i % (DQ / 2);
      const int t = t0 + row;
      float2 v = make_float2(0.0f, 0.0f);
      if (t < count) v = *reinterpret_cast<const float2*>(a.q + ((int64_t{q_row} + t) * H + h) * DQ + 2 * pair);
      *reinterpret_cast<unsigned*>(q_smem + row * L::kKStride + 2 * pair) = PackBf16(v.x, v.y);
    }
  }

  float acc[M][DV / 8][4];
  SoftmaxRows rows[M];
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
#pragma unroll
    for (int n = 0; n < DV / 8; ++n) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
  }
  const float scale2 = a.scale * kLog2e;
  // ldmatrix row addresses: lane → (row within 16, column offset 0 or 8) of its 8×8 matrix.
  const int mi = lane / 8;
  const int k_row = (lane % 8) + (mi / 2) * 8, k_col = (mi % 2) * 8;  // K: (keys, dq) → B fragments
  const int a_row = (lane % 8) + (mi % 2) * 8, a_col = (mi / 2) * 8;  // V transposed → B; Q → A

  for (int j = 0; j < num_tiles; ++j) {
    int buf = 0;
    if constexpr (STAGES == 2) {
      if (j + 1 < num_tiles) load_tile(j + 1, (j + 1) & 1);
      CpAsyncCommit();  // possibly empty: keeps "all but the newest group" = tile j
      CpAsyncWait<1>();
      buf = j & 1;
    } else {
      load_tile(j, 0);
      CpAsyncCommit();
      CpAsyncWait<0>();
    }
    __syncthreads();
    const __nv_bfloat16* kt = k_smem + buf * L::kKElems;
    const __nv_bfloat16* vt = v_smem + buf * L::kVElems;

    // S = Q Kᵀ: per m-tile 8 n-tiles of 8 keys; each K fragment read once for the M m-tiles.
    float s[M][kBlockK / 8][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
#pragma unroll
      for (int n = 0; n < kBlockK / 8; ++n) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
    }
#pragma unroll
    for (int kk = 0; kk < DQ / 16; ++kk) {
      unsigned qf[M][4];
      if constexpr (M == 1) {
#pragma unroll
        for (int i = 0; i < 4; ++i) qf[0][i] = qa[kk][i];
      } else {
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          Ldmatrix4(qf[mt], q_smem + ((warp * M + mt) * 16 + a_row) * L::kKStride + kk * 16 + a_col);
        }
      }
#pragma unroll
      for (int np = 0; np < kBlockK / 16; ++np) {
        unsigned b[4];
        Ldmatrix4(b, kt + (np * 16 + k_row) * L::kKStride + kk * 16 + k_col);
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          Mma(s[mt][2 * np], qf[mt], b[0], b[1]);
          Mma(s[mt][2 * np + 1], qf[mt], b[2], b[3]);
        }
      }
    }
    // Causal mask (only tiles reaching past the block's first query position have future keys)
    // and the online softmax, per m-tile (flash_tile.cuh).
    const int key0 = j * kBlockK;
    const bool diagonal = key0 + kBlockK - 1 > start + t0;
    unsigned pa[M][kBlockK / 16][4];
#pragma unroll
    for (int mt = 0; mt < M; ++mt) {
      SoftmaxTile<DV>(s[mt], acc[mt], pa[mt], rows[mt], diagonal, key0, c, pos_lo[mt], pos_hi[mt], scale2);
    }
    // O += P V, each V fragment read once for the M m-tiles.
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
#pragma unroll
      for (int np = 0; np < DV / 16; ++np) {
        unsigned b[4];
        Ldmatrix4Trans(b, vt + (kk * 16 + a_row) * L::kVStride + np * 16 + a_col);
#pragma unroll
        for (int mt = 0; mt < M; ++mt) {
          Mma(acc[mt][2 * np], pa[mt][kk], b[0], b[1]);
          Mma(acc[mt][2 * np + 1], pa[mt][kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // the buffer is refilled by the next load
  }

  // The rows' sums over their quad, then O / l (flash_tile.cuh).
#pragma unroll
  for (int mt = 0; mt < M; ++mt) {
    const auto row_out = [&](int r) { return r < count ? a.o + ((int64_t{q_row} + r) * H + h) * DV : nullptr; };
    StoreRows<DV>(rows[mt], acc[mt], row_out(r_lo[mt]), row_out(r_lo[mt] + 8), c);
  }
}

template <int DN, int DR, int DV, int M, int STAGES>
void Launch(const MlaPrefillArgs& a, cudaStream_t s) {
  constexpr size_t bytes = PrefillTile<DN, DR, DV, M, STAGES>::kSmemBytes;
  // Above the 48 KB default: opt in (per device, so on every call; it costs nothing).
  AllowDynamicSmem(MlaPrefillKernel<DN, DR, DV, M, STAGES>, bytes, false, "MlaPrefillAttention", nullptr);
  MlaPrefillKernel<DN, DR, DV, M, STAGES><<<static_cast<unsigned>(a.num_tiles * a.H), kThreads, bytes, s>>>(a);
  CheckLaunch("MlaPrefillAttention");
}

template <int DN, int DR, int DV>
void LaunchVariant(const MlaPrefillArgs& a, cudaStream_t s) {
  switch (a.variant) {
    case 0:
      Launch<DN, DR, DV, 1, 2>(a, s);
      return;
    case 1:
      Launch<DN, DR, DV, 2, 1>(a, s);
      return;
    case 2:
      MlaPrefillWgmma<DN, DR, DV>(a, s);
      return;
    default:
      std::fprintf(stderr, "kimirt: MlaPrefillAttention: no variant %d\n", a.variant);
      std::abort();
  }
}

__global__ void ToBf16Kernel(const float* x, __nv_bfloat16* y, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = __float2bfloat16_rn(x[i]);
  }
}

}  // namespace

bool MlaPrefillSupported(int64_t dn, int64_t dr, int64_t dv) {
  return dn == 128 && dv == 128 && (dr == 64 || dr == 0);
}

int64_t MlaPrefillTileRows(int variant) { return variant == 2 ? MlaPrefillWgmmaTileRows() : variant == 0 ? 64 : 128; }

void MlaPrefillAttention(const MlaPrefillArgs& a, cudaStream_t s) {
  if (a.num_tiles == 0 || a.H == 0) return;
  // One block per (query tile, head), in every variant.
  if (a.num_tiles * a.H > 0x7fffffff) {
    std::fprintf(stderr, "kimirt: MlaPrefillAttention: %lld blocks exceed the grid\n",
                 static_cast<long long>(a.num_tiles * a.H));
    std::abort();
  }
  if (a.dn == 128 && a.dv == 128 && a.dr == 64) {
    LaunchVariant<128, 64, 128>(a, s);
  } else if (a.dn == 128 && a.dv == 128 && a.dr == 0) {
    LaunchVariant<128, 0, 128>(a, s);
  } else {
    std::fprintf(stderr, "kimirt: MlaPrefillAttention: no kernel for dn %lld, dr %lld, dv %lld\n",
                 static_cast<long long>(a.dn), static_cast<long long>(a.dr), static_cast<long long>(a.dv));
    std::abort();
  }
}

MlaPrefillPlan PlanMlaPrefill(const std::vector<int64_t>& start, const std::vector<int64_t>& count,
                              const std::vector<int64_t>& row, int variant) {
  MlaPrefillPlan p;
  p.B = static_cast<int64_t>(start.size());
  p.variant = variant;
  const int64_t block_q = MlaPrefillTileRows(variant);
  if (count.size() != start.size() || row.size() != start.size()) {
    std::fprintf(stderr, "kimirt: PlanMlaPrefill: start, count and row differ in length\n");
    std::abort();
  }
  struct Tile {
    int32_t seq, t0;
    int64_t key_tiles;
  };
  std::vector<Tile> tiles;
  for (int64_t b = 0; b < p.B; ++b) {
    const size_t i = static_cast<size_t>(b);
    const int64_t len = start[i] + count[i];
    if (start[i] < 0 || count[i] < 0 || row[i] < 0 || p.keys + len > 0x7fffffff || row[i] + count[i] > 0x7fffffff) {
      std::fprintf(stderr, "kimirt: PlanMlaPrefill: sequence %lld out of range\n", static_cast<long long>(b));
      std::abort();
    }
    p.key_begin.push_back(p.keys);
    p.meta.insert(p.meta.end(), {static_cast<int32_t>(row[i]), static_cast<int32_t>(count[i]),
                                 static_cast<int32_t>(start[i]), static_cast<int32_t>(p.keys)});
    for (int64_t t0 = 0; t0 < count[i]; t0 += block_q) {
      const int64_t last = std::min(t0 + block_q, count[i]);
      tiles.push_back({static_cast<int32_t>(b), static_cast<int32_t>(t0), (start[i] + last + kBlockK - 1) / kBlockK});
    }
    p.keys += len;
  }
  std::stable_sort(tiles.begin(), tiles.end(), [](const Tile& x, const Tile& y) { return x.key_tiles > y.key_tiles; });
  for (const Tile& t : tiles) p.meta.insert(p.meta.end(), {t.seq, t.t0});
  p.num_tiles = static_cast<int64_t>(tiles.size());
  return p;
}

MlaPrefillArgs PlannedMlaPrefillArgs(const MlaPrefillPlan& plan, const int32_t* d_meta, int64_t H, int64_t dn,
                                     int64_t dr, int64_t dv) {
  MlaPrefillArgs a;
  a.variant = plan.variant;
  a.seqs = d_meta;
  a.tiles = d_meta + 4 * plan.B;
  a.num_tiles = plan.num_tiles;
  a.H = H;
  a.dn = dn;
  a.dr = dr;
  a.dv = dv;
  a.scale = 1.0f / std::sqrt(static_cast<float>(dn + dr));
  return a;
}

void ToBf16(const float* x, void* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  const int64_t blocks = (n + 255) / 256 < 4096 ? (n + 255) / 256 : 4096;
  ToBf16Kernel<<<static_cast<unsigned>(blocks), 256, 0, s>>>(x, static_cast<__nv_bfloat16*>(y), n);
  CheckLaunch("ToBf16");
}

}  // namespace kimirt::cuda
