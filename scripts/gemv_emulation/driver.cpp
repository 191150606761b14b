// Host emulation of cuda::Gemv (see ../gemv_emulate.sh): each case runs weight_kernels.cu's Gemv
// on random inputs (never zeros; outputs NaN-poisoned first) and checks every (row, column) bit
// for bit against the sum order the kernels promise — "lane" j sums x[k]·w[k] for k = j, j + 32,
// … ascending with fmaf, then v += v[j ^ 16], 8, 4, 2, 1, lane 0's value — and rows 0, m / 2 and
// m − 1 alone against the batch. The cases cover the staged kernel's four rows-per-item variants
// and their edges at Kimi-Linear-48B's and K3's router widths, odd k (a partial last step, many
// chunks), a width whose column count per block is capped, BF16 weights through the staged
// kernel (the routers as stored), and the general kernel (k % 4 ≠ 0, BF16 rows no multiple of
// 16 bytes, x not 16-byte aligned).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "kernel_host.cpp"
#include "kimirt/testing/gemv_reference.h"

namespace {

uint64_t g_state = 20261201;
float NonZero(float scale) {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  const double u = static_cast<double>(g_state >> 11) * 0x1.0p-53;  // [0, 1)
  return static_cast<float>(scale * (u < 0.5 ? -0.05 - 2 * u : 0.05 + 2 * (u - 0.5)));
}

// 256-byte aligned, as the device pool's buffers are.
struct Buffer {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Buffer(size_t b) : bytes((b + 255) / 256 * 256 + 256) { p = std::aligned_alloc(256, bytes); }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() { return static_cast<float*>(p); }
};

struct Case {
  std::string name;
  int64_t m, n, k;
  bool bf16 = false;
  int64_t x_offset = 0;  // floats past the buffer's start (1: rows not 16-byte aligned)
};

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

int Check(const Case& c) {
  Buffer xb(static_cast<size_t>(c.m * c.k + c.x_offset) * 4), wb(static_cast<size_t>(c.n * c.k) * 4);
  float* x = xb.f() + c.x_offset;
  std::vector<float> w(static_cast<size_t>(c.n * c.k));
  for (int64_t i = 0; i < c.m * c.k; ++i) x[i] = NonZero(1.0f);
  for (float& v : w) v = NonZero(0.02f);
  if (c.bf16) {
    auto* wh = static_cast<uint16_t*>(wb.p);
    for (size_t i = 0; i < w.size(); ++i) {
      wh[i] = Bf16Bits(w[i]);
      const uint32_t u = static_cast<uint32_t>(wh[i]) << 16;
      std::memcpy(&w[i], &u, 4);  // the reference sees the BF16 value
    }
  } else {
    std::copy(w.begin(), w.end(), wb.f());
  }
  g_inputs = {{static_cast<const char*>(xb.p), xb.bytes}, {static_cast<const char*>(wb.p), wb.bytes}};
  std::vector<float> want(static_cast<size_t>(c.m * c.n));
  for (int64_t r = 0; r < c.m; ++r) {
    for (int64_t j = 0; j < c.n; ++j) {
      want[static_cast<size_t>(r * c.n + j)] = kimirt::testing::GemvReferenceDot(x + r * c.k, w.data() + j * c.k, c.k);
    }
  }
  int failures = 0;
  auto run = [&](int64_t row0, int64_t rows, const std::string& what) {
    std::vector<float> y(static_cast<size_t>(rows * c.n), std::numeric_limits<float>::quiet_NaN());
    kimirt::cuda::Gemv(x + row0 * c.k, wb.p, c.bf16, y.data(), rows, c.n, c.k, nullptr);
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < rows * c.n; ++i) {
      const float g = y[static_cast<size_t>(i)], e = want[static_cast<size_t>(row0 * c.n + i)];
      if (std::isnan(g) || std::memcmp(&g, &e, 4) != 0) {
        if (differ++ == 0) first = i;
      }
    }
    if (differ != 0) {
      std::printf("FAIL %s %s: %lld of %lld differ, the first (row %lld, column %lld) %.9g vs %.9g\n", c.name.c_str(),
                  what.c_str(), static_cast<long long>(differ), static_cast<long long>(rows * c.n),
                  static_cast<long long>(row0 + first / c.n), static_cast<long long>(first % c.n),
                  y[static_cast<size_t>(first)], want[static_cast<size_t>(row0 * c.n + first)]);
      ++failures;
    }
  };
  run(0, c.m, "batch");
  for (const int64_t t : {int64_t{0}, c.m / 2, c.m - 1}) {
    if (t == 0 && c.m == 1) continue;
    run(t, 1, "row " + std::to_string(t) + " alone");
  }
  std::printf("%s %s (m %lld, n %lld, k %lld)\n", failures == 0 ? "ok  " : "FAIL", c.name.c_str(),
              static_cast<long long>(c.m), static_cast<long long>(c.n), static_cast<long long>(c.k));
  std::fflush(stdout);
  return failures;
}

}  // namespace

// `plans`: how the staged kernel cuts the models' router shapes at decode batch sizes.
void PrintPlans() {
  std::printf("%-6s %5s %5s %3s  %-5s %5s %10s %5s %10s %6s %7s\n", "shape", "n", "k", "m", "tile", "rows",
              "row_blocks", "cols", "col_blocks", "chunk", "smem_KB");
  for (const auto& [name, n, k] : {std::tuple<const char*, int64_t, int64_t>{"kl48", 256, 2304}, {"k3", 896, 7168}}) {
    for (const int64_t m : {1, 2, 4, 8, 9, 16, 32, 33, 64}) {
      const auto p = kimirt::cuda::PlanStaged(m, n, k);
      const auto t = kimirt::cuda::kTiles[p.tile];
      std::printf("%-6s %5lld %5lld %3lld  %dx%-3d %5lld %10lld %5lld %10lld %6lld %7.1f\n", name,
                  static_cast<long long>(n), static_cast<long long>(k), static_cast<long long>(m), t.r, t.c,
                  static_cast<long long>(p.rows), static_cast<long long>(p.row_blocks), static_cast<long long>(p.cols),
                  static_cast<long long>(p.col_blocks), static_cast<long long>(p.chunk),
                  kimirt::cuda::kStages * kimirt::cuda::StagedSlotBytes<float>(p.cols, p.rows, p.chunk) / 1024.0);
    }
  }
}

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "plans") {
    PrintPlans();
    return 0;
  }
  // The staged kernel's plan for each (PlanStaged; `plans` prints them): tile, rows × row blocks.
  const std::vector<Case> cases = {
      {"k3_m1", 1, 896, 7168},              // 1x1, 7 columns a block, 128 blocks
      {"k3_m2", 2, 896, 7168},              // 2x2
      {"k3_m9", 9, 896, 7168},              // 4x2, a 1-row last tile
      {"k3_m64", 64, 896, 7168},            // 8x8, 16 rows × 4 blocks, 28 columns: a half tile
      {"kl48_m1", 1, 256, 2304},            // 1x1, 2 columns a block
      {"kl48_m3", 3, 256, 2304},            // 2x2, a clamped row
      {"kl48_m16", 16, 256, 2304},          // 4x2, 8 rows × 2 blocks
      {"kl48_m33", 33, 256, 2304},          // 8x2, 8 rows × 5 blocks, the last of 1 row
      {"kl48_m64", 64, 256, 2304},          // 8x2, 8 rows × 8 blocks
      {"k100_n3_m4", 4, 3, 100},            // one chunk, a partial last step
      {"k100_n1_m64", 64, 1, 100},          // one column
      {"many_chunks", 2, 5, 60000},         // 59 chunks through 3 slots
      {"chunks_then_tail", 3, 7, 5000},     // 5 chunks, the last 904 long: a partial last step
      {"capped_cols", 5, 9000, 128},        // columns a block capped by the tiles a block takes
      {"k3_m1_bf16", 1, 896, 7168, true},   // the routers as stored: the staged kernel's BF16 slots
      {"k3_m64_bf16", 64, 896, 7168, true},
      {"kl48_m9_bf16", 9, 256, 2304, true},
      {"chunks_then_tail_bf16", 3, 7, 5000, true},
      {"general_k4097", 33, 10, 4097},      // the general kernel
      {"general_bf16", 9, 10, 100, true},   // the general kernel, BF16 rows no multiple of 16 bytes
      {"general_x_unaligned", 3, 10, 2304, false, 1},
  };

  int failures = 0, ran = 0;
  for (const Case& c : cases) {
    if (argc > 1 && c.name != argv[1]) continue;
    failures += Check(c);
    ++ran;
  }
  if (ran == 0) {
    std::printf("no case named %s\n", argc > 1 ? argv[1] : "");
    return 2;
  }
  std::printf("%d case(s), %d failure(s)\n", ran, failures);
  return failures == 0 ? 0 : 1;
}
