// The paged MLA decode split on Hopper's warpgroup MMA, warp-specialized (kernels.h
// MlaDecodeVariant::kWgmmaWs and kWgmmaWsTma, the default; spec §6.6; issue 12). Its parts are the
// wgmma split's (mla_decode_wgmma_parts.cuh; mla_decode_wgmma.cu describes the tile, q̄'s hi / lo
// rows and the numerics).
//
// The wgmma split runs each tile as one chain for both warpgroups: S (each its half of the k
// steps), a block barrier to swap the halves, the softmax, ō, its wait, the next tile's barrier.
// Measured alone (docs/cuda.md "Which half sets a tile's time") that chain takes up to 2.9 µs a
// tile where the tensor cores and shared memory need ~0.6-1.1 (computed from their peaks). Here
// the roles are split by warpgroup:
//   2 (the scorer) runs S over all 36 k steps in one m64n32 accumulator, then the online softmax,
//     and hands each head's rescale factor and P's hi / lo A fragments (the registers the
//     accumulators' threads at the same warp and lane need) to the others through shared memory;
//   0 and 1 (the accumulators) own ō's dims 256u .. 256u + 255 as before, and copy the tiles:
//     warpgroup u the panels it reads (4u .. 4u + 3) and chunks 4u .. 4u + 3 of the rope panel
//     (read by S alone), so each refills its own panels of a stage as soon as its ō of that
//     tile is done, with no barrier between the two.
// The scorer's S and softmax of tile t + 1 run under the accumulators' ō of tile t. The hand-offs
// are shared-memory barriers (tma.cuh): full[s] (256 copying threads, each after its own copies
// of the tile landed and were fenced for the async proxy), pfull[p] (the scorer's 128 threads
// wrote P and the factors of tile t, p = t mod 2) and pempty[p] (the 256 accumulator threads read
// them). Four stages of 36 KB: while the scorer works on t + 1 and ō on t, t + 2 and t + 3 are in
// flight.
// Bits: S summed by the tensor cores over all 36 k steps (the wgmma split adds two warpgroups' 18
// in F32), then the same softmax, P and ō steps: its own bits, held by the same tests to the CPU,
// and each sequence alone to its row of the batch; the schedule (which block runs an item) never
// changes a bit, as in the persistent wgmma split.
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/mla_decode_wgmma_parts.cuh"
#include "kimirt/backend/cuda/pdl.cuh"
#include "kimirt/backend/cuda/tma.cuh"
#include "kimirt/backend/cuda/tma.h"
#include "kimirt/backend/cuda/wgmma.cuh"

#include <atomic>
#include <cstdio>
#include <string>

namespace kimirt::cuda {
using namespace mla_wgmma;  // NOLINT: this file's kernel is built from those parts
namespace {

constexpr int kWsThreads = 384, kWsStages = 4;
struct WsLayout {
  // From the (16-byte aligned) start: two P buffers (2 uint4 for each of the scorer's threads),
  // the factors [2][32], the barriers (full[kWsStages], pfull[2], pempty[2]); then q̄ and the ring
  // from the next multiple of 1 KB.
  static constexpr uint32_t kPBytes = 128 * 32;
  static constexpr uint32_t kCorrAt = 2 * kPBytes;
  static constexpr uint32_t kBarAt = kCorrAt + 2 * kHeads * 4;
  static constexpr uint32_t kSmallBytes = kBarAt + (kWsStages + 4) * 8;
  static constexpr size_t kSmemBytes = kSmallBytes + 1023 + kQBytes + kWsStages * kTileBytes;
};
static_assert(WsLayout::kSmemBytes <= 227 * 1024, "one block an SM");

__device__ __forceinline__ void ScorerBarrier() { asm volatile("bar.sync 1, 128;\n" ::: "memory"); }

// The TMA form's copies (kTma): one thread of each accumulating warpgroup (its thread 0) asks for
// the warpgroup's panels of a tile (and warpgroup 0 for the rope panel) in boxes of box_rows rows
// (a paged block's rows: 8, 16, or 32 where blocks hold a multiple of 32), each box's pool row
// looked up a tile ahead; its bytes are announced on full[s] (two arrivals a stage, one a
// warpgroup), so no copy instruction or copy wait in the other 255 threads. Boxes wholly past the
// item's end are not asked for, and rows past it (other positions of the block, or stale shared
// memory) are zeroed by their panels' warpgroup before ō reads them (cp.async zero-fills them);
// the scores mask them as before. The same values reach the same wgmmas: wgmma-ws's bits.
struct WsBoxStream {
  TileStreamPos pos;
  int64_t rows[4];  // the next tile's boxes' pool rows (−1: past its item's end)
  bool ahead;
  __device__ void Look(const PagedDecodeArgs& a, int box_rows) {
    ahead = pos.Next(a);
    if (!ahead) return;
    const int bs = a.block_size;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      rows[j] = -1;
      const int p = pos.s + j * box_rows;
      if (j * box_rows < kTile && p < pos.s1) {
        rows[j] = (int64_t{a.tables[pos.table + p / bs]} * a.layers + a.layer) * bs + p % bs;
      }
    }
  }
};

template <bool kTma>
__global__ void __launch_bounds__(kWsThreads, 1)
    MlaDecodeWsKernel(PagedDecodeArgs a, const float* qc, float* part_o, float* part_ml,
                      const __grid_constant__ CUtensorMap map, int box_rows) {
  using L = WsLayout;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = SharedAddress(smem_raw);
  const uint32_t base = (raw + L::kSmallBytes + 1023u) & ~1023u;  // panels at multiples of 1 KB
  const uint32_t q_addr = base, ring = base + kQBytes;            // stage s at ring + s · kTileBytes
  unsigned char* const base_ptr = smem_raw + (base - raw);
  uint4* const pbuf = reinterpret_cast<uint4*>(smem_raw);  // [2][128 scorer threads][2]
  float* const pcorr = reinterpret_cast<float*>(smem_raw + L::kCorrAt);  // [2][32 heads]
  const uint32_t bars = raw + L::kBarAt;
  const auto full = [bars](int s) { return bars + 8u * s; };
  const auto pfull = [bars](int p) { return bars + 8u * (kWsStages + p); };
  const auto pempty = [bars](int p) { return bars + 8u * (kWsStages + 2 + p); };

  int w0, w1;
  BlockItems(a, &w0, &w1);
  if (w0 >= w1) return;  // the whole block: no work this step
  const int64_t h0 = int64_t{blockIdx.y} * kHeads;
  const int tid = threadIdx.x, wg = tid / 128, wtid = tid % 128, warp = wtid / 32, lane = tid % 32, g = lane / 4,
            c = lane % 4;
  int total = 0;  // the block's tiles: when the cp.async copies may announce a stage (TMA's need not)
  if constexpr (!kTma) {
    for (int w = w0; w < w1; ++w) total += Item::Load(a, w).Tiles();
  }
  if (tid == 0) {
    for (int s = 0; s < kWsStages; ++s) tma::MbarInit(full(s), kTma ? 2 : 256);
    for (int p = 0; p < 2; ++p) tma::MbarInit(pfull(p), 128), tma::MbarInit(pempty(p), 256);
    tma::FenceMbarInit();
  }
  __syncthreads();

  // The accumulators' copies: thread wtid of warpgroup wg < 2 takes row wtid / 4 of every tile:
  // chunks 2q, 2q + 1 (q = wtid mod 4) of panels 4 wg .. 4 wg + 3 and chunk 4 wg + q of the rope
  // panel, each to its swizzled place. The first four tiles go out before the wait for the kernel
  // ahead (the rows were written before it passed its own wait, as in the wgmma split).
  const int row = wtid / 4, q = wtid % 4;
  TileStream copy;
  int64_t row_ahead = -1;
  bool ahead = false;
  auto issue = [&](int stage) {
    const bool valid = row_ahead >= 0;
    const unsigned char* src = static_cast<const unsigned char*>(a.values) + (valid ? row_ahead : 0) * (kW * 2);
    const uint32_t st = ring + stage * kTileBytes;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int p = 4 * wg + i;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        CpAsync16(st + p * kTilePanelBytes + wgmma::SwizzledOffset(row, 2 * q + h), src + p * 128 + (2 * q + h) * 16, valid);
      }
    }
    const int rc = 4 * wg + q;
    CpAsync16(st + 8 * kTilePanelBytes + wgmma::SwizzledOffset(row, rc), src + 8 * 128 + rc * 16, valid);
    ahead = copy.Next(a, &row_ahead);
  };
  // The TMA form: warpgroup wg's thread 0 asks for the tile's boxes of its panels on full[stage].
  WsBoxStream boxes;
  const bool producer = kTma && wg < 2 && wtid == 0;
  // Each latent row is read once a step: asked evict-first (a.l2_row_hint), it leaves L2 to the
  // partial outputs the combine reads back (stored evict-last) and the weights.
  const uint64_t row_policy = producer && a.l2_row_hint ? L2Policy(L2Hint::kEvictFirst) : 0;
  auto load = [&](uint32_t dst, int32_t x, int32_t y, uint32_t bar) {
    if (a.l2_row_hint) {
      tma::Load2DHinted(dst, &map, bar, x, y, row_policy);
    } else {
      tma::Load2D(dst, &map, bar, x, y);
    }
  };
  // Warpgroup wg's boxes of the next tile into stage `stage`, on full[stage]: its four latent
  // panels, warpgroup 0 also the rope panel, into the swizzled panels the wgmmas read.
  auto issue_tma = [&](int stage) {
    const uint32_t st = ring + stage * kTileBytes, bar = full(stage);
    const int p0 = 4 * wg, panels = wg == 0 ? 5 : 4;
    int loaded = 0;
#pragma unroll
    for (int j = 0; j < 4; ++j) loaded += boxes.rows[j] >= 0 ? 1 : 0;
    tma::MbarArriveExpectTx(bar, static_cast<uint32_t>(loaded * box_rows * 128 * panels));
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (boxes.rows[j] < 0) continue;
      const int32_t y = static_cast<int32_t>(boxes.rows[j]);
      const uint32_t dst = st + j * box_rows * 128;
      for (int i = 0; i < 4; ++i) load(dst + (p0 + i) * kTilePanelBytes, 64 * (p0 + i), y, bar);
      if (wg == 0) load(dst + 8 * kTilePanelBytes, 64 * 8, y, bar);
    }
    boxes.Look(a, box_rows);
  };
  if (producer) {
    boxes.pos.Begin(w0, w1);
    boxes.Look(a, box_rows);
    for (int i = 0; i < kWsStages && boxes.ahead; ++i) issue_tma(i);
  }
  if (!kTma && wg < 2) {
    copy.Begin(a, w0, w1, row);
    ahead = copy.Next(a, &row_ahead);
#pragma unroll
    for (int i = 0; i < kWsStages; ++i) {
      if (ahead) issue(i);
      CpAsyncCommit();  // one group a tile, empty past the end: the wait count is the same each tile
    }
  }
  PdlWait();
  PdlTrigger();
  // The first item's q̄ by all 384 threads in one round (a block's first tile waits on it; later
  // sequences' q̄ the scorer loads alone).
  const int first_b = Item::Load(a, w0).b;
  LoadQuery<kWsThreads, 6>(a, qc, first_b, h0, tid, base_ptr);
  __syncthreads();

  if (wg < 2) {
    // The accumulators: ō's dims 256 wg + [0, 256).
    asm volatile("setmaxnreg.inc.sync.aligned.u32 200;\n" ::: "memory");
    if constexpr (!kTma) {
      CpAsyncWait<kWsStages - 2>();  // tiles 0 and 1
      wgmma::FenceProxyAsync();
      tma::MbarArrive(full(0));
      if (total > 1) tma::MbarArrive(full(1));
    }

    int t = 0;  // the block's tile count so far
    for (int work = w0; work < w1; ++work) {
      const Item item = Item::Load(a, work);
      float o0[64], o1[64];
#pragma unroll
      for (int i = 0; i < 64; ++i) o0[i] = o1[i] = 0.0f;
      const int ntiles = item.Tiles();
      for (int it = 0; it < ntiles; ++it, ++t) {
        const int p = t & 1;
        tma::MbarWait(pfull(p), (t >> 1) & 1);
        const uint4 f0 = pbuf[(p * 128 + wtid) * 2], f1 = pbuf[(p * 128 + wtid) * 2 + 1];
        const float corr = pcorr[p * kHeads + 8 * warp + g];
        tma::MbarArrive(pempty(p));
        const unsigned pa[2][4] = {{f0.x, f0.y, f0.z, f0.w}, {f1.x, f1.y, f1.z, f1.w}};
        // ō · corr, skipped by a warp whose heads all kept their max (as in the wgmma split).
        if (__any_sync(0xffffffffu, corr != 1.0f)) {
#pragma unroll
          for (int i = 0; i < 64; ++i) o0[i] *= corr, o1[i] *= corr;
        }
        const uint32_t stage = ring + (t % kWsStages) * kTileBytes;
        if constexpr (kTma) {
          // The stage's copies landed before the scorer's S (it waited): done already, but this
          // warpgroup's reads acquire the boxes' bytes from the barrier itself, as any TMA consumer.
          tma::MbarWait(full(t % kWsStages), (t / kWsStages) & 1);
          // A partial tile (its item's last): rows valid .. 31 of this warpgroup's panels as zeros
          // before ō reads them (S, done before P came, read them masked).
          const int valid = item.s1 - item.s0 - it * kTile;
          if (valid < kTile) {
            unsigned char* panels = base_ptr + (stage - base) + 4 * wg * kTilePanelBytes;
            for (int i = wtid; i < 4 * (kTile - valid) * 8; i += 128) {
              const int p = i / ((kTile - valid) * 8), r = valid + i % ((kTile - valid) * 8) / 8, chunk = i % 8;
              *reinterpret_cast<uint4*>(panels + p * kTilePanelBytes + wgmma::SwizzledOffset(r, chunk)) =
                  make_uint4(0u, 0u, 0u, 0u);
            }
            wgmma::FenceProxyAsync();
            // The warpgroup's zeros, then its wgmmas (named barriers 2 and 3: one a warpgroup).
            if (wg == 0) {
              asm volatile("bar.sync 2, 128;\n" ::: "memory");
            } else {
              asm volatile("bar.sync 3, 128;\n" ::: "memory");
            }
          }
        }
        AccumulateTile(o0, o1, pa, stage, wg);
        // This warpgroup's panels of the stage are free (the scorer's S of tile t ended before its
        // P): tile t + 4 goes there. Then (cp.async) tile t + 2 is announced once this thread's
        // copies of it have landed; TMA's land on the barrier by themselves.
        if constexpr (kTma) {
          if (producer && boxes.ahead) issue_tma(t % kWsStages);
        } else {
          if (ahead) issue(t % kWsStages);
          CpAsyncCommit();
          if (t + 2 < total) {
            CpAsyncWait<kWsStages - 2>();
            wgmma::FenceProxyAsync();
            tma::MbarArrive(full((t + 2) % kWsStages));
          }
        }
      }
      // The split's unnormalized ō (hi row + lo row); KIMIRT_MLA_L2_HINTS: evict-last, for the
      // combine to read from L2.
      const int64_t head = h0 + 8 * warp + g;
      if (head < a.H) {
        float2* po = reinterpret_cast<float2*>(part_o + (work * a.H + head) * kR + 256 * wg + 2 * c);
        const uint64_t policy = a.l2_hints ? L2Policy(L2Hint::kEvictLast) : 0;
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          const float* o = n < 16 ? o0 + 4 * n : o1 + 4 * (n - 16);
          const float2 v = make_float2(o[0] + o[2], o[1] + o[3]);
          float2* dst = po + (n < 16 ? 4 * n : 64 + 4 * (n - 16));
          if (a.l2_hints) {
            StoreHinted(dst, v, policy);
          } else {
            *dst = v;
          }
        }
      }
    }
    if constexpr (!kTma) CpAsyncWait<0>();  // only empty groups remain; nothing in flight when the block ends
    return;
  }

  // The scorer.
  asm volatile("setmaxnreg.dec.sync.aligned.u32 104;\n" ::: "memory");
  const uint64_t desc_q = wgmma::Desc128B(q_addr, 16, 1024);
  int q_of = first_b;  // the sequence whose q̄ the panels hold
  int t = 0;
  for (int work = w0; work < w1; ++work) {
    const Item item = Item::Load(a, work);
    const int64_t b = item.b;
    if (b != q_of) {
      ScorerBarrier();  // every warp's S of the last tile is done reading q̄
      LoadQuery<128, 6>(a, qc, b, h0, wtid, base_ptr);
      ScorerBarrier();  // ... and all of the new q̄ is in place (fenced for the async proxy)
      q_of = b;
    }
    float m = -INFINITY, l = 0.0f;  // head 8·warp + g's running max and this lane's share of the sum
    const int ntiles = item.Tiles();
    for (int it = 0; it < ntiles; ++it, ++t) {
      const int stage_index = t % kWsStages;
      tma::MbarWait(full(stage_index), (t / kWsStages) & 1);
      const uint64_t desc_tile = wgmma::Desc128B(ring + stage_index * kTileBytes, 16, 1024);
      // S over all 36 k steps, ascending, from zero: s[4n + e] row g (e < 2) or g + 8, column
      // 8n + 2c + e % 2.
      float s[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) s[i] = 0.0f;
      wgmma::FenceRegs(s);
      wgmma::Fence();
#pragma unroll
      for (int step = 0; step < 2 * kStepsPerGroup; ++step) {
        const int pn = step / 4, col = (step % 4) * 32;
        const uint64_t dq = desc_q + ((pn * kQPanelBytes + col) >> 4), dt = desc_tile + ((pn * kTilePanelBytes + col) >> 4);
        wgmma::WgmmaSS_m64n32k16<0>(s, dq, dt);
      }
      wgmma::Commit();
      wgmma::Wait<0>();
      wgmma::FenceRegs(s);
      // The online softmax of the wgmma split (its step 2 without the swap).
      const int valid = item.s1 - item.s0 - it * kTile;
      float x[8];
#pragma unroll
      for (int j = 0; j < 4; ++j) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int col = 8 * j + 2 * c + e;
          x[2 * j + e] = col < valid ? a.scale * (s[4 * j + e] + s[4 * j + e + 2]) : -INFINITY;  // hi row + lo row
        }
      }
      const float corr = SoftmaxStep(x, m, l);
      uint4 pa[2];
#pragma unroll
      for (int kk = 0; kk < 2; ++kk) {
        SplitPair(x[4 * kk], x[4 * kk + 1], pa[kk].x, pa[kk].y);
        SplitPair(x[4 * kk + 2], x[4 * kk + 3], pa[kk].z, pa[kk].w);
      }
      const int p = t & 1;
      if (t >= 2) tma::MbarWait(pempty(p), ((t >> 1) - 1) & 1);  // P of tile t − 2 was read
      pbuf[(p * 128 + wtid) * 2] = pa[0];
      pbuf[(p * 128 + wtid) * 2 + 1] = pa[1];
      if (c == 0) pcorr[p * kHeads + 8 * warp + g] = corr;
      tma::MbarArrive(pfull(p));
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    const int64_t head = h0 + 8 * warp + g;
    if (head < a.H && c == 0) {
      part_ml[(work * a.H + head) * 2] = m;
      part_ml[(work * a.H + head) * 2 + 1] = l;
    }
  }
}

// The TMA form's box: a paged block's rows where they are 8 or 16, 32 where blocks hold a
// multiple of 32 (a tile's rows then lie in one block: items start at multiples of 64); 0 where
// neither (wgmma-ws's copies then).
int WsTmaBoxRows(int block_size) {
  if (block_size == 8 || block_size == 16) return block_size;
  return block_size % kTile == 0 ? kTile : 0;
}

// MlaDecodeWsLaunchCounts's.
struct {
  std::atomic<int64_t> cp_async{0}, tma{0};
} g_ws_launches;

template <bool kTma>
void LaunchWs(PagedDecodeArgs a, const float* qc, float* part_o, float* part_ml, const CUtensorMap& map, int box_rows,
              cudaStream_t s) {
  constexpr size_t bytes = WsLayout::kSmemBytes;
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(MlaDecodeWsKernel<kTma>, bytes, true, kTma ? "MLA decode kernel (wgmma-ws-tma)" : "MLA decode kernel (wgmma-ws)",
                   &configured);
  const bool walk = a.block_work != nullptr;
  const int64_t blocks = walk ? a.persist_blocks : a.num_work;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>((a.H + kHeads - 1) / kHeads));
  LaunchPdl("MlaDecodeWs", MlaDecodeWsKernel<kTma>, grid, dim3(kWsThreads), bytes, s, a, qc, part_o, part_ml, map,
            box_rows);
  CheckLaunch("MlaDecodeWs");
  (kTma ? g_ws_launches.tma : g_ws_launches.cp_async).fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

MlaDecodeWsLaunches MlaDecodeWsLaunchCounts() { return {g_ws_launches.cp_async.load(), g_ws_launches.tma.load()}; }

void MlaPagedDecodeSplitWgmmaWs(const PagedDecodeArgs& a, const float* qc, float* part_o, float* part_ml,
                                cudaStream_t s, bool tma) {
  if (a.kind != 1) {
    MlaPagedDecodeSplitWgmma(a, qc, part_o, part_ml, /*persistent=*/true, s);  // FP8 rows: the wgmma split
    return;
  }
  // The pool's tensor map, made again only when the pool or the box changes (a storage's pool is
  // fixed until it grows): one a thread, since a thread launches one storage's layers in turn.
  // A refused map is remembered too, so a pool the driver will not map is not asked again each launch.
  thread_local CUtensorMap map{};
  thread_local const void* map_values = nullptr;
  thread_local int64_t map_rows = 0;
  thread_local int map_box = 0;
  thread_local std::string map_error;
  const int box_rows = tma ? WsTmaBoxRows(a.block_size) : 0;
  if (box_rows > 0 && (map_values != a.values || map_rows != a.pool_rows || map_box != box_rows)) {
    map_error.clear();
    if (!MakeTensorMapBf16Swizzled(&map, a.values, static_cast<uint64_t>(a.pool_rows), kW, kW * 2,
                                   static_cast<uint32_t>(box_rows), &map_error) &&
        map_error.empty()) {
      map_error = "no tensor map for the latent pool";
    }
    map_values = a.values, map_rows = a.pool_rows, map_box = box_rows;
  }
  if (box_rows > 0 && map_error.empty()) {
    LaunchWs<true>(a, qc, part_o, part_ml, map, box_rows, s);
    return;
  }
  // Blocks of other sizes take the cp.async copies as documented (kernels.h); a pool the driver
  // would not map is unexpected, so said once.
  static std::atomic<bool> said{false};
  if (box_rows > 0 && !said.exchange(true)) {
    std::fprintf(stderr, "kimirt: wgmma-ws-tma: %s; taking wgmma-ws\n", map_error.c_str());
  }
  LaunchWs<false>(a, qc, part_o, part_ml, map, 0, s);
}

}  // namespace kimirt::cuda
