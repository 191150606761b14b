// MLA prefill attention on Hopper's warpgroup MMA (kernels.h MlaPrefillAttention, variant 2;
// spec §6.4; issue 14): the flash-attention kernel of mla_prefill_kernels.cu with its two matrix
// products as wgmma instead of mma.sync. The arithmetic is the same — S = Q Kᵀ in F32 from zero
// over k ascending, the online softmax's code, P rounded to BF16, O += P V over the tile's keys
// ascending — so each row keeps its row independence (mla_prefill_kernels.cu says why).
//
// One thread block = two warpgroups = 128 query rows of one sequence and head, which share each
// key tile (half the L2 traffic of 64-row blocks: a 64-row version of this kernel was slower than
// the mma.sync kernel's 128-row shape, 3.19 against 2.77 ms for an 8K prompt on an H200). Warp w
// of warpgroup u owns rows 64u + 16w .. + 15, and the wgmma accumulators put them where the
// m16n8k16 fragments do (lane (g, t): rows g and g + 8, columns 2t, 2t + 1 of every 8), so the
// softmax is the mma.sync kernel's line for line. What changes is where the operands live: each
// warpgroup's queries, rounded to BF16 once, as A fragments in registers (read from shared memory
// by every k step they cost 0.06 ms more an 8K prompt); each key tile [64, dn + dr] in shared
// memory as K-major 128-byte-swizzled panels and the value tile [64, dv] as MN-major ones, read
// by the wgmmas through descriptors (no ldmatrix); P from registers. Key tiles of 64 at absolute
// positions, STAGES in flight by cp.async; one block an SM (8 warps).
#include "kimirt/backend/cuda/mla_prefill_wgmma.h"

#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/flash_tile.cuh"
#include "kimirt/backend/cuda/ldmatrix_mma.cuh"
#include "kimirt/backend/cuda/wgmma.cuh"

#include <cuda_bf16.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>

namespace kimirt::cuda {
namespace {

constexpr int kBlockK = 64;  // keys per tile (absolute: row independence rests on it)
constexpr int kWarpGroups = 2;
constexpr int kBlockQ = 64 * kWarpGroups;  // query rows per block: m64 a warpgroup
constexpr int kThreads = 128 * kWarpGroups;
constexpr uint32_t kPanelBytes = 64 * 128;  // 64 rows × 64 BF16
constexpr float kLog2e = 1.4426950408889634f;

template <int DN, int DR, int DV, int STAGES>
struct WgTile {
  static constexpr int kDq = DN + DR;
  static constexpr uint32_t kKBytes = kDq / 64 * kPanelBytes;  // [64 keys, dq]
  static constexpr uint32_t kVBytes = DV / 64 * kPanelBytes;   // [64 keys, dv]
  // The key stages, and 1 KB to align the panels to the swizzle's 1,024 bytes.
  static constexpr size_t kSmemBytes = STAGES * (kKBytes + kVBytes) + 1024;
  static_assert(DN % 64 == 0 && DR % 64 == 0 && DV == 128, "panels of 64; the P V wgmma is m64n128");
  static_assert(kThreads == 8 * 32, "a tile's copies: 8 chunks a row, 32 rows a pass");
};

// Each warpgroup issues tile j + 1's S wgmma before tile j's softmax, so the tensor cores work
// while the softmax runs (FlashAttention-3's intra-warpgroup overlap): tiles j and j + 1 are read
// while the next STAGES − 2 land. Measured against the same kernel tile by tile (S, wait, softmax,
// P V, wait; 3 stages) on an H200: 1.40 against 1.54 ms for an 8K prompt, 22.8 against 24.7 at 32K.
template <int DN, int DR, int DV, int STAGES>
__global__ void __launch_bounds__(kThreads, 1) MlaPrefillWgmmaKernel(MlaPrefillArgs a) {
  using L = WgTile<DN, DR, DV, STAGES>;
  constexpr int DQ = L::kDq;
  constexpr int DKV = DN + DV;
  static_assert(STAGES >= 3, "the overlap reads two tiles while a third lands");
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t k_addr = (SharedAddress(smem_raw) + 1023u) & ~1023u;  // stage s at + s · kKBytes
  const uint32_t v_addr = k_addr + STAGES * L::kKBytes;                // stage s at + s · kVBytes

  const int64_t H = a.H;
  const PrefillBlock blk = BlockOf(a, kBlockQ, kBlockK);
  const int64_t h = blk.h, key_begin = blk.key_begin;
  const int t0 = blk.t0, q_row = blk.q_row, count = blk.count, start = blk.start, keys = blk.keys;
  const int num_tiles = blk.num_tiles;

  const int wg = threadIdx.x / 128, warp = threadIdx.x / 32 % 4, lane = threadIdx.x % 32;
  const int g = lane / 4, c = lane % 4;
  const int wg_t0 = t0 + 64 * wg;  // this warpgroup's first row
  const int r_lo = wg_t0 + warp * 16 + g;
  const int pos_lo = start + r_lo, pos_hi = pos_lo + 8;
  // A tile wholly in the future of this warpgroup's rows would leave them unchanged bit for bit
  // (mla_prefill_kernels.cu), so the first warpgroup skips the block's last tile.
  auto needs = [&](int j) { return j * kBlockK <= start + wg_t0 + 63; };

  const __nv_bfloat16* kv = static_cast<const __nv_bfloat16*>(a.kv) + key_begin * H * DKV + h * DKV;
  const __nv_bfloat16* ks = static_cast<const __nv_bfloat16*>(a.ks) + key_begin * DR;

  // Key tile j into stage `buf`, swizzled; rows past the sequence's end zero-filled. Thread t
  // copies the 16-byte chunk t % 8 of every 64-wide panel of rows t / 8 and t / 8 + 32 (the same
  // swizzle: it depends on the row mod 8), so the addresses are a few adds a tile.
  const int c8 = threadIdx.x % 8, row0 = threadIdx.x / 8;
  const uint32_t sw = wgmma::SwizzledOffset(row0, c8);
  auto load_tile = [&](int j, int buf) {
    const uint32_t kd = k_addr + buf * L::kKBytes + sw, vd = v_addr + buf * L::kVBytes + sw;
#pragma unroll
    for (int m = 0; m < kBlockK / 32; ++m) {
      const int key = j * kBlockK + row0 + 32 * m;
      const bool valid = key < keys;
      const int64_t at = valid ? key : 0;  // an invalid copy reads nothing, but from a valid address
      const __nv_bfloat16* kvr = kv + at * H * DKV + c8 * 8;
      const uint32_t row_off = 32 * 128 * m;
#pragma unroll
      for (int p = 0; p < DN / 64; ++p) CpAsync16(kd + p * kPanelBytes + row_off, kvr + 64 * p, valid);
      if constexpr (DR > 0) {
        const __nv_bfloat16* ksr = ks + at * DR + c8 * 8;
#pragma unroll
        for (int p = 0; p < DR / 64; ++p) CpAsync16(kd + (DN / 64 + p) * kPanelBytes + row_off, ksr + 64 * p, valid);
      }
#pragma unroll
      for (int p = 0; p < DV / 64; ++p) CpAsync16(vd + p * kPanelBytes + row_off, kvr + DN + 64 * p, valid);
    }
  };
#pragma unroll
  for (int j = 0; j < STAGES - 1; ++j) {
    if (j < num_tiles) load_tile(j, j);
    CpAsyncCommit();
  }
  // Tile j has landed once at most `pending` newer copy groups fly; the barrier also says every
  // warp is done with the tile before (its stage is the next load's).
  auto tile_ready = [&](auto pending) {
    CpAsyncWait<decltype(pending)::value>();
    wgmma::FenceProxyAsync();  // this thread's copies → the wgmma's reads
    __syncthreads();
  };

  // The A fragments of this thread's query rows r_lo and r_lo + 8, rounded to BF16 (rows past
  // the new tokens: zeros, never stored).
  unsigned qa[DQ / 16][4];
  QueryFragments<DQ>(r_lo < count ? a.q + ((int64_t{q_row} + r_lo) * H + h) * DQ : nullptr,
                     r_lo + 8 < count ? a.q + ((int64_t{q_row} + r_lo + 8) * H + h) * DQ : nullptr, c, qa);

  float o[DV / 2];  // O: n8 block n at o[4n .. 4n + 3], as the mma.sync kernel's acc[n]
#pragma unroll
  for (int i = 0; i < DV / 2; ++i) o[i] = 0.0f;
  SoftmaxRows rows;
  const float scale2 = a.scale * kLog2e;

  // S = Q Kᵀ of tile j over k ascending, from zero: 64 queries × 64 keys, issued, not waited for.
  auto issue_s = [&](int j, float(&s)[kBlockK / 2]) {
#pragma unroll
    for (int i = 0; i < kBlockK / 2; ++i) s[i] = 0.0f;
    wgmma::FenceRegs(s);
    wgmma::Fence();
    const uint32_t kt = k_addr + (j % STAGES) * L::kKBytes;
#pragma unroll
    for (int kk = 0; kk < DQ / 16; ++kk) {
      wgmma::WgmmaRS_m64n64k16<0>(s, qa[kk], wgmma::Desc128B(kt + (kk / 4) * kPanelBytes + (kk % 4) * 32, 16, 1024));
    }
    wgmma::Commit();
    wgmma::FenceRegs(s);
  };
  // Tile j's causal mask and online softmax (flash_tile.cuh, on the accumulators as the
  // m16n8 C fragments: s[4n + i] is s[n][i]), then O += P V over the tile's keys ascending,
  // issued, not waited for.
  auto softmax_pv = [&](int j, float(&s)[kBlockK / 2]) {
    const int key0 = j * kBlockK;
    unsigned pa[kBlockK / 16][4];
    SoftmaxTile<DV>(reinterpret_cast<float(&)[8][4]>(s), reinterpret_cast<float(&)[DV / 8][4]>(o), pa, rows,
                    key0 + kBlockK - 1 > start + wg_t0, key0, c, pos_lo, pos_hi, scale2);
    wgmma::FenceRegs(o);
    wgmma::Fence();
    const uint32_t vt = v_addr + (j % STAGES) * L::kVBytes;
#pragma unroll
    for (int kk = 0; kk < kBlockK / 16; ++kk) {
      wgmma::WgmmaRS_m64n128k16<1>(o, pa[kk], wgmma::Desc128B(vt + kk * 16 * 128, kPanelBytes, 1024));
    }
    wgmma::Commit();
    wgmma::FenceRegs(o);
  };

  float s[kBlockK / 2];
  tile_ready(std::integral_constant<int, STAGES - 2>{});
  issue_s(0, s);  // every row sees key 0
  wgmma::Wait<0>();
  wgmma::FenceRegs(s);
  for (int j = 0; j < num_tiles; ++j) {
    const bool next = j + 1 < num_tiles;
    if (next) {
      tile_ready(std::integral_constant<int, STAGES - 3>{});  // tile j + 1
      if (j + STAGES - 1 < num_tiles) load_tile(j + STAGES - 1, (j + STAGES - 1) % STAGES);
      CpAsyncCommit();  // possibly empty: keeps the group count per tile
    }
    float s_next[kBlockK / 2];
    const bool s_ahead = next && needs(j + 1);
    if (s_ahead) issue_s(j + 1, s_next);
    if (needs(j)) softmax_pv(j, s);
    wgmma::Wait<0>();
    wgmma::FenceRegs(o);
    if (s_ahead) {
      wgmma::FenceRegs(s_next);
#pragma unroll
      for (int i = 0; i < kBlockK / 2; ++i) s[i] = s_next[i];
    }
  }

  const auto row_out = [&](int r) { return r < count ? a.o + ((int64_t{q_row} + r) * H + h) * DV : nullptr; };
  StoreRows<DV>(rows, reinterpret_cast<float(&)[DV / 8][4]>(o), row_out(r_lo), row_out(r_lo + 8), c);
}

}  // namespace

template <int DN, int DR, int DV>
void MlaPrefillWgmma(const MlaPrefillArgs& a, cudaStream_t s) {
  constexpr int kStages = 4;  // 160 KB at dn + dr = 192
  constexpr size_t bytes = WgTile<DN, DR, DV, kStages>::kSmemBytes;
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(MlaPrefillWgmmaKernel<DN, DR, DV, kStages>, bytes, true, "MlaPrefillAttention (wgmma)", &configured);
  MlaPrefillWgmmaKernel<DN, DR, DV, kStages><<<static_cast<unsigned>(a.num_tiles * a.H), kThreads, bytes, s>>>(a);
  CheckLaunch("MlaPrefillAttention (wgmma)");
}
template void MlaPrefillWgmma<128, 64, 128>(const MlaPrefillArgs& a, cudaStream_t s);
template void MlaPrefillWgmma<128, 0, 128>(const MlaPrefillArgs& a, cudaStream_t s);

int64_t MlaPrefillWgmmaTileRows() { return kBlockQ; }

}  // namespace kimirt::cuda
