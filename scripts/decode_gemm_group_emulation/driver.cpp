// Host emulation of the grouped decode GEMM (see ../decode_gemm_group_emulate.sh): runs
// decode_gemm.cu's DecodeGemmGroup and DecodeGemm on the same problems and checks that every
// group output is bit-identical to its problem's DecodeGemm alone (outputs NaN-poisoned first),
// within 2e-6 (relative L2) of a float64 product, and that a group takes one GEMM launch per
// weight alignment and per 8 problems, one sum launch, and one x split per distinct x (m > 16).
// It checks the block → (problem, column block, split) map, the scratch layout and the grouped
// sums; the GPU's rounding is the CUDA tests' (CudaBackendLinearGroup.*).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
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

int Check(const Case& c, int64_t m) {
  int failures = 0;
  std::vector<std::unique_ptr<Buffer>> x, w, alone, grouped, scratch;
  std::vector<int64_t> x_k;
  for (const ProblemShape& p : c.problems) {
    if (static_cast<size_t>(p.x) == x.size()) {
      x.push_back(std::make_unique<Buffer>(static_cast<size_t>(m * p.k) * 4));
      for (int64_t i = 0; i < m * p.k; ++i) x.back()->f()[i] = static_cast<float>((Uniform() * 2 - 1) * 4);
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
    dp.push_back({x[static_cast<size_t>(p.x)]->f(), w[i]->p, grouped[i]->f(), p.n, p.k});
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
  for (size_t i = 0; i < c.problems.size(); ++i) {
    const ProblemShape& p = c.problems[i];
    if (std::memcmp(grouped[i]->p, alone[i]->p, static_cast<size_t>(m * p.n) * 4) != 0) {
      std::printf("FAIL %s problem %zu (n=%lld k=%lld): group bits differ from DecodeGemm's\n", where.c_str(), i,
                  static_cast<long long>(p.n), static_cast<long long>(p.k));
      ++failures;
    }
    const float* xv = x[static_cast<size_t>(p.x)]->f();
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
  std::printf("%d group calls checked, %d failures\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
