// The paged MLA decode split on Hopper's warpgroup MMA (kernels.h MlaDecodeVariant::kWgmma; spec
// §6.6; issue 12), for BF16 and FP8 latents at the models' widths (latent 512, rope 64). The mma.sync
// split (mla_decode_kernels.cu) is issue-bound at ~0.12 of HBM at 32K: 16 heads an m16 tile, so
// each tile's rows are read from shared memory by ldmatrix twice per 16 heads, and every k step's
// two MMAs are added to the scores by hand. Here one m64 wgmma holds 32 heads:
//
//   rows 16w + g and 16w + g + 8 of the m64 are head 8w + g's q̄ split in two BF16 parts,
//   hi = bf16(q̄) and lo = bf16(q̄ − hi) (16 significant bits, as the mma.sync split), so the
//   wgmma accumulator layout gives lane (g, c) of warp w both parts of one head's scores: the
//   head's score is its hi row plus its lo row, in one thread's registers.
//
// Block = (split of one sequence, 32 heads), two warpgroups; per tile of 32 positions:
//   1. S: warpgroup u runs k steps 18u .. 18u + 17 of the 36 (16 wide) as m64n32k16 wgmmas, q̄
//      and the tile both read from shared memory by descriptor, F32 from zero; the two partial
//      tiles are swapped through shared memory and added (x + y, the same bits in both groups:
//      addition commutes), then hi row + lo row.
//   2. The online softmax of each head over the quad that holds it (F32, expf: the mma.sync
//      split's functions), done alike in both warpgroups; P split into hi / lo parts as q̄ was,
//      the parts the A fragments' rows g and g + 8.
//   3. ō += P · c: warpgroup u owns latent dims 256u .. 256u + 255 (two m64n128k16 a k step),
//      the tile read as the MN-major B operand from the same shared memory as step 1's K-major
//      one. The hi and lo rows accumulate apart and are added once, when the split stores ō.
//
// The tile lies in shared memory as nine 128-byte-swizzled panels of 64 columns (wgmma.cuh):
// K-major for S ([positions, 576]) and MN-major for ō ([positions, 512], 64 dims a panel) are the
// same bytes. Three stages of 36 KB by cp.async, q̄ (72 KB) and the partial scores: one block an
// SM, two tiles in flight while one is worked on. FP8 E4M3 rows (codes and a latent and a rope
// scale each) come in as they lie, three stages of 18 KB, and are widened (exactly: every E4M3
// value is a BF16 value) into one of two tiles of panels a tile ahead, while the tensor cores run
// the tile before's ō (docs/cuda.md "FP8 rows widened a tile ahead"); warpgroup 1 keeps its rope
// k steps' scores apart,
// s = scale · (latent scale · latent sum + rope scale · rope sum), and P carries the row's latent
// scale into ō while l sums P alone, as the mma.sync split does.
//
// Precision: products exact, F32 accumulation in the tensor cores (which truncate their adds:
// mma_bf16.cuh) over 18 k steps of a warpgroup, then F32 adds. Not the mma.sync split's order, so
// not its bits: CudaBackendTest.PagedDecode* hold it to the CPU at the same RelL2 ≤ 2e-5, and each
// sequence alone to its row of the batch, bit for bit. Batch invariance: a block reads its own
// sequence's rows and query, on the split schedule of its own context (MlaDecodeSplitLen).
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/mla_decode_wgmma_parts.cuh"
#include "kimirt/backend/cuda/pdl.cuh"
#include "kimirt/backend/cuda/wgmma.cuh"

#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
using namespace mla_wgmma;  // NOLINT: this file's kernel is built from those parts
namespace {

constexpr uint32_t kSwapSlotBytes = 4 * 128 * 16;  // a warpgroup's partial S tile: 4 float4 a thread
// Shared memory of kind 1 (BF16 rows, copied straight into the swizzled panels the wgmmas read)
// and kind 2 (FP8 E4M3 codes and their two F32 scales a row, copied as they lie, then widened
// into one of two tiles of panels, a tile ahead: every E4M3 value is a BF16 value). Offsets from
// the 1 KB-aligned base.
template <int kKind>
struct Layout {
  static constexpr int kStages = 3;                   // kind 1: 36 KB a stage; kind 2: 18 KB
  static constexpr uint32_t kCodeBytes = kTile * kW;  // kind 2: a stage's codes, then its scales
  static constexpr uint32_t kStageBytes = kKind == 1 ? kTileBytes : kCodeBytes + kTile * 8;
  static constexpr uint32_t kRingAt = kQBytes + (kKind == 1 ? 0 : 2 * kTileBytes);  // kind 2: the widened tiles first
  static constexpr uint32_t kSwapAt = kRingAt + kStages * kStageBytes;
  // Slots: each warpgroup's partial S (kind 2: latent k steps), and kind 2 warpgroup 1's rope.
  static constexpr int kSwapSlots = kKind == 1 ? 2 : 3;
  static constexpr size_t kSmemBytes = kSwapAt + kSwapSlots * kSwapSlotBytes + 1024;  // + alignment
};
static_assert(Layout<1>::kSmemBytes <= 227 * 1024 && Layout<2>::kSmemBytes <= 227 * 1024, "one block an SM");

// S's k steps kStep0 .. kStep0 + 17 (of 36), from zero, issued and committed: those below
// kRopeFrom into s, the others into s_rope (FP8 rows scale their latent and rope parts apart). q̄
// and the tile by descriptors whose start addresses advance by constants from the panels' bases
// (the start field is the address >> 4, 14 bits: shared addresses below 256 KB never carry out).
template <int kStep0, int kRopeFrom>
__device__ __forceinline__ void IssueScores(float (&s)[16], float (&s_rope)[16], uint64_t desc_q, uint64_t desc_tile) {
  constexpr bool kRope = kRopeFrom < kStep0 + kStepsPerGroup;
#pragma unroll
  for (int i = 0; i < 16; ++i) s[i] = 0.0f;
  wgmma::FenceRegs(s);
  if constexpr (kRope) {
#pragma unroll
    for (int i = 0; i < 16; ++i) s_rope[i] = 0.0f;
    wgmma::FenceRegs(s_rope);
  }
  wgmma::Fence();
#pragma unroll
  for (int k = 0; k < kStepsPerGroup; ++k) {
    const int step = kStep0 + k, p = step / 4, col = (step % 4) * 32;
    const uint64_t dq = desc_q + ((p * kQPanelBytes + col) >> 4), dt = desc_tile + ((p * kTilePanelBytes + col) >> 4);
    if (step < kRopeFrom) {
      wgmma::WgmmaSS_m64n32k16<0>(s, dq, dt);
    } else {
      wgmma::WgmmaSS_m64n32k16<0>(s_rope, dq, dt);
    }
  }
  wgmma::Commit();
}

// One kernel for both schedules: a block runs the items w0 .. w1 − 1 (persistent: a run of
// a.block_work; else the one item blockIdx.x), each exactly as a block of its own would (ō, m and
// l from zero, the tiles of its split in order), so the schedule never changes a bit.
template <int kKind>
__global__ void __launch_bounds__(kThreads, 1)
    MlaDecodeWgmmaKernel(PagedDecodeArgs a, const float* qc, float* part_o, float* part_ml) {
  constexpr bool kAhead = kKind == 2;  // FP8 rows: each tile widened a tile ahead
  using L = Layout<kKind>;
  constexpr int kStages = L::kStages;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = SharedAddress(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // panels at multiples of 1 KB (the swizzle's)
  const uint32_t q_addr = base, ring = base + L::kRingAt;  // stage s at ring + s · kStageBytes
  unsigned char* const base_ptr = smem_raw + (base - raw);
  float4* const swap = reinterpret_cast<float4*>(base_ptr + L::kSwapAt);
  int w0, w1;
  BlockItems(a, &w0, &w1);
  if (w0 >= w1) return;  // the whole block: no work this step
  const int64_t h0 = int64_t{blockIdx.y} * kHeads;
  const int tid = threadIdx.x, wg = tid / 128, warp = tid / 32 % 4, lane = tid % 32, g = lane / 4, c = lane % 4;

  // The tile copies: thread tid takes row tid / 8 of every tile. Kind 1: the 16-byte chunk tid % 8
  // of each panel, straight into its swizzled place (the same swizzle in all: it depends on the row
  // mod 8). Kind 2: the row's codes as they lie, chunks tid % 8 + 8i, and its scales. The pool row
  // of the next tile is read a tile before the copy is issued, so the table load's latency hides
  // behind a tile. Rows past the split's end are zero-filled (P = 0 meets zeros) and read nothing.
  constexpr uint32_t kRowBytes = kKind == 1 ? kW * 2 : kW;
  const int row = tid / 8, sub = tid % 8;
  const uint32_t sw = wgmma::SwizzledOffset(row, sub);
  TileStream copy;
  copy.Begin(a, w0, w1, row);
  int64_t row_ahead = -1;
  bool ahead = copy.Next(a, &row_ahead);  // the same in every thread: all walk the same tiles
  auto issue = [&](int stage) {
    const bool valid = row_ahead >= 0;
    const int64_t at = valid ? row_ahead : 0;
    const unsigned char* src = static_cast<const unsigned char*>(a.values) + at * kRowBytes + sub * 16;
    const uint32_t st = ring + stage * L::kStageBytes;
    if constexpr (kKind == 1) {
#pragma unroll
      for (int p = 0; p < kPanels; ++p) CpAsync16(st + sw + p * kTilePanelBytes, src + p * 128, valid);
    } else {
#pragma unroll
      for (int i = 0; i < (kW / 16 + 7) / 8; ++i) {
        if (sub + 8 * i < kW / 16) CpAsync16(st + row * kW + (sub + 8 * i) * 16, src + 128 * i, valid);
      }
      if (sub == 0) CpAsync8(base_ptr + (st - base) + L::kCodeBytes + row * 8, a.scales + at * 2, valid);
    }
    ahead = copy.Next(a, &row_ahead);
  };
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (ahead) issue(i);
    CpAsyncCommit();  // one group a tile, empty past the end: the wait count is the same each tile
  }
  // kAhead: the block's tile k widened from its stage into widened tile k mod 2 (this thread's
  // row, panel i's chunk `sub` from codes i·64 + 8·sub .. + 7), once every thread's copies of it
  // have landed; the barrier also orders every thread's last reads of what is overwritten here —
  // tile k − 1's stage (its codes widened and its scales read before), which takes the copy of
  // tile k + 2, and widened tile k − 2 (S and ō of it waited for). Tile k − 1's ō runs on the
  // tensor cores meanwhile; the caller's next barrier makes the widened tile whole.
  int total = 0;  // kAhead: the block's tiles
  if constexpr (kAhead) {
    for (int w = w0; w < w1; ++w) total += Item::Load(a, w).Tiles();
  }
  auto widen = [&](int k) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    if (ahead) issue((k + kStages - 1) % kStages);
    CpAsyncCommit();
    const unsigned char* codes = base_ptr + L::kRingAt + (k % kStages) * L::kStageBytes + row * kW + sub * 8;
    unsigned char* dst = base_ptr + kQBytes + (k % 2) * kTileBytes + sw;
#pragma unroll
    for (int i = 0; i < kPanels; ++i) {
      *reinterpret_cast<uint4*>(dst + i * kTilePanelBytes) = WidenFp8x8(*reinterpret_cast<const uint2*>(codes + i * 64));
    }
    wgmma::FenceProxyAsync();
  };
  // Launched with LaunchPdl (pdl.cuh). The step's metadata and the latent rows were written
  // before the kernel ahead of this one (AbsorbQuery) passed its own PdlWait, so the copies above
  // may start while it runs; q̄ is its output, read after the wait. Nothing is written before it.
  PdlWait();
  PdlTrigger();
  if constexpr (kAhead) {
    if (total > 0) widen(0);
    __syncthreads();
  }

  const uint64_t desc_q = wgmma::Desc128B(q_addr, 16, 1024);
  int q_of = -1;  // the sequence whose q̄ the panels hold
  int t = 0;          // the block's tile count so far: the ring's stage
  for (int work = w0; work < w1; ++work) {
    const Item item = Item::Load(a, work);
    const int64_t b = item.b;
    if (b != q_of) {
      // Every thread is past the previous tile's score barrier, so no wgmma still reads q̄.
      LoadQuery(a, qc, b, h0, tid, base_ptr);
      q_of = b;
      if constexpr (kAhead) __syncthreads();  // q̄ whole before S (BF16 rows: the tile's barrier)
    }
    float o0[64], o1[64];  // ō, this warpgroup's dims 256wg + [0, 128) and + [128, 256)
#pragma unroll
    for (int i = 0; i < 64; ++i) o0[i] = o1[i] = 0.0f;
    float m = -INFINITY, l = 0.0f;  // head 8·warp + g's running max and this lane's share of the sum
    const int ntiles = item.Tiles();

    for (int it = 0; it < ntiles; ++it, ++t) {
      if constexpr (!kAhead) {
        CpAsyncWait<kStages - 2>();  // this thread's copies of tile t have landed ...
        wgmma::FenceProxyAsync();
        __syncthreads();  // ... everyone's; and both warpgroups are done with tile t − 1's stage
        if (ahead) issue((t + kStages - 1) % kStages);
        CpAsyncCommit();
      }
      const uint32_t stage = ring + (t % kStages) * L::kStageBytes;
      // The panels the wgmmas read: kind 1 the stage itself; kind 2 the tile widened from it by
      // widen(t), a tile ago.
      const uint32_t st = kAhead ? base + kQBytes + (t % 2) * kTileBytes : stage;

      // 1. This warpgroup's half of S over k ascending, from zero (kind 2: warpgroup 1's rope
      // steps apart).
      float s[16], s_rope[16];  // m64n32 accumulators: [4n + e] row g (e < 2) or g + 8, column 8n + 2c + e % 2
      constexpr int kRopeFrom = kKind == 1 ? 2 * kStepsPerGroup : kLatentSteps;
      const uint64_t desc_tile = wgmma::Desc128B(st, 16, 1024);
      if (wg == 0) {
        IssueScores<0, kRopeFrom>(s, s_rope, desc_q, desc_tile);
      } else {
        IssueScores<kStepsPerGroup, kRopeFrom>(s, s_rope, desc_q, desc_tile);
      }
      wgmma::Wait<0>();
      wgmma::FenceRegs(s);
      if constexpr (kKind == 2) wgmma::FenceRegs(s_rope);
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        swap[(wg * 4 + j) * 128 + tid % 128] = make_float4(s[4 * j], s[4 * j + 1], s[4 * j + 2], s[4 * j + 3]);
        if (kKind == 2 && wg == 1) {
          swap[(8 + j) * 128 + tid % 128] = make_float4(s_rope[4 * j], s_rope[4 * j + 1], s_rope[4 * j + 2], s_rope[4 * j + 3]);
        }
      }
      __syncthreads();

      // 2. The head's scores at this lane's 8 columns (x[2n + e]: column 8n + 2c + e), the online
      // softmax over the quad, P's parts as the A fragments of the tile's two k16 steps. Kind 2:
      // s = scale · (latent scale · latent sum + rope scale · rope sum), and P carries the row's
      // latent scale (ō sums p · scale · code; l sums p alone), as the mma.sync split does.
      const int valid = item.s1 - item.s0 - it * kTile;
      const float* scales = reinterpret_cast<const float*>(base_ptr + (stage - base) + L::kCodeBytes);
      float x[8], lat_scale[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 y = swap[((1 - wg) * 4 + j) * 128 + tid % 128];
        const float t[4] = {s[4 * j] + y.x, s[4 * j + 1] + y.y, s[4 * j + 2] + y.z, s[4 * j + 3] + y.w};
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * c + e;
          float sc = t[e] + t[e + 2];  // hi row + lo row
          if constexpr (kKind == 2) {
            const float4 r = swap[(8 + j) * 128 + tid % 128];  // warpgroup 1's rope, the same in both
            const float rope = (e == 0 ? r.x + r.z : r.y + r.w);
            const float2 rs = *reinterpret_cast<const float2*>(scales + 2 * col);
            sc = rs.x * sc + rs.y * rope;
            lat_scale[2 * j + e] = rs.x;
          }
          x[2 * j + e] = col < valid ? a.scale * sc : -INFINITY;
        }
      }
      const float corr = SoftmaxStepScaled<kKind>(x, m, l, lat_scale);
      // ō · corr, skipped by a warp whose heads all kept their max (corr = 1: x · 1 is x, so the
      // bits are the same either way; after the first tiles the max rarely moves).
      if (__any_sync(0xffffffffu, corr != 1.0f)) {
#pragma unroll
        for (int i = 0; i < 64; ++i) o0[i] *= corr, o1[i] *= corr;
      }
      unsigned pa[2][4];  // k step kk: columns 16kk .. 16kk + 15, rows g (hi) and g + 8 (lo)
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        SplitPair(x[4 * kk], x[4 * kk + 1], pa[kk][0], pa[kk][1]);
        SplitPair(x[4 * kk + 2], x[4 * kk + 3], pa[kk][2], pa[kk][3]);
      }

      // 3. ō += P · c over the tile's positions ascending; waited for here, so the panels are free
      // once both warpgroups pass the next tile's barrier. FP8 rows: tile t + 1 is widened while
      // the tensor cores run it, then the barrier that makes it whole.
      if constexpr (!kAhead) {
        AccumulateTile(o0, o1, pa, st, wg);
      } else {
        AccumulateTile<false>(o0, o1, pa, st, wg);
        if (t + 1 < total) widen(t + 1);
        AccumulateWait(o0, o1);
        __syncthreads();
      }
    }

    // The split's unnormalized ō (hi row + lo row) and (max, sum) per head.
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int64_t head = h0 + 8 * warp + g;
    if (head < a.H) {
      float* po = part_o + (work * a.H + head) * kR + 256 * wg + 2 * c;
#pragma unroll
      for (int n = 0; n < 16; ++n) {
        *reinterpret_cast<float2*>(po + 8 * n) = make_float2(o0[4 * n] + o0[4 * n + 2], o0[4 * n + 1] + o0[4 * n + 3]);
        *reinterpret_cast<float2*>(po + 128 + 8 * n) = make_float2(o1[4 * n] + o1[4 * n + 2], o1[4 * n + 1] + o1[4 * n + 3]);
      }
      if (wg == 0 && c == 0) {
        part_ml[(work * a.H + head) * 2] = m;
        part_ml[(work * a.H + head) * 2 + 1] = l;
      }
    }
  }
  CpAsyncWait<0>();  // only empty groups remain; nothing in flight when the block ends
}

template <int kKind>
void Launch(PagedDecodeArgs a, const float* qc, float* part_o, float* part_ml, bool persistent, cudaStream_t s) {
  constexpr size_t bytes = Layout<kKind>::kSmemBytes;
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(MlaDecodeWgmmaKernel<kKind>, bytes, true, "MLA decode kernel (wgmma)", &configured);
  const bool walk = persistent && a.block_work != nullptr;
  if (!walk) a.block_work = nullptr;
  const int64_t blocks = walk ? a.persist_blocks : a.num_work;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((a.H + kHeads - 1) / kHeads));
  LaunchPdl("MlaDecodeWgmma", MlaDecodeWgmmaKernel<kKind>, grid, dim3(kThreads), bytes, s, a, qc, part_o, part_ml);
  CheckLaunch("MlaDecodeWgmma");
}

}  // namespace

bool MlaPagedDecodeWgmmaSupported(const PagedDecodeArgs& a) {
  return a.r == kR && a.dr == kDr && (a.kind == 1 || a.kind == 2);
}

void MlaPagedDecodeSplitWgmma(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml,
                              bool persistent, cudaStream_t s) {
  if (!MlaPagedDecodeWgmmaSupported(a)) {
    std::fprintf(stderr, "kimirt: the wgmma MLA decode takes BF16 or FP8 latents of %d + %d, got kind %d, %lld + %lld\n",
                 kR, kDr, a.kind, static_cast<long long>(a.r), static_cast<long long>(a.dr));
    std::abort();
  }
  a.kind == 1 ? Launch<1>(a, qc, part_o, part_ml, persistent, s) : Launch<2>(a, qc, part_o, part_ml, persistent, s);
}

}  // namespace kimirt::cuda
