// Host emulation of the grouped decode GEMM (see ../decode_gemm_group_emulate.sh): runs
// decode_gemm.cu's DecodeGemmGroup and DecodeGemm on the same problems and checks that every
// DecodeGemm output is bit-identical to Reference below (the kernel's operations in the kernel's
// order, computed here without its tiling, staging or indexing), every group output to its
// problem's DecodeGemm alone (outputs NaN-poisoned first), both within 2e-6 (relative L2) of a
// float64 product, and that a group takes one GEMM launch per weight alignment and per 8
// problems, one sum launch, and one x split per distinct x (m > 16). It checks the block →
// (problem, column block, split) map, the x staging through shared memory (m > 16: which round's
// parts each warp reads from which buffer), the scratch layout and the grouped sums; the GPU's
// rounding is the CUDA tests' (CudaBackendLinearGroup.*).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kernel_host.cpp"

namespace {

using kimirt::cuda::DecodeGemmProblem;

struct ProblemShape {
  int x;  // which input of the group
  int64_t n, k;
};

struct Case {
  std::string name;
  std::vector<ProblemShape> problems;
  int gemm_launches;  // GEMM launches the group takes
  int x_offset = 0;    // floats from the buffer's start to x: 1 makes x unaligned (the checked rounds)
};

uint64_t g_state = 12345;
double Uniform() {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<double>(g_state >> 11) * 0x1.0p-53;
}

// 256-byte aligned host memory (the device pool's alignment), NaN-filled.
struct Buffer {
  void* p = nullptr;
  explicit Buffer(size_t bytes) {
    const size_t n = (bytes + 255) / 256 * 256 + 256;
    p = std::aligned_alloc(256, n);
    float* f = static_cast<float*>(p);
    for (size_t i = 0; i < n / 4; ++i) f[i] = std::numeric_limits<float>::quiet_NaN();
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* f() { return static_cast<float*>(p); }
};

// y [m, n] as the kernel computes it under shim.h's MMA: for each k slice of the problem's plan
// (MakePlan: from n and k only), for each 32-k step of it, mma::Step's six MMAs in order (x's lo,
// mid, then hi part; of the 8 k 8t .. 8t + 7 lane t holds, the first MMA takes 8t + 0, 1 in k
// slots 2t, 2t + 1 and 8t + 2, 3 in slots 2t + 8, 2t + 9, the second 8t + 4 .. 7 the same way),
// each summed as EmuMma sums it (in double from the running F32 value, slots in order, rounded
// once); the step's sum added to the slice's in F32; the slices added in ascending order
// (SumSplit). Zeros past k. No tiling, staging or scratch: an independent account of the bits.
std::vector<float> Reference(const float* x, const uint16_t* w, int64_t m, int64_t n, int64_t k) {
  const auto plan = kimirt::cuda::MakePlan(m, n, k);
  const int64_t steps = plan.k_pad / 32;
  std::vector<float> parts(static_cast<size_t>(3 * m * plan.k_pad), 0.0f);  // [part lo/mid/hi][row][k]
  for (int64_t r = 0; r < m; ++r) {
    for (int64_t q = 0; q < k; ++q) {
      uint32_t hi, mid, lo;
      kimirt::cuda::mma::SplitOne(x[r * k + q], hi, mid, lo);
      const uint32_t bits[3] = {lo, mid, hi};
      for (int p = 0; p < 3; ++p) parts[static_cast<size_t>((p * m + r) * plan.k_pad + q)] = BfToF(static_cast<uint16_t>(bits[p]));
    }
  }
  std::vector<float> y(static_cast<size_t>(m * n));
  std::vector<float> wf(static_cast<size_t>(plan.k_pad));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t q = 0; q < plan.k_pad; ++q) wf[static_cast<size_t>(q)] = q < k ? BfToF(w[j * k + q]) : 0.0f;
    for (int64_t r = 0; r < m; ++r) {
      float sum = 0.0f;
      for (int64_t s0 = 0; s0 < steps; s0 += plan.slice / 32) {
        float acc = 0.0f;
        for (int64_t step = s0; step < std::min(steps, s0 + plan.slice / 32); ++step) {
          float d = 0.0f;
          for (int p = 0; p < 3; ++p) {
            const float* xp = &parts[static_cast<size_t>((p * m + r) * plan.k_pad)];
            for (int half = 0; half < 2; ++half) {  // the step's two MMAs
              double e = d;
              for (int slot = 0; slot < 16; ++slot) {  // m16n8k16 k slot: lane t = slot % 8 / 2
                const int64_t q = step * 32 + 8 * (slot % 8 / 2) + 4 * half + 2 * (slot / 8) + slot % 2;
                e += static_cast<double>(wf[static_cast<size_t>(q)]) * xp[q];
              }
              d = static_cast<float>(e);
            }
          }
          acc += d;
        }
        sum = s0 == 0 ? acc : sum + acc;
      }
      y[static_cast<size_t>(r * n + j)] = sum;
    }
  }
  return y;
}

int Check(const Case& c, int64_t m) {
  int failures = 0;
  std::vector<std::unique_ptr<Buffer>> x, w, alone, grouped, scratch;
  std::vector<int64_t> x_k;
  for (const ProblemShape& p : c.problems) {
    if (static_cast<size_t>(p.x) == x.size()) {
      x.push_back(std::make_unique<Buffer>(static_cast<size_t>(m * p.k + c.x_offset) * 4));
      for (int64_t i = 0; i < m * p.k; ++i) x.back()->f()[c.x_offset + i] = static_cast<float>((Uniform() * 2 - 1) * 4);
      x_k.push_back(p.k);
    }
    w.push_back(std::make_unique<Buffer>(static_cast<size_t>(p.n * p.k) * 2));
    auto* wb = static_cast<uint16_t*>(w.back()->p);
    for (int64_t i = 0; i < p.n * p.k; ++i) {
      uint16_t b;
      do b = BfRn(static_cast<float>((Uniform() * 2 - 1) * 0.1)); while ((b & 0x7fff) == 0);  // never zero
      wb[i] = b;
    }
    alone.push_back(std::make_unique<Buffer>(static_cast<size_t>(m * p.n) * 4));
    grouped.push_back(std::make_unique<Buffer>(static_cast<size_t>(m * p.n) * 4));
  }
  std::vector<DecodeGemmProblem> dp;
  for (size_t i = 0; i < c.problems.size(); ++i) {
    const ProblemShape& p = c.problems[i];
    dp.push_back({x[static_cast<size_t>(p.x)]->f() + c.x_offset, w[i]->p, grouped[i]->f(), p.n, p.k});
    scratch.push_back(std::make_unique<Buffer>(kimirt::cuda::DecodeGemmScratchBytes(m, p.n, p.k)));
    kimirt::cuda::DecodeGemm(dp[i].x, dp[i].w, alone[i]->f(), m, p.n, p.k, scratch.back()->p, nullptr);
  }
  const int count = static_cast<int>(dp.size());
  Buffer group_scratch(kimirt::cuda::DecodeGemmGroupScratchBytes(m, dp.data(), count));
  kimirt::cuda::g_launches = 0;
  kimirt::cuda::DecodeGemmGroup(m, dp.data(), count, group_scratch.p, nullptr);
  int splits = 0, xs = 0;
  for (size_t i = 0; i < c.problems.size(); ++i) splits += kimirt::cuda::DecodeGemmSplits(c.problems[i].n, c.problems[i].k) > 1;
  for (size_t i = 0; i < x.size(); ++i) xs += m > 16;
  const int want_launches = c.gemm_launches + (splits > 0 ? (splits + 7) / 8 : 0) + xs;
  const std::string where = c.name + " m=" + std::to_string(m);
  if (kimirt::cuda::g_launches != want_launches) {
    std::printf("FAIL %s: %d launches, want %d\n", where.c_str(), kimirt::cuda::g_launches, want_launches);
    ++failures;
  }
  // The tileable problems again with their weights decode-tiled (decode_tiled.cuh), alone and as
  // a group: each output must be the row-major weight's, bit for bit.
  std::vector<std::unique_ptr<Buffer>> w_tiled, y_tiled, y_tiled_group;
  std::vector<DecodeGemmProblem> dp_tiled;
  std::vector<size_t> tiled_of;
  for (size_t i = 0; i < c.problems.size(); ++i) {
    const ProblemShape& p = c.problems[i];
    if (!kimirt::cuda::DecodeGemmTileable(p.n, p.k)) continue;
    w_tiled.push_back(std::make_unique<Buffer>(static_cast<size_t>(p.n * p.k) * 2));
    const auto* from = static_cast<const uint16_t*>(w[i]->p);
    auto* to = static_cast<uint16_t*>(w_tiled.back()->p);
    for (int64_t j = 0; j < p.n; ++j) {
      for (int64_t q = 0; q < p.k; q += 8) {
        std::memcpy(to + kimirt::cuda::DecodeTiledRow(j, p.k) + kimirt::cuda::DecodeTiledK(q), from + j * p.k + q, 16);
      }
    }
    y_tiled.push_back(std::make_unique<Buffer>(static_cast<size_t>(m * p.n) * 4));
    y_tiled_group.push_back(std::make_unique<Buffer>(static_cast<size_t>(m * p.n) * 4));
    kimirt::cuda::DecodeGemm(dp[i].x, w_tiled.back()->p, y_tiled.back()->f(), m, p.n, p.k, scratch[i]->p, nullptr,
                             true);
    dp_tiled.push_back({dp[i].x, w_tiled.back()->p, y_tiled_group.back()->f(), p.n, p.k, true});
    tiled_of.push_back(i);
  }
  if (!dp_tiled.empty()) {
    const int n_tiled = static_cast<int>(dp_tiled.size());
    Buffer tiled_scratch(kimirt::cuda::DecodeGemmGroupScratchBytes(m, dp_tiled.data(), n_tiled));
    kimirt::cuda::DecodeGemmGroup(m, dp_tiled.data(), n_tiled, tiled_scratch.p, nullptr);
  }
  for (size_t t = 0; t < tiled_of.size(); ++t) {
    const size_t i = tiled_of[t];
    const size_t bytes = static_cast<size_t>(m * c.problems[i].n) * 4;
    if (std::memcmp(y_tiled[t]->p, alone[i]->p, bytes) != 0 || std::memcmp(y_tiled_group[t]->p, alone[i]->p, bytes) != 0) {
      std::printf("FAIL %s m=%lld problem %zu (n=%lld k=%lld): tiled weights' bits differ from row-major's\n",
                  c.name.c_str(), static_cast<long long>(m), i, static_cast<long long>(c.problems[i].n),
                  static_cast<long long>(c.problems[i].k));
      ++failures;
    }
  }
  for (size_t i = 0; i < c.problems.size(); ++i) {
    const ProblemShape& p = c.problems[i];
    const std::vector<float> want =
        Reference(x[static_cast<size_t>(p.x)]->f() + c.x_offset, static_cast<const uint16_t*>(w[i]->p), m, p.n, p.k);
    if (std::memcmp(want.data(), alone[i]->p, want.size() * 4) != 0) {
      int64_t bad = 0;
      while (std::memcmp(&want[static_cast<size_t>(bad)], alone[i]->f() + bad, 4) == 0) ++bad;
      std::printf("FAIL %s problem %zu (n=%lld k=%lld): DecodeGemm's bits differ from the reference's, first at "
                  "row %lld column %lld: %.9g, want %.9g\n",
                  where.c_str(), i, static_cast<long long>(p.n), static_cast<long long>(p.k),
                  static_cast<long long>(bad / p.n), static_cast<long long>(bad % p.n), alone[i]->f()[bad],
                  want[static_cast<size_t>(bad)]);
      ++failures;
    }
    if (std::memcmp(grouped[i]->p, alone[i]->p, static_cast<size_t>(m * p.n) * 4) != 0) {
      std::printf("FAIL %s problem %zu (n=%lld k=%lld): group bits differ from DecodeGemm's\n", where.c_str(), i,
                  static_cast<long long>(p.n), static_cast<long long>(p.k));
      ++failures;
    }
    const float* xv = x[static_cast<size_t>(p.x)]->f() + c.x_offset;
    const auto* wb = static_cast<const uint16_t*>(w[i]->p);
    double num = 0, den = 0;
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t j = 0; j < p.n; ++j) {
        double want = 0;
        for (int64_t q = 0; q < p.k; ++q) want += double{xv[r * p.k + q]} * BfToF(wb[j * p.k + q]);
        const double got = grouped[i]->f()[r * p.n + j];
        num += std::isnan(got) ? INFINITY : (got - want) * (got - want);
        den += want * want;
      }
    }
    if (!(std::sqrt(num / den) <= 2e-6)) {
      std::printf("FAIL %s problem %zu: relative L2 %g against float64\n", where.c_str(), i, std::sqrt(num / den));
      ++failures;
    }
  }
  return failures;
}

}  // namespace

int main(int argc, char** argv) {  // argv[1]: run only the case of that name
  // Widths that cover: several problems of one x, problems of their own x (f_b / g_b), splits = 1
  // and 2..8, n under one column block and not a multiple of 16, k not a multiple of 8 (scalar
  // loads: a second GEMM launch), more problems than one launch takes (kMaxGroup = 8).
  const std::vector<Case> cases = {
      {"shared_x", {{0, 300, 640}, {0, 40, 640}, {0, 129, 640}, {0, 1, 640}}, 1},
      {"two_x", {{0, 256, 128}, {1, 200, 128}}, 1},
      {"split8_unaligned", {{0, 200, 2048}, {1, 77, 300}, {0, 33, 2048}}, 2},
      {"tiled", {{0, 256, 2048}, {1, 96, 384}, {2, 64, 128}}, 1},  // every problem tileable (a split one too)
      {"tiled_x_unaligned", {{0, 256, 512}, {1, 64, 256}}, 1, 1},  // tiled weights through the checked rounds
      {"ten", {{0, 16, 256}, {0, 17, 256}, {0, 130, 256}, {0, 8, 256}, {0, 1, 256}, {0, 64, 256}, {0, 3, 256},
               {0, 5, 256}, {0, 100, 256}, {0, 20, 256}}, 2},
  };
  int failures = 0, checks = 0;
  for (const Case& c : cases) {
    if (argc > 1 && c.name != argv[1]) continue;
    for (int64_t m : {1, 2, 3, 8, 9, 16, 17, 32, 33, 64}) {
      failures += Check(c, m);
      ++checks;
    }
  }
  // The shared-memory attributes (2 a kernel: size, carveout) are set once per kernel and device,
  // not per call: 4 and 8 tiles × aligned or not × alone or grouped.
  if (g_attr_calls > 2 * 8) {
    std::printf("FAIL %d cudaFuncSetAttribute calls, want at most 16 (once per kernel)\n", g_attr_calls);
    ++failures;
  }
  std::printf("%d group calls checked, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
