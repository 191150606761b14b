// Host emulation of the decode MoE on tensor cores (see ../moe_decode_emulate.sh). Two parts:
//
// mma: ExpertMmaKernel launched directly, for BF16- and MXFP4-held experts, gate/up and down, 1, 2
// and 4 token tiles, on one grouping of 18 tokens × top-2 over 8 experts (groups of 1, 8, 17, 1
// and 9 tokens: single tokens, a full tile, two and three tiles with padding columns; experts
// not numbered as their group), K with and without a partial last round, SplitK's slice and
// forced ones (1, 2 or 3 slices, a slice ending mid-round). Each part output must be bit-identical
// to Reference below (the kernel's documented MMA order), the guard after the part untouched;
// each expert launched alone must write exactly its group rows (the rest stays NaN), and a
// token launched alone must give its bits in the group. MXFP4 and BF16 experts (the BF16 being
// the MXFP4 values) meet the same reference, so they agree bit for bit. SplitRowsKernel's parts
// are checked against an independent PackedPos layout.
//
// decode: MoeDecodeExperts end to end (split z, gate/up, GluSplit, down, combine) for 5, 12, 18
// and 36 tokens (1, 2, 4 tiles; one expert of 34 tokens: two passes of 4 tiles), gate/up or down
// split in two slices or neither, both formats, both GLU kinds: every scratch stage and the output bit-identical to the reference chain, the
// output of each format the same, and tokens alone (T = 1) the same bits as in the batch.
//
// route: the router's top-k kernels against a sort (RunRouteChecks below).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_host.cpp"

namespace {

namespace kc = kimirt::cuda;

uint64_t g_state = 12345;
double Uniform() {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<double>(g_state >> 11) * 0x1.0p-53;
}
int RandInt(int n) { return static_cast<int>(Uniform() * n); }

constexpr uint32_t kPoison = 0x7fc00000u;  // the NaN every buffer starts as

// Part columns (moe_kernels.cu kPartCols): the kernels launched with them and the reference in
// their order. main runs the mma and decode checks without, then with them.
bool g_part_columns = false;

// 256-byte aligned host memory (the device pool's alignment), NaN-filled, with `guard` poisoned
// bytes after the `bytes` in use.
struct Buffer {
  void* p = nullptr;
  size_t bytes, total;
  explicit Buffer(size_t b, size_t guard = 0) : bytes(b) {
    total = (b + guard + 255) / 256 * 256 + 256;
    p = std::aligned_alloc(256, total);
    auto* u = static_cast<uint32_t*>(p);
    for (size_t i = 0; i < total / 4; ++i) u[i] = kPoison;
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() const { return static_cast<float*>(p); }
  uint32_t Bits(size_t i) const { return static_cast<const uint32_t*>(p)[i]; }
};

int g_failures = 0;
int g_checks = 0;
void Fail(const std::string& what) {
  if (++g_failures <= 40) std::printf("FAIL %s\n", what.c_str());
}

// One [N, K] expert weight: random MXFP4 codes (never ±0, both signs) and E8M0 scales (mostly
// 118..127; about one group in 16 at 128..134, so a lane's round often holds one ≥ 128 and the
// kernel takes its general decode), the same values as BF16, and as floats for the reference.
struct Matrix {
  int64_t N = 0, K = 0;
  std::unique_ptr<Buffer> codes, scales, bf16, tiled;  // tiled: bf16 decode-tiled, where N, K allow it
  std::unique_ptr<Buffer> tiled_codes;                  // codes in mxfp4_tiled.cuh's layout, where N, K allow it
  std::vector<float> value;
};
std::unique_ptr<Matrix> MakeMatrix(int64_t N, int64_t K) {
  static const float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  auto m = std::make_unique<Matrix>();
  m->N = N;
  m->K = K;
  m->codes = std::make_unique<Buffer>(static_cast<size_t>(N * K / 2));
  m->scales = std::make_unique<Buffer>(static_cast<size_t>(N * K / 32));
  m->bf16 = std::make_unique<Buffer>(static_cast<size_t>(N * K * 2));
  m->value.resize(static_cast<size_t>(N * K));
  auto* codes = static_cast<uint8_t*>(m->codes->p);
  auto* scales = static_cast<uint8_t*>(m->scales->p);
  auto* bf = static_cast<uint16_t*>(m->bf16->p);
  for (int64_t g = 0; g < N * K / 32; ++g) scales[g] = static_cast<uint8_t>(Uniform() < 0.06 ? 128 + RandInt(7) : 118 + RandInt(10));
  for (int64_t i = 0; i < N * K; ++i) {
    const unsigned code = static_cast<unsigned>(1 + RandInt(7)) | (Uniform() < 0.5 ? 8u : 0u);
    if (i % 2 == 0) codes[i / 2] = static_cast<uint8_t>(code);
    else codes[i / 2] = static_cast<uint8_t>(codes[i / 2] | (code << 4));
    const float v = std::ldexp((code & 8u) ? -kE2M1[code & 7u] : kE2M1[code & 7u], scales[i / 32] - 127);
    uint32_t u;
    std::memcpy(&u, &v, 4);
    if ((u & 0xffffu) != 0) std::abort();  // at most 2 significant bits: exact in BF16
    bf[i] = static_cast<uint16_t>(u >> 16);
    m->value[static_cast<size_t>(i)] = v;
  }
  g_weights.push_back({static_cast<const char*>(m->codes->p), static_cast<size_t>(N * K / 2)});
  g_weights.push_back({static_cast<const char*>(m->bf16->p), static_cast<size_t>(N * K * 2)});
  if (N % 32 == 0 && K % 128 == 0) {  // decode_tiled.cuh's layout (DecodeGemmTileable), 16 bytes at a time
    m->tiled = std::make_unique<Buffer>(static_cast<size_t>(N * K * 2));
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t q = 0; q < K; q += 8) {
        std::memcpy(static_cast<uint16_t*>(m->tiled->p) + kc::DecodeTiledRow(r, K) + kc::DecodeTiledK(q), bf + r * K + q, 16);
      }
    }
    g_weights.push_back({static_cast<const char*>(m->tiled->p), static_cast<size_t>(N * K * 2)});
  }
  if (kc::Mxfp4Tileable(N, K)) {  // word by word: its place and its bits (the layout's own helpers)
    m->tiled_codes = std::make_unique<Buffer>(static_cast<size_t>(N * K / 2));
    for (int64_t r = 0; r < N; ++r) {
      for (int64_t q = 0; q < K; q += 8) {
        uint32_t w;
        std::memcpy(&w, codes + (r * K + q) / 2, 4);
        w = kc::Mxfp4TileWord(w);
        if (kc::Mxfp4UntileWord(w) != *reinterpret_cast<const uint32_t*>(codes + (r * K + q) / 2)) std::abort();
        std::memcpy(static_cast<uint8_t*>(m->tiled_codes->p) + kc::Mxfp4TiledRow(r, K) + kc::Mxfp4TiledK(q), &w, 4);
      }
    }
    g_weights.push_back({static_cast<const char*>(m->tiled_codes->p), static_cast<size_t>(N * K / 2)});
  }
  return m;
}

// E experts' matrices of one shape, with the device-style pointer tables of both formats.
struct ExpertSet {
  std::vector<std::unique_ptr<Matrix>> m;
  std::vector<const void*> bf16, codes, tiled, tiled_codes;
  std::vector<const uint8_t*> scales;
  ExpertSet(int E, int64_t N, int64_t K) {
    for (int e = 0; e < E; ++e) {
      m.push_back(MakeMatrix(N, K));
      bf16.push_back(m.back()->bf16->p);
      codes.push_back(m.back()->codes->p);
      if (m.back()->tiled) tiled.push_back(m.back()->tiled->p);
      if (m.back()->tiled_codes) tiled_codes.push_back(m.back()->tiled_codes->p);
      scales.push_back(static_cast<const uint8_t*>(m.back()->scales->p));
    }
  }
  const void* const* W(int fmt, bool tiled_mxfp4 = false) const {
    return fmt != kc::kMxfp4 ? bf16.data() : tiled_mxfp4 ? tiled_codes.data() : codes.data();
  }
};

// A step's choices grouped as MoeGroupByExpert promises: experts ascending, slots ascending.
struct Groups {
  int64_t T = 0, k = 0, n = 0;
  std::vector<int32_t> idx, order, pos, active, begin, expert_of_row;
  int32_t num = 0;
};
Groups MakeGroups(int64_t T, int64_t k, const std::vector<int32_t>& idx, int E) {
  Groups g;
  g.T = T;
  g.k = k;
  g.n = T * k;
  g.idx = idx;
  g.pos.resize(static_cast<size_t>(g.n));
  for (int e = 0; e < E; ++e) {
    const size_t at = g.order.size();
    for (int64_t s = 0; s < g.n; ++s) {
      if (idx[static_cast<size_t>(s)] != e) continue;
      g.pos[static_cast<size_t>(s)] = static_cast<int32_t>(g.order.size());
      g.order.push_back(static_cast<int32_t>(s));
      g.expert_of_row.push_back(e);
    }
    if (g.order.size() > at) {
      g.active.push_back(e);
      g.begin.push_back(static_cast<int32_t>(at));
    }
  }
  g.begin.push_back(static_cast<int32_t>(g.n));
  g.num = static_cast<int32_t>(g.active.size());
  return g;
}

// x's three BF16 parts (mma::SplitOne) as floats, [part lo/mid/hi][row][k], natural k order.
std::vector<float> SplitParts(const float* x, int64_t rows, int64_t K) {
  std::vector<float> p(static_cast<size_t>(3 * rows * K));
  for (int64_t i = 0; i < rows * K; ++i) {
    uint32_t hi, mid, lo;
    kc::mma::SplitOne(x[i], hi, mid, lo);
    const uint32_t bits[3] = {lo, mid, hi};
    for (int q = 0; q < 3; ++q) p[static_cast<size_t>(q * rows * K + i)] = BfToF(static_cast<uint16_t>(bits[q]));
  }
  return p;
}

// SplitRowsKernel / GluSplitKernel's layout, built here: [hi/mid/lo][row][PackedPos(k)] BF16,
// element j < 4 of each aligned 8 at 2j, element j + 4 at 2j + 1.
std::vector<uint16_t> PackedParts(const float* x, int64_t rows, int64_t K) {
  std::vector<uint16_t> p(static_cast<size_t>(3 * rows * K));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t i = 0; i < K; ++i) {
      uint32_t hi, mid, lo;
      kc::mma::SplitOne(x[r * K + i], hi, mid, lo);
      const int64_t j = i % 8, at = r * K + i - j + (j < 4 ? 2 * j : 2 * (j - 4) + 1);
      p[static_cast<size_t>(at)] = static_cast<uint16_t>(hi);
      p[static_cast<size_t>(rows * K + at)] = static_cast<uint16_t>(mid);
      p[static_cast<size_t>(2 * rows * K + at)] = static_cast<uint16_t>(lo);
    }
  }
  return p;
}

// One part output as the kernel computes it under shim.h's MMA: k from k0 to k1 (a slice) in
// 32-k steps; each step mma::Step's six MMAs (x's lo, mid, then hi part; per part the MMA of
// words .x/.y then .z/.w), each MMA summed as EmuMma sums it (in double from the running F32
// value, its 16 k slots in order, rounded once). Slot s of an MMA (half h = 0, 1) is lane
// t = s % 8 / 2, A word j = 2h + s / 8 of the lane's 8 k 8t .. 8t + 7, whose low / high BF16 is
// element j / j + 4 (s % 2): k = 8t + 2h + s / 8 + 4 (s % 2). The step's sum is added to the
// slice's in F32. No tiling, exchange or indexing of the kernel's: an independent account.
//
// With part columns (g_part_columns) each part has a sum of its own: per step its two
// MMAs from zero, added in F32; the three sums then added as (lo + mid) + hi.
float Reference(const std::vector<float>& parts, int64_t rows, int64_t K, int64_t xrow, const float* w, int64_t k0,
                int64_t k1) {
  const auto mma = [&](double e, const float* xp, int64_t kb, int h) {
    for (int s = 0; s < 16; ++s) {
      const int64_t kk = kb + 8 * (s % 8 / 2) + 2 * h + s / 8 + 4 * (s % 2);
      e += static_cast<double>(w[kk]) * xp[kk];
    }
    return static_cast<float>(e);
  };
  if (g_part_columns) {
    float sum[3] = {0.0f, 0.0f, 0.0f};  // lo, mid, hi
    for (int64_t kb = k0; kb < k1; kb += 32) {
      for (int q = 0; q < 3; ++q) {
        const float* xp = &parts[static_cast<size_t>((q * rows + xrow) * K)];
        sum[q] += mma(mma(0.0, xp, kb, 0), xp, kb, 1);
      }
    }
    return (sum[0] + sum[1]) + sum[2];
  }
  float acc = 0.0f;
  for (int64_t kb = k0; kb < k1; kb += 32) {
    float d = 0.0f;
    for (int q = 0; q < 3; ++q) {
      const float* xp = &parts[static_cast<size_t>((q * rows + xrow) * K)];
      for (int h = 0; h < 2; ++h) d = mma(d, xp, kb, h);
    }
    acc += d;
  }
  return acc;
}

// The part [splits, n, out_w] a whole launch must give (every group row: the groups cover n).
std::vector<float> ReferenceParts(const Groups& g, bool gate_up, const std::vector<float>& parts, int64_t x_rows,
                                  const ExpertSet& wa, const ExpertSet* wb, int64_t N, int64_t K, int64_t slice) {
  const int64_t splits = (K + slice - 1) / slice, out_w = gate_up ? 2 * N : N;
  std::vector<float> want(static_cast<size_t>(splits * g.n * out_w));
  for (int64_t s = 0; s < splits; ++s) {
    for (int64_t gr = 0; gr < g.n; ++gr) {
      const int e = g.expert_of_row[static_cast<size_t>(gr)];
      const int64_t xrow = gate_up ? g.order[static_cast<size_t>(gr)] / g.k : gr;
      for (int64_t c = 0; c < out_w; ++c) {
        const Matrix& m = c < N ? *wa.m[static_cast<size_t>(e)] : *wb->m[static_cast<size_t>(e)];
        want[static_cast<size_t>((s * g.n + gr) * out_w + c)] =
            Reference(parts, x_rows, K, xrow, &m.value[static_cast<size_t>(c % N * K)], s * slice,
                      std::min(K, (s + 1) * slice));
      }
    }
  }
  return want;
}

template <int kFmt, bool kGateUp, int kTT>
void LaunchMma(const kc::MmaArgs& a, dim3 grid) {
  if (g_part_columns) {
    kc::LaunchPdl("ExpertMma", kc::ExpertMmaKernel<kFmt, kGateUp, kTT, true>, grid, dim3(kc::kMmaWarps * 32), 0,
                  nullptr, a);
  } else {
    kc::LaunchPdl("ExpertMma", kc::ExpertMmaKernel<kFmt, kGateUp, kTT>, grid, dim3(kc::kMmaWarps * 32), 0, nullptr, a);
  }
}
template <int kFmt, bool kGateUp>
void LaunchMmaTiles(int tt, const kc::MmaArgs& a, dim3 grid) {
  if (tt == 1) LaunchMma<kFmt, kGateUp, 1>(a, grid);
  else if (tt == 2) LaunchMma<kFmt, kGateUp, 2>(a, grid);
  else LaunchMma<kFmt, kGateUp, 4>(a, grid);
}
void LaunchAny(int fmt, bool gate_up, int tt, const kc::MmaArgs& a, dim3 grid) {
  if (fmt == kc::kMxfp4) {
    if (gate_up) LaunchMmaTiles<kc::kMxfp4, true>(tt, a, grid);
    else LaunchMmaTiles<kc::kMxfp4, false>(tt, a, grid);
  } else {
    if (gate_up) LaunchMmaTiles<kc::kBf16, true>(tt, a, grid);
    else LaunchMmaTiles<kc::kBf16, false>(tt, a, grid);
  }
}

// Runs SplitRowsKernel on x [rows, K] into a fresh buffer and checks its bits.
std::unique_ptr<Buffer> SplitOnDevice(const float* x, int64_t rows, int64_t K, const std::string& where) {
  auto parts = std::make_unique<Buffer>(static_cast<size_t>(3 * rows * K) * 2);
  kc::LaunchPdl("split", kc::SplitRowsKernel, dim3(kc::GridFor(rows * K)), dim3(256), 0, nullptr, x, rows, K,
                static_cast<uint16_t*>(parts->p));
  const std::vector<uint16_t> want = PackedParts(x, rows, K);
  ++g_checks;
  if (std::memcmp(want.data(), parts->p, want.size() * 2) != 0) Fail(where + ": SplitRowsKernel's parts differ");
  return parts;
}

// One ExpertMmaKernel configuration: a whole launch, each expert alone, a few tokens alone.
struct MmaProblem {
  const Groups* g;
  bool gate_up;
  int64_t N, K, x_rows;
  const Buffer* x_parts;
  const ExpertSet* wa;
  const ExpertSet* wb;
};
void CheckMma(const MmaProblem& p, int fmt, int tt, int64_t slice, bool scales_vec, const std::vector<float>& want,
              bool alone, bool tiled = false) {
  const Groups& g = *p.g;
  const int64_t splits = (p.K + slice - 1) / slice, out_w = p.gate_up ? 2 * p.N : p.N;
  const size_t part_elems = static_cast<size_t>(splits * g.n * out_w);
  const std::string where = std::string(p.gate_up ? "gate/up" : "down") + (fmt == kc::kMxfp4 ? " mxfp4" : " bf16") +
                            (scales_vec ? " (vector scales)" : "") + (tiled ? " tiled" : "") +
                            " tiles=" + std::to_string(tt) +
                            " N=" + std::to_string(p.N) + " K=" + std::to_string(p.K) +
                            " slice=" + std::to_string(slice);
  const int64_t rows_per_block = p.gate_up ? kc::kRowsPerBlock<true> : kc::kRowsPerBlock<false>;
  const dim3 grid_xy(static_cast<unsigned>((p.N + rows_per_block - 1) / rows_per_block), static_cast<unsigned>(splits));
  // rows [r0, r1) of group rows must hold the reference, every other entry stay poisoned.
  const auto run = [&](const int32_t* active, const int32_t* begin, int32_t num, unsigned grid_z, int64_t r0,
                       int64_t r1, const std::string& what) -> std::unique_ptr<Buffer> {
    auto part = std::make_unique<Buffer>(part_elems * 4, 4096);
    kc::MmaArgs a;
    a.x_parts = static_cast<const uint16_t*>(p.x_parts->p);
    a.x_rows = p.x_rows;
    a.ga = kc::GroupArgs{g.order.data(), active, begin, &num, g.k};
    a.N = p.N;
    a.K = p.K;
    a.wa = p.wa->W(fmt, tiled);
    a.wb = p.gate_up ? p.wb->W(fmt, tiled) : p.wa->W(fmt, tiled);
    a.tiled = tiled;
    a.sa = fmt == kc::kMxfp4 ? p.wa->scales.data() : nullptr;
    a.sb = fmt == kc::kMxfp4 ? (p.gate_up ? p.wb->scales.data() : p.wa->scales.data()) : nullptr;
    a.scales_vec = scales_vec;
    a.slice = slice;
    a.n = g.n;
    a.part = part->f();
    LaunchAny(fmt, p.gate_up, tt, a, dim3(grid_xy.x, grid_xy.y, grid_z));
    ++g_checks;
    int64_t wrong = 0, stray = 0, first = -1;
    for (size_t i = 0; i < part_elems; ++i) {
      const int64_t gr = static_cast<int64_t>(i) / out_w % g.n;
      const bool mine = gr >= r0 && gr < r1;
      uint32_t want_bits;
      std::memcpy(&want_bits, &want[i], 4);
      if (mine ? part->Bits(i) != want_bits || std::isnan(part->f()[i]) : part->Bits(i) != kPoison) {
        (mine ? wrong : stray) += 1;
        if (first < 0) first = static_cast<int64_t>(i);
      }
    }
    for (size_t i = part_elems; i < part->total / 4; ++i) stray += part->Bits(i) != kPoison;
    if (wrong + stray > 0) {
      char msg[512];
      std::snprintf(msg, sizeof msg, "%s, %s: %lld entries differ from the reference, %lld written outside; first at "
                    "split %lld row %lld column %lld: %.9g, want %.9g", where.c_str(), what.c_str(),
                    static_cast<long long>(wrong), static_cast<long long>(stray),
                    static_cast<long long>(first / out_w / g.n), static_cast<long long>(first / out_w % g.n),
                    static_cast<long long>(first % out_w), first >= 0 && first < static_cast<int64_t>(part_elems) ?
                    part->f()[first] : 0.0f, first >= 0 ? want[static_cast<size_t>(first)] : 0.0f);
      Fail(msg);
    }
    return part;
  };
  // The whole step, with one more grid z than chosen experts (those blocks must do nothing).
  run(g.active.data(), g.begin.data(), g.num, static_cast<unsigned>(g.num + 1), 0, g.n, "all experts");
  if (!alone) return;
  // Each expert alone: its padding columns and rows must not reach the other groups' rows.
  for (int32_t a = 0; a < g.num; ++a) {
    run(&g.active[static_cast<size_t>(a)], &g.begin[static_cast<size_t>(a)], 1, 1, g.begin[static_cast<size_t>(a)],
        g.begin[static_cast<size_t>(a) + 1], "expert " + std::to_string(g.active[static_cast<size_t>(a)]) + " alone");
  }
  // Tokens alone in their expert (the same bits as among its group: batch invariance): rows 0,
  // 9 and the last of the largest group (tile 1 column 0, tile 2 column 1, tile 3 column 0) and
  // the last of the second largest.
  std::vector<std::pair<int32_t, int32_t>> sizes;  // (rows, group)
  for (int32_t a = 0; a < g.num; ++a) sizes.push_back({g.begin[static_cast<size_t>(a) + 1] - g.begin[static_cast<size_t>(a)], a});
  std::sort(sizes.rbegin(), sizes.rend());
  const int32_t big = sizes[0].second, second = sizes[1].second;
  for (const auto& [a, row] : std::vector<std::pair<int32_t, int32_t>>{
           {big, g.begin[static_cast<size_t>(big)]}, {big, g.begin[static_cast<size_t>(big)] + 9},
           {big, g.begin[static_cast<size_t>(big) + 1] - 1}, {second, g.begin[static_cast<size_t>(second) + 1] - 1}}) {
    const int32_t begin[2] = {row, row + 1};
    run(&g.active[static_cast<size_t>(a)], begin, 1, 1, row, row + 1, "group row " + std::to_string(row) + " alone");
  }
}

// The mma part: gate/up over N = 96 rows (blocks of 64: the second block's last two warps
// return at once), down over N = 160 (blocks of 128: three of the second block's warps return).
// MXFP4 codes tiled (mxfp4_tiled.cuh), with and without vector scales, where K allows, also
// over a whole K of 512 in one slice.
void RunMmaChecks() {
  constexpr int kE = 8;
  const int64_t T = 18, k = 2;
  // Groups of 1, 8, 17, 1 and 9 tokens for experts 1, 3, 4, 6, 7, tokens in a shuffled order.
  std::vector<int> perm(T);
  for (int i = 0; i < T; ++i) perm[static_cast<size_t>(i)] = i;
  for (int i = T - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(RandInt(i + 1))]);
  std::vector<int32_t> idx(static_cast<size_t>(T * k));
  for (int i = 0; i < T; ++i) {
    const int t = perm[static_cast<size_t>(i)];
    idx[static_cast<size_t>(t * k)] = i < 17 ? 4 : 1;
    idx[static_cast<size_t>(t * k + 1)] = i < 9 ? 7 : i < 17 ? 3 : 6;
  }
  const Groups g = MakeGroups(T, k, idx, kE);
  for (const bool gate_up : {true, false}) {
    const int64_t N = gate_up ? 96 : 160;
    for (const int64_t K : gate_up ? std::vector<int64_t>{288, 352, 512} : std::vector<int64_t>{96, 288, 512}) {
      const int64_t x_rows = gate_up ? T : g.n;
      Buffer x(static_cast<size_t>(x_rows * K) * 4);
      for (int64_t i = 0; i < x_rows * K; ++i) x.f()[i] = static_cast<float>((Uniform() * 2 - 1) * 4);
      const std::string shape = "N=" + std::to_string(N) + " K=" + std::to_string(K);
      const auto x_parts = SplitOnDevice(x.f(), x_rows, K, shape);
      const std::vector<float> parts = SplitParts(x.f(), x_rows, K);
      const ExpertSet wa(kE, N, K);
      std::unique_ptr<ExpertSet> wb;
      if (gate_up) wb = std::make_unique<ExpertSet>(kE, N, K);
      const MmaProblem p{&g, gate_up, N, K, x_rows, x_parts.get(), &wa, wb.get()};
      const int64_t split_k = kc::SplitK(gate_up ? kc::kRowsPerBlock<true> : kc::kRowsPerBlock<false>, N, K, k).slice;
      std::set<int64_t> slices{split_k, 128, K > 256 ? int64_t{256} : int64_t{128}};
      if (K == 512) slices.insert(K);
      for (const int64_t slice : slices) {
        const std::vector<float> want = ReferenceParts(g, gate_up, parts, x_rows, wa, wb.get(), N, K, slice);
        // Experts and tokens alone at the finest slices only (the most output slices to stray
        // into; where the rows go does not depend on the slice): the run time of CI.
        const bool alone = slice == 128;
        for (const int tt : {1, 2, 4}) {
          CheckMma(p, kc::kBf16, tt, slice, false, want, alone);
          CheckMma(p, kc::kMxfp4, tt, slice, false, want, alone);
          if (K % 128 == 0) {
            CheckMma(p, kc::kMxfp4, tt, slice, true, want, alone);
            CheckMma(p, kc::kMxfp4, tt, slice, true, want, alone, true);
            CheckMma(p, kc::kMxfp4, tt, slice, false, want, alone, true);
          }
        }
      }
    }
  }
}

// WaveSliceRounds on hand-worked cases (docs/cuda.md "Waves", 528 slots): the 48B's expert
// gate/up at batch 1 (144 blocks a slice, 18 rounds, the older rule's 4 slices) takes 3 slices
// of 6 rounds (432 blocks, one wave) over 4 of 5 rounds (576 blocks, two waves); its down (162,
// 8 rounds, up to 4) 3 slices of 3; K3's down (448, 24, up to 2) one slice (one wave) over two
// of 12 (896 blocks, two waves); 200 blocks of 10 rounds (up to 3) 2 slices of 5 (one wave of
// 400) over 3 of 4 (600 blocks, two waves); a single slice allowed stays whole.
void CheckWaveSliceRounds() {
  struct Case {
    int64_t blocks, rounds, max_splits, want;
  };
  for (const Case& c : {Case{144, 18, 4, 6}, Case{162, 8, 4, 3}, Case{448, 24, 2, 24}, Case{200, 10, 3, 5},
                        Case{768, 28, 1, 28}}) {
    ++g_checks;
    const int64_t got = kc::WaveSliceRounds(c.blocks, c.rounds, c.max_splits, 528);
    if (got != c.want) {
      Fail("WaveSliceRounds(" + std::to_string(c.blocks) + ", " + std::to_string(c.rounds) + ", " +
           std::to_string(c.max_splits) + ") = " + std::to_string(got) + " rounds, want " + std::to_string(c.want));
    }
  }
}

// SplitK's contract: whole rounds, K covered, no empty slice, from the widths and top-k only.
void CheckSplitK() {
  for (const int64_t rows : {kc::kRowsPerBlock<true>, kc::kRowsPerBlock<false>}) {
    for (const int64_t N : {32, 96, 512, 2048, 7168}) {
      for (const int64_t K : {32, 96, 288, 512, 2048, 7168}) {
        for (const int64_t k : {1, 2, 8}) {
          const kc::KSplit s = kc::SplitK(rows, N, K, k);
          ++g_checks;
          if (s.slice % 128 != 0 || s.splits < 1 || s.splits * s.slice < K || (s.splits - 1) * s.slice >= K) {
            Fail("SplitK(" + std::to_string(rows) + ", " + std::to_string(N) + ", " + std::to_string(K) + ", " +
                 std::to_string(k) + ") = " + std::to_string(s.splits) + " x " + std::to_string(s.slice));
          }
        }
      }
    }
  }
}

// --- decode: MoeDecodeExperts end to end ---------------------------------------------------

int g_tiled_checks = 0;        // decode checks of tiled experts (RunDecodeChecks wants some)
int g_tiled_mxfp4_checks = 0;  // and of tiled MXFP4 codes

struct Glu {
  int kind;
  float beta;
  bool has_linear_beta;
  float linear_beta;
};
float Sig(float a) { return 1.0f / (1.0f + std::exp(-a)); }
float GluRef(float a, float u, const Glu& glu) {  // SiLU(a)·u (kind 0) or SiTU (spec §15.6)
  if (glu.kind == 0) return a * Sig(a) * u;
  const float s = glu.beta * std::tanh(a / glu.beta) * Sig(a);
  return s * (glu.has_linear_beta ? glu.linear_beta * std::tanh(u / glu.linear_beta) : u);
}

bool SameBits(const float* got, const float* want, size_t n) { return std::memcmp(got, want, n * 4) == 0; }

// Runs MoeDecodeExperts; returns out [T, De] and (in scratch) its intermediate stages.
std::unique_ptr<Buffer> Decode(const float* z, const Groups& g, int64_t De, int64_t I, const ExpertSet& w1,
                               const ExpertSet& w3, const ExpertSet& w2, int fmt, bool scales_vec, const Glu& glu,
                               const float* weights, Buffer& scratch, bool tiled = false) {
  auto out = std::make_unique<Buffer>(static_cast<size_t>(g.T * De) * 4, 1024);
  std::vector<int32_t> order = g.order, pos = g.pos, active = g.active, begin = g.begin;
  int32_t num = g.num;
  const kc::ExpertGroups eg{order.data(), pos.data(), active.data(), begin.data(), &num};
  const auto W = [&](const ExpertSet& w) {
    return !tiled ? w.W(fmt) : fmt == kc::kMxfp4 ? w.tiled_codes.data() : w.tiled.data();
  };
  const kc::ExpertPointerTable table{W(w1), W(w3), W(w2), w1.scales.data(), w3.scales.data(), w2.scales.data(), tiled};
  kc::MoeDecodeExperts(z, g.T, g.k, eg, std::min<int64_t>(static_cast<int64_t>(w1.m.size()), g.n), De, I, table, fmt,
                       scales_vec, glu.kind, glu.beta, glu.has_linear_beta, glu.linear_beta, weights, scratch.p,
                       out->f(), nullptr, false, 0, g_part_columns);
  return out;
}

void CheckDecode(const std::string& name, int64_t T, int64_t k, const std::vector<int32_t>& idx, int E, int64_t De,
                 int64_t I, const Glu& glu) {
  const Groups g = MakeGroups(T, k, idx, E);
  const ExpertSet w1(E, I, De), w3(E, I, De), w2(E, De, I);
  Buffer z(static_cast<size_t>(T * De) * 4), weights(static_cast<size_t>(T * k) * 4);
  for (int64_t i = 0; i < T * De; ++i) z.f()[i] = static_cast<float>((Uniform() * 2 - 1) * 4);
  for (int64_t i = 0; i < T * k; ++i) weights.f()[i] = static_cast<float>(0.05 + Uniform());
  // The reference chain: gate/up parts, their slices summed in order, GLU, down parts, combine.
  const kc::DecodePlan plan = kc::MakeDecodePlan(T, k, De, I);
  const std::vector<float> z_parts = SplitParts(z.f(), T, De);
  const std::vector<float> gu = ReferenceParts(g, true, z_parts, T, w1, &w3, I, De, plan.gate_up.slice);
  std::vector<float> h(static_cast<size_t>(g.n * I));
  for (int64_t gr = 0; gr < g.n; ++gr) {
    for (int64_t i = 0; i < I; ++i) {
      float gate = gu[static_cast<size_t>(gr * 2 * I + i)], up = gu[static_cast<size_t>(gr * 2 * I + I + i)];
      for (int64_t s = 1; s < plan.gate_up.splits; ++s) {
        gate += gu[static_cast<size_t>((s * g.n + gr) * 2 * I + i)];
        up += gu[static_cast<size_t>((s * g.n + gr) * 2 * I + I + i)];
      }
      h[static_cast<size_t>(gr * I + i)] = GluRef(gate, up, glu);
    }
  }
  const std::vector<uint16_t> h_packed = PackedParts(h.data(), g.n, I);
  const std::vector<float> dn = ReferenceParts(g, false, SplitParts(h.data(), g.n, I), g.n, w2, nullptr, De, I,
                                               plan.down.slice);
  std::vector<float> want(static_cast<size_t>(T * De));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t d = 0; d < De; ++d) {
      float acc = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t gr = g.pos[static_cast<size_t>(t * k + j)];
        float v = dn[static_cast<size_t>(gr * De + d)];
        for (int64_t s = 1; s < plan.down.splits; ++s) v += dn[static_cast<size_t>((s * g.n + gr) * De + d)];
        const float prod = weights.f()[t * k + j] * v;
        acc = acc + prod;
      }
      want[static_cast<size_t>(t * De + d)] = acc;
    }
  }
  std::vector<std::unique_ptr<Buffer>> outs;
  for (const int fmt : {kc::kBf16, kc::kMxfp4}) {
    for (const bool vec : {false, true}) {
      if (vec && (fmt != kc::kMxfp4 || De % 128 != 0 || I % 128 != 0)) continue;
      const std::string where = "decode " + name + (fmt == kc::kMxfp4 ? " mxfp4" : " bf16") +
                                (vec ? " (vector scales)" : "") + " splits " + std::to_string(plan.gate_up.splits) +
                                "/" + std::to_string(plan.down.splits);
      Buffer scratch(kc::MoeDecodeScratchBytes(T, k, De, I));
      outs.push_back(Decode(z.f(), g, De, I, w1, w3, w2, fmt, vec, glu, weights.f(), scratch));
      const Buffer& out = *outs.back();
      const char* base = static_cast<const char*>(scratch.p);
      g_checks += 4;
      if (std::memcmp(base + plan.z_bytes, gu.data(), gu.size() * 4) != 0) Fail(where + ": gate/up parts differ");
      if (std::memcmp(base + plan.z_bytes + plan.gu_bytes, h_packed.data(), h_packed.size() * 2) != 0) {
        Fail(where + ": GluSplit's h parts differ");
      }
      if (std::memcmp(base + plan.z_bytes + plan.gu_bytes + plan.h_bytes, dn.data(), dn.size() * 4) != 0) {
        Fail(where + ": down parts differ");
      }
      if (!SameBits(out.f(), want.data(), want.size())) {
        size_t bad = 0;
        while (out.Bits(bad) == *reinterpret_cast<const uint32_t*>(&want[bad])) ++bad;
        Fail(where + ": output differs from the reference chain, first at token " + std::to_string(bad / De) +
             " column " + std::to_string(bad % De));
      }
      bool guard = true;
      for (size_t i = want.size(); i < out.total / 4; ++i) guard &= out.Bits(i) == kPoison;
      if (!guard) Fail(where + ": written past the output");
      // Tokens alone: the first and the last (T = 1: one tile, the same slices).
      for (const int64_t t : {int64_t{0}, T - 1}) {
        const std::vector<int32_t> one(idx.begin() + t * k, idx.begin() + (t + 1) * k);
        const Groups g1 = MakeGroups(1, k, one, E);
        Buffer scratch1(kc::MoeDecodeScratchBytes(1, k, De, I));
        const auto alone = Decode(z.f() + t * De, g1, De, I, w1, w3, w2, fmt, vec, glu, weights.f() + t * k, scratch1);
        ++g_checks;
        if (!SameBits(alone->f(), out.f() + t * De, static_cast<size_t>(De))) {
          Fail(where + ": token " + std::to_string(t) + " alone differs from its batch row");
        }
      }
    }
  }
  for (size_t i = 1; i < outs.size(); ++i) {
    ++g_checks;
    if (!SameBits(outs[i]->f(), outs[0]->f(), want.size())) Fail("decode " + name + ": formats disagree");
  }
  // BF16 experts decode-tiled (CudaBackend::HoldExpertWeights), where the widths allow: the
  // row-major experts' bits (outs[0]).
  if (!w1.tiled.empty() && !w2.tiled.empty()) {
    Buffer scratch(kc::MoeDecodeScratchBytes(T, k, De, I));
    const auto out = Decode(z.f(), g, De, I, w1, w3, w2, kc::kBf16, false, glu, weights.f(), scratch, true);
    ++g_checks;
    ++g_tiled_checks;
    if (!SameBits(out->f(), outs[0]->f(), want.size())) Fail("decode " + name + ": tiled experts' bits differ");
  }
  // MXFP4 codes tiled (CudaBackend::TileMxfp4Experts, the default), both scale loads: the
  // row-major experts' bits; and one token alone.
  if (!w1.tiled_codes.empty() && !w2.tiled_codes.empty()) {
    for (const bool vec : {false, true}) {
      Buffer scratch(kc::MoeDecodeScratchBytes(T, k, De, I));
      const auto out = Decode(z.f(), g, De, I, w1, w3, w2, kc::kMxfp4, vec, glu, weights.f(), scratch, true);
      ++g_checks;
      ++g_tiled_mxfp4_checks;
      if (!SameBits(out->f(), outs[0]->f(), want.size())) {
        Fail("decode " + name + ": tiled MXFP4 codes' bits differ" + (vec ? " (vector scales)" : ""));
      }
    }
    const std::vector<int32_t> one(idx.begin(), idx.begin() + k);
    const Groups g1 = MakeGroups(1, k, one, E);
    Buffer scratch1(kc::MoeDecodeScratchBytes(1, k, De, I));
    const auto alone = Decode(z.f(), g1, De, I, w1, w3, w2, kc::kMxfp4, true, glu, weights.f(), scratch1, true);
    ++g_checks;
    if (!SameBits(alone->f(), outs[0]->f(), static_cast<size_t>(De))) Fail("decode " + name + ": tiled MXFP4, token 0 alone differs");
  }
}

void RunDecodeChecks() {
  constexpr int kE = 8;
  const auto random_idx = [](int64_t T, int64_t k) {  // k distinct experts a token
    std::vector<int32_t> idx;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<int32_t> e(kE);
      for (int i = 0; i < kE; ++i) e[static_cast<size_t>(i)] = i;
      for (int64_t j = 0; j < k; ++j) {
        std::swap(e[static_cast<size_t>(j)], e[static_cast<size_t>(j + RandInt(static_cast<int>(kE - j)))]);
        idx.push_back(e[static_cast<size_t>(j)]);
      }
    }
    return idx;
  };
  const Glu silu{0, 0.0f, false, 0.0f}, situ{1, 6.0f, true, 9.0f};
  // Down in 2 slices (the combine sums them), gate/up in 2 (GluSplit sums them), neither.
  CheckDecode("T=5 k=3", 5, 3, random_idx(5, 3), kE, 256, 512, situ);
  CheckDecode("T=12 k=2", 12, 2, random_idx(12, 2), kE, 512, 96, silu);
  CheckDecode("T=18 k=2", 18, 2, random_idx(18, 2), kE, 288, 96, situ);
  std::vector<int32_t> many(36, 5);  // one expert of 34 tokens: two passes of 4 tiles
  many[3] = 2;
  many[20] = 0;
  CheckDecode("T=36 k=1", 36, 1, many, kE, 288, 96, silu);
  CheckDecode("T=9 k=2 tileable", 9, 2, random_idx(9, 2), kE, 1024, 384, silu);  // tiled too, k split
  if (g_tiled_checks < 2) Fail("decode: " + std::to_string(g_tiled_checks) + " checks of tiled experts, want 2");
  if (g_tiled_mxfp4_checks < 4) {
    Fail("decode: " + std::to_string(g_tiled_mxfp4_checks) + " checks of tiled MXFP4 codes, want 4");
  }
}


// route: MoeRoute's warp kernel (top-k by rank: E ≤ 1024) and MoeRouteSerial (one thread a token, k passes) on
// the same logits, against a third computation here (std::stable_sort by value desc,
// id asc, then the same weight arithmetic): indices and weights bit for bit, for Kimi-Linear's
// and K3's expert counts, E under 32 and k over 32, logits on a coarse grid (many exact ties: the
// lower id first) and from a normal spread, both combine rules, with and without renormalizing,
// and with the shared expert appended (RouteParams::append_expert: rows of k + 1, the last (E, 1)).
float RefSigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
void CheckRoute(const char* name, int64_t T, int64_t E, int k, bool ties) {
  std::vector<float> logits(static_cast<size_t>(T * E)), bias(static_cast<size_t>(E));
  for (float& v : logits) v = ties ? static_cast<float>(RandInt(33)) / 8.0f - 2.0f : static_cast<float>(4.0 * Uniform() - 2.0);
  for (float& v : bias) v = ties ? static_cast<float>(RandInt(3)) / 16.0f : static_cast<float>(0.1 * Uniform());
  for (bool combine_biased : {false, true}) {
    for (bool renormalize : {true, false}) {
      for (int32_t append : {-1, static_cast<int32_t>(E)}) {
        const int ks = append >= 0 ? k + 1 : k;
        std::vector<int32_t> idx_w(static_cast<size_t>(T * ks), -7), idx_s(static_cast<size_t>(T * ks), -7);
        std::vector<float> w_w(static_cast<size_t>(T * ks), NAN), w_s(static_cast<size_t>(T * ks), NAN);
        kc::MoeRoute(logits.data(), bias.data(), T, E, k, renormalize, 2.5f, combine_biased, append, idx_w.data(),
                     w_w.data(), nullptr);
        kc::MoeRouteSerial(logits.data(), bias.data(), T, E, k, renormalize, 2.5f, combine_biased, append,
                           idx_s.data(), w_s.data(), nullptr);
        int bad = 0;
        for (int64_t t = 0; t < T; ++t) {
          const float* row = logits.data() + t * E;
          std::vector<int32_t> order(static_cast<size_t>(E));
          std::vector<float> c(static_cast<size_t>(E));
          for (int64_t e = 0; e < E; ++e) {
            order[static_cast<size_t>(e)] = static_cast<int32_t>(e);
            c[static_cast<size_t>(e)] = RefSigmoid(row[e]) + bias[static_cast<size_t>(e)];
          }
          std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
            return c[static_cast<size_t>(a)] > c[static_cast<size_t>(b)];
          });
          std::vector<float> w(static_cast<size_t>(k));
          float sum = 0.0f;
          for (int j = 0; j < k; ++j) {
            const int32_t e = order[static_cast<size_t>(j)];
            w[static_cast<size_t>(j)] = combine_biased ? c[static_cast<size_t>(e)] : RefSigmoid(row[e]);
            sum += w[static_cast<size_t>(j)];
          }
          for (int j = 0; j < ks; ++j) {
            const int32_t want_e = j < k ? order[static_cast<size_t>(j)] : append;
            float want_w = 1.0f;
            if (j < k) {
              want_w = w[static_cast<size_t>(j)];
              if (renormalize && k > 1) want_w /= (sum + 1e-20f);
              want_w *= 2.5f;
            }
            const size_t at = static_cast<size_t>(t * ks + j);
            for (const auto& [got_e, got_w, which] :
                 {std::tuple{idx_w[at], w_w[at], "warp kernel"}, std::tuple{idx_s[at], w_s[at], "serial kernel"}}) {
              if (got_e != want_e || std::bit_cast<uint32_t>(got_w) != std::bit_cast<uint32_t>(want_w)) {
                if (bad++ < 3) {
                  Fail(std::string(name) + " " + which + (combine_biased ? " biased" : " plain") +
                       (renormalize ? " renorm" : "") + (append >= 0 ? " append" : "") + ": token " +
                       std::to_string(t) + " slot " + std::to_string(j) + ": " + std::to_string(got_e) + " (" +
                       std::to_string(got_w) + "), want " + std::to_string(want_e) + " (" + std::to_string(want_w) + ")");
                }
              }
            }
          }
        }
        ++g_checks;
      }
    }
  }
}

// MoeGroupByExpert's one-warp path (n ≤ 32 slots: GroupByExpertWarpKernel, lanes as threads)
// against MakeGroups' host counting sort: order, pos, active, begin and the count, for n = 1 .. 32
// slots over few experts (many repeats) and many (mostly distinct), the last expert included.
void CheckGroupWarp() {
  for (const int E : {3, 257}) {
    for (int64_t n = 1; n <= 32; ++n) {
      std::vector<int32_t> idx(static_cast<size_t>(n));
      for (int32_t& e : idx) e = RandInt(E);
      if (n > 2) idx[1] = E - 1;
      const Groups want = MakeGroups(n, 1, idx, E);
      std::vector<int32_t> order(static_cast<size_t>(n), -7), pos(static_cast<size_t>(n), -7);
      std::vector<int32_t> active(static_cast<size_t>(n), -7), begin(static_cast<size_t>(n + 1), -7);
      int32_t num = -7;
      const kc::ExpertGroups eg{order.data(), pos.data(), active.data(), begin.data(), &num};
      kc::MoeGroupByExpert(idx.data(), n, E, eg, nullptr);
      active.resize(static_cast<size_t>(std::max(num, 0)));
      begin.resize(static_cast<size_t>(std::max(num, 0) + 1));
      if (order != want.order || pos != want.pos || active != want.active || begin != want.begin || num != want.num) {
        Fail("one-warp grouping, E=" + std::to_string(E) + " n=" + std::to_string(n) + ": differs from the host sort");
      }
      ++g_checks;
    }
  }
}

void RunRouteChecks() {
  CheckGroupWarp();
  // T = 6: the warp kernel's blocks of 4 tokens, one of them partial (whole warps return).
  for (bool ties : {true, false}) {
    CheckRoute(ties ? "E=256 k=8 ties" : "E=256 k=8", 6, 256, 8, ties);
    CheckRoute(ties ? "E=896 k=16 ties" : "E=896 k=16", 6, 896, 16, ties);
    CheckRoute(ties ? "E=1024 k=32 ties" : "E=1024 k=32", 6, 1024, 32, ties);
    CheckRoute(ties ? "E=70 k=64 ties" : "E=70 k=64", 6, 70, 64, ties);
    CheckRoute(ties ? "E=20 k=5 ties" : "E=20 k=5", 6, 20, 5, ties);
  }
}
}  // namespace

int main(int argc, char** argv) {  // argv[1]: "mma", "decode" or "route" runs that part only
  const std::string only = argc > 1 ? argv[1] : "";
  if (argc > 2 || (!only.empty() && only != "mma" && only != "decode" && only != "route")) {
    std::fprintf(stderr, "usage: moe_decode_emulation [mma|decode|route] (got %s)\n", argv[argc - 1]);
    return 2;
  }
  CheckSplitK();
  CheckWaveSliceRounds();
  for (const bool part_columns : {false, true}) {
    g_part_columns = part_columns;
    if (only.empty() || only == "mma") RunMmaChecks();
    if (only.empty() || only == "decode") RunDecodeChecks();
  }
  if (only.empty() || only == "route") RunRouteChecks();
  // The expert kernels ask nothing into L2 ahead of their loads (moe_kernels.cu, kTargetBlocks).
  if (g_prefetches != 0) Fail("an L2 prefetch issued by the expert kernels");
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
