// Runs tc::TileMma (tc_tile.cuh, turned into host C++ by ../tc_tile_emulate.sh) as one block of
// 256 threads and checks its accumulators: MXFP4 codes row-major, the same codes tiled
// (mxfp4_tiled.cuh) and their values held as BF16 give every accumulator the same bits (the
// decode of either layout puts the same BF16 tile in shared memory); the BF16 tile matches a
// float64 reference to F32 accuracy (the emulated MMA rounds once per instruction, as the
// device's differs only in how). Cases: plain and GLU column maps, all 128 weight rows or rows
// past the weight (null rows: zeros), small scales and some ≥ 128, k of one and of four tiles.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "cuda_bf16.h"
#include "tc_tile_host.cpp"

namespace {

namespace kc = kimirt::cuda;
namespace tc = kimirt::cuda::tc;

uint64_t g_state = 20261205;
uint64_t Next() {
  g_state ^= g_state << 13;
  g_state ^= g_state >> 7;
  g_state ^= g_state << 17;
  return g_state;
}
double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }

int g_failures = 0, g_checks = 0;
void Fail(const std::string& what) {
  if (++g_failures <= 20) std::printf("FAIL %s\n", what.c_str());
}

const float kE2M1[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};

// One case's operands: a [128, kp] BF16; b's rows as MXFP4 codes (row-major and tiled), scales,
// and the same values as BF16; rows ≥ n are past the weight (null rows in the tile).
struct Operands {
  int64_t kp = 0, n = 0;
  std::vector<uint16_t> a, b_bf16;
  std::vector<uint8_t> codes, tiled, scales;
  std::vector<double> b_value;
};

Operands Make(int64_t kp, int64_t n, bool big_scales) {
  Operands o;
  o.kp = kp;
  o.n = n;
  o.a.resize(static_cast<size_t>(128 * kp));
  for (auto& v : o.a) v = BfRn(static_cast<float>((Uniform() * 2 - 1) * 2));
  o.codes.resize(static_cast<size_t>(n * kp / 2));
  o.tiled.resize(o.codes.size());
  o.scales.resize(static_cast<size_t>(n * kp / 32));
  o.b_bf16.resize(static_cast<size_t>(n * kp));
  o.b_value.resize(o.b_bf16.size());
  for (auto& s : o.scales) s = static_cast<uint8_t>(big_scales && Uniform() < 0.1 ? 128 + Next() % 4 : 118 + Next() % 8);
  for (int64_t i = 0; i < n * kp; ++i) {
    const unsigned code = static_cast<unsigned>(Next() % 16);
    o.codes[static_cast<size_t>(i / 2)] |= static_cast<uint8_t>(code << (4 * (i % 2)));
    const double v = std::ldexp((code & 8u) ? -kE2M1[code & 7u] : kE2M1[code & 7u], o.scales[static_cast<size_t>(i / 32)] - 127);
    o.b_value[static_cast<size_t>(i)] = v;
    o.b_bf16[static_cast<size_t>(i)] = BfRn(static_cast<float>(v));
    if (BfToF(o.b_bf16[static_cast<size_t>(i)]) != static_cast<float>(v)) std::abort();  // exact in BF16
  }
  for (int64_t r = 0; r < n; ++r) {  // mxfp4_tiled.cuh's layout, word by word
    for (int64_t q = 0; q < kp; q += 8) {
      uint32_t w;
      std::memcpy(&w, o.codes.data() + (r * kp + q) / 2, 4);
      w = kc::Mxfp4TileWord(w);
      std::memcpy(o.tiled.data() + kc::Mxfp4TiledRow(r, kp) + kc::Mxfp4TiledK(q), &w, 4);
    }
  }
  return o;
}

// Which b form a run uses.
enum class BForm { kBf16, kMxfp4, kMxfp4Tiled };

// The block's accumulators, [thread][mi][ni][f], and each one's (row, column) of the tile.
struct Result {
  std::vector<float> acc;
  std::vector<int> row, col;
};

template <bool kGlu>
Result Run(const Operands& o, BForm form) {
  const bool mxfp4 = form != BForm::kBf16;
  std::vector<unsigned char> smem(mxfp4 ? tc::kSmemMxfp4 : tc::kSmemBf16, 0xff);
  g_smem = smem.data();
  Result res;
  res.acc.assign(256 * 64, NAN);
  res.row.assign(256 * 64, -1);
  res.col.assign(256 * 64, -1);
  BlockCtx ctx(256);
  g_ctx = &ctx;
  auto thread = [&](unsigned tid) {
    const uint16_t* a_rows[tc::kRowsPerThread];
    for (int i = 0; i < tc::kRowsPerThread; ++i) a_rows[i] = o.a.data() + (tid / 8 + 32 * i) * o.kp;
    float acc[4][4][4];
    if (mxfp4) {
      tc::BRowsMxfp4 b{nullptr, nullptr, form == BForm::kMxfp4Tiled};
      const int64_t r = tid >> 1;
      if (r < o.n) {
        b.codes = (b.tiled ? o.tiled.data() + kc::Mxfp4TiledRow(r, o.kp) : o.codes.data() + r * (o.kp / 2));
        b.scales = o.scales.data() + r * (o.kp / 32);
      }
      tc::TileMma<true, kGlu>(smem.data(), a_rows, b, o.kp, o.a.data(), acc);
    } else {
      tc::BRowsBf16 b;
      for (int i = 0; i < tc::kRowsPerThread; ++i) {
        const int64_t r = tid / 8 + 32 * i;
        b.rows[i] = r < o.n ? o.b_bf16.data() + r * o.kp : nullptr;
      }
      tc::TileMma<false, kGlu>(smem.data(), a_rows, b, o.kp, o.a.data(), acc);
    }
    for (int mi = 0; mi < 4; ++mi) {
      for (int ni = 0; ni < 4; ++ni) {
        for (int f = 0; f < 4; ++f) {
          const size_t at = static_cast<size_t>(tid * 64 + (mi * 4 + ni) * 4 + f);
          res.acc[at] = acc[mi][ni][f];
          res.row[at] = tc::TileRowOf(mi, f);
          // GLU: n tiles 0, 1 are b rows 16w + 8j (gate), 2, 3 the same + 64 (up).
          res.col[at] = kGlu ? tc::TileColOf<true>(ni % 2, f) + (ni >= 2 ? 64 : 0) : tc::TileColOf<false>(ni, f);
        }
      }
    }
  };
  RunBlockThreads(256, thread);
  return res;
}

template <bool kGlu>
void Check(const std::string& name, int64_t kp, int64_t n, bool big_scales) {
  const Operands o = Make(kp, n, big_scales);
  const std::string where = name + (kGlu ? " glu" : "");
  const Result bf = Run<kGlu>(o, BForm::kBf16), rm = Run<kGlu>(o, BForm::kMxfp4), tl = Run<kGlu>(o, BForm::kMxfp4Tiled);
  g_checks += 3;
  if (std::memcmp(rm.acc.data(), bf.acc.data(), bf.acc.size() * 4) != 0) Fail(where + ": MXFP4 row-major differs from BF16-held");
  if (std::memcmp(tl.acc.data(), bf.acc.data(), bf.acc.size() * 4) != 0) Fail(where + ": MXFP4 tiled differs from BF16-held");
  // The BF16 tile against float64: acc (row, col) = Σ_k a[row][k] · b[col][k], 0 past n.
  double worst = 0;
  std::vector<int> seen(128 * 128, 0);
  for (size_t i = 0; i < bf.acc.size(); ++i) {
    const int row = bf.row[i], col = bf.col[i];
    ++seen[static_cast<size_t>(row * 128 + col)];
    double want = 0, mag = 0;
    if (col < n) {
      for (int64_t k = 0; k < kp; ++k) {
        const double p = static_cast<double>(BfToF(o.a[static_cast<size_t>(row * kp + k)])) * o.b_value[static_cast<size_t>(col * kp + k)];
        want += p;
        mag += std::fabs(p);
      }
    }
    const double err = std::fabs(bf.acc[i] - want) / (mag + 1e-30);
    if (!(err <= 1e-6)) {
      if (worst == 0) Fail(where + ": BF16 tile row " + std::to_string(row) + " col " + std::to_string(col) + " = " +
                           std::to_string(bf.acc[i]) + ", want " + std::to_string(want));
      worst = std::max(worst, std::isnan(err) ? 1.0 : err);
    }
  }
  ++g_checks;
  for (int s : seen) {
    if (s != 1) {
      Fail(where + ": an output element held by " + std::to_string(s) + " accumulators");
      break;
    }
  }
}

}  // namespace

int main() {
  Check<false>("k=128 n=128", 128, 128, false);
  Check<false>("k=256 n=112 big scales", 256, 112, true);
  Check<true>("k=256 n=128", 256, 128, true);
  Check<true>("k=128 n=48", 128, 48, false);
  std::printf("%d checks, %d failures\n", g_checks, g_failures);
  return g_failures == 0 ? 0 : 1;
}
