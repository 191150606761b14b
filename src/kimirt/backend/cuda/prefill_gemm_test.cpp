// The prefill GEMMs on tensor cores (issue 14 item 1, issue 13 item 2; prefill_gemm.cu,
// moe_prefill_kernels.cu), through the backend with bf16_prefill() on as Model::Load sets it:
//   - the dense GEMM against a float64 reference of BF16-rounded x times the BF16 weight, so the
//     only error left is the F32 accumulation (a bound ~1000× under what an unrounded or wrongly
//     rounded x would give), at Kimi-Linear-48B's projection shapes and odd ones (n and k no
//     multiple of the 128 × 64 tile, k % 8 ≠ 0: the padded weight copy);
//   - batch invariance: each row of a call bit-identical to that row in calls of other sizes, at
//     other positions of the tile (rows 300.. of an m = 1000 call as rows 0.. of an m = 300 call),
//     and alone (m = 1, the kernel called directly);
//   - bf16_prefill() off keeps the F32 path (cuBLAS SGEMM) and its accuracy;
//   - the grouped MoE: MXFP4 experts give the bits of the same experts held as BF16, each token's
//     bits do not depend on the call, within BF16 tolerance of the CPU's F32 reference and close
//     to a float64 emulation of the BF16 roundings (z and h);
//   - bad shapes abort with a message that names the problem.
// Outputs are poisoned with NaN first. In the CUDA build only (CMakeLists: backend/cuda/ tests).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"
#include "kimirt/testing/cuda_cpu_test.h"
#include "kimirt/testing/moe_experts_case.h"

namespace kimirt {
namespace {

float RoundBf16(float v) {
  uint16_t b = 0;
  F32ToBf16(&v, &b, 1);
  float r = 0;
  Bf16ToF32(&b, &r, 1);
  return r;
}

// Number of elements of `got` that are NaN or differ in bits from `want` (n floats each).
int64_t BitDiffs(const float* got, const float* want, int64_t n, int64_t* first) {
  int64_t differ = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(got[i]) || std::memcmp(got + i, want + i, sizeof(float)) != 0) {
      if (differ++ == 0) *first = i;
    }
  }
  return differ;
}

class PrefillFixture : public testing::CudaCpuTest {
 protected:
  void SetUp() override {
    CudaCpuTest::SetUp();
    if (gpu_ != nullptr) gpu_->set_bf16_prefill(true);  // as Model::Load does for BF16-held weights
  }
  Tensor Linear(const Tensor& x, const Tensor& w_dev, int64_t n) {
    Tensor y = Poisoned({x.dim(0), n});
    gpu_->Linear(gpu_->Upload(x), w_dev, &y);
    return gpu_->Download(y);
  }

  static void ExpectSameRows(const Tensor& got, int64_t got_row, const Tensor& want, int64_t want_row, int64_t rows,
                             const std::string& what) {
    const int64_t n = got.numel() / got.dim(0);
    ASSERT_EQ(n, want.numel() / want.dim(0));
    int64_t first = -1;
    const int64_t differ = BitDiffs(got.f32() + got_row * n, want.f32() + want_row * n, rows * n, &first);
    EXPECT_EQ(differ, 0) << what << ": " << differ << " elements differ, the first at row "
                         << (first >= 0 ? first / n : 0) << " column " << (first >= 0 ? first % n : 0);
  }

};

class CudaBackendPrefillGemm : public PrefillFixture {};

// Error bound. Products of BF16 values are exact in F32, so what is left is the F32 sum: per
// element at most (k/16 + 16)·2⁻²³·Σ|x_i w_i| (one rounding or truncation per k16 MMA into the
// running sum, and within one). In relative L2: a random walk of roundings would be ≈
// 5e-8·√(k/16) (1.2e-6 at k = 9216), but the tensor cores truncate, a bias of up to ~2⁻²⁴ of the
// running sum per MMA (decode_gemm.cu measured ~1e-5 over 1728 MMAs; k = 9216 is 576 here):
// 2e-5 holds that with room. x unrounded or rounded wrongly (truncated) would be off by ~2⁻⁹
// per element, ~1e-3 relative — 50× the bound.
TEST_F(CudaBackendPrefillGemm, MatchesFloat64OfBf16RoundedX) {
  struct Case {
    int64_t m, k, n;
  };
  const std::vector<Case> cases = {
      // Kimi-Linear-48B: KDA q/k/v, KDA/MLA o, MLA q, kv_a, MLP gate/up and down, shared expert.
      {65, 2304, 4096}, {100, 4096, 2304}, {1000, 2304, 6144}, {300, 2304, 576},
      {130, 2304, 9216}, {257, 9216, 2304}, {129, 2304, 1024},
      // Odd: n and k no multiple of the tile, k % 8 ≠ 0 (the padded weight copy), tiny k.
      {65, 300, 77}, {100, 300, 129}, {1000, 2305, 1000}, {67, 5, 3}, {200, 1000, 130}};
  for (const Case& c : cases) {
    SCOPED_TRACE(std::to_string(c.m) + "x" + std::to_string(c.k) + "x" + std::to_string(c.n));
    Tensor x = Random({c.m, c.k}), w = Random({c.n, c.k}, 0.05f);
    const Tensor wd = UpBf16(w);
    const Tensor y = Linear(x, wd, c.n);
    // Every row of the small cases; of the large ones (a float64 reference costs m·n·k), the rows
    // at the edges of the 64- and 128-row tiles, the last, and 24 more at random.
    std::vector<int64_t> rows;
    if (c.m * c.n * c.k <= int64_t{400} << 20) {
      rows.resize(static_cast<size_t>(c.m));
      std::iota(rows.begin(), rows.end(), 0);
    } else {
      for (int64_t r : {int64_t{0}, int64_t{1}, int64_t{63}, int64_t{64}, int64_t{127}, int64_t{128}, int64_t{129}}) {
        if (r < c.m) rows.push_back(r);
      }
      rows.push_back(c.m - 1);
      for (int i = 0; i < 24; ++i) rows.push_back(static_cast<int64_t>(rng_.Next() % c.m));
    }
    std::vector<double> xr(static_cast<size_t>(c.k));
    double num = 0, den = 0;
    int64_t over = 0;
    for (int64_t t : rows) {
      for (int64_t i = 0; i < c.k; ++i) xr[static_cast<size_t>(i)] = RoundBf16(x.f32()[t * c.k + i]);
      for (int64_t j = 0; j < c.n; ++j) {
        double want = 0, mag = 0;
        for (int64_t i = 0; i < c.k; ++i) {
          const double p = xr[static_cast<size_t>(i)] * w.f32()[j * c.k + i];
          want += p;
          mag += std::fabs(p);
        }
        const double g = y.f32()[t * c.n + j];
        if (std::isnan(g) || std::fabs(g - want) > (c.k / 16.0 + 16.0) * 0x1p-23 * mag) ++over;
        num += std::isnan(g) ? INFINITY : (g - want) * (g - want);
        den += want * want;
      }
    }
    EXPECT_EQ(over, 0) << "elements past the per-element bound";
    EXPECT_LE(std::sqrt(num / den), 2e-5);
  }
}

// Batch invariance (docs/architecture.md): a row's bits are the same in calls of m = 1000, 300
// and 65 rows, at different positions within the 128-row tile, in a shuffled call, and alone.
TEST_F(CudaBackendPrefillGemm, RowsAreBitIdenticalAcrossCallSizes) {
  for (auto [K, N] : std::vector<std::pair<int64_t, int64_t>>{{2304, 576}, {300, 77}, {4096, 2304}}) {
    SCOPED_TRACE(std::to_string(K) + "x" + std::to_string(N));
    Tensor w = Random({N, K}, 0.05f);
    const Tensor wd = UpBf16(w);
    // Rows of very different scales (1e-3 .. 1e3), so a tile's other rows would show if they mattered.
    Tensor x = Random({1000, K});
    for (int64_t r = 0; r < 1000; ++r) {
      const float scale = std::pow(10.0f, static_cast<float>(r % 7) - 3.0f);
      for (int64_t i = 0; i < K; ++i) x.f32()[r * K + i] *= scale;
    }
    const Tensor all = Linear(x, wd, N);
    ExpectSameRows(Linear(x.Rows(0, 65), wd, N), 0, all, 0, 65, "m = 65, rows 0..64");
    ExpectSameRows(Linear(x.Rows(300, 300), wd, N), 0, all, 300, 300, "m = 300, rows 300..599");
    ExpectSameRows(Linear(x.Rows(935, 65), wd, N), 0, all, 935, 65, "m = 65, rows 935..999");
    // 97 rows picked at random, in random order.
    std::vector<int64_t> pick(97);
    Tensor xs = Tensor::Host({97, K});
    for (size_t i = 0; i < pick.size(); ++i) {
      pick[i] = static_cast<int64_t>(rng_.Next() % 1000);
      std::copy_n(x.f32() + pick[i] * K, K, xs.f32() + static_cast<int64_t>(i) * K);
    }
    const Tensor shuffled = Linear(xs, wd, N);
    for (size_t i = 0; i < pick.size(); ++i) {
      ExpectSameRows(shuffled, static_cast<int64_t>(i), all, pick[i], 1, "shuffled row " + std::to_string(i));
    }
    // Rows alone (m = 1: below kGemvMaxRows, so the kernel itself, called directly).
    for (int64_t r : {0, 1, 127, 128, 500, 999}) {
      Tensor xd = gpu_->Upload(x.Rows(r, 1)), y = Poisoned({1, N});
      Tensor scratch = gpu_->Empty({static_cast<int64_t>(cuda::PrefillGemmScratchBytes(1, N, K, wd.raw()) / 4 + 1)});
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the backend's stream has uploaded x and poisoned y
      cuda::PrefillGemm(static_cast<const float*>(xd.raw()), wd.raw(), static_cast<float*>(y.raw()), 1, N, K,
                        scratch.raw(), nullptr);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      ExpectSameRows(gpu_->Download(y), 0, all, r, 1, "row " + std::to_string(r) + " alone");
    }
  }
}

// The wgmma tile (PrefillGemm's default) against the mma.sync tile it replaced: the same products
// summed in the same order, so the same bits, at the models' shapes and odd ones (n and m past
// the tile, k % 8 ≠ 0: the padded weight copy, k below one k tile).
TEST_F(CudaBackendPrefillGemm, WgmmaGivesTheMmaSyncBits) {
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{
           {1000, 2304, 4096}, {257, 9216, 2304}, {65, 512, 8192}, {300, 300, 77}, {100, 2305, 1000}, {67, 5, 3}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n));
    Tensor x = Random({m, k}), w = Random({n, k}, 0.05f);
    const Tensor wd = UpBf16(w), xd = gpu_->Upload(x);
    Tensor got = Poisoned({m, n}), want = Poisoned({m, n});
    Tensor scratch = gpu_->Empty({static_cast<int64_t>(cuda::PrefillGemmScratchBytes(m, n, k, wd.raw()) / 4 + 1)});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the backend's stream has uploaded x and poisoned y
    cuda::PrefillGemm(static_cast<const float*>(xd.raw()), wd.raw(), static_cast<float*>(got.raw()), m, n, k,
                      scratch.raw(), nullptr);
    cuda::PrefillGemmMmaSync(static_cast<const float*>(xd.raw()), wd.raw(), static_cast<float*>(want.raw()), m, n, k,
                             scratch.raw(), nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpectSameRows(gpu_->Download(got), 0, gpu_->Download(want), 0, m, "wgmma against mma.sync");
  }
}

// PrefillGemmBf16Out (MLA prefill's expansion) stores the bits ToBf16 gives of PrefillGemm's F32
// y: even n (pairs stored at once), odd n (one by one), an n past the tile, the 48B's kv_b width.
TEST_F(CudaBackendPrefillGemm, Bf16OutIsTheF32OutRounded) {
  for (auto [m, k, n] : std::vector<std::array<int64_t, 3>>{{65, 512, 8192}, {300, 300, 77}, {129, 64, 130}}) {
    SCOPED_TRACE(std::to_string(m) + "x" + std::to_string(k) + "x" + std::to_string(n));
    Tensor x = Random({m, k}), w = Random({n, k}, 0.05f);
    const Tensor wd = UpBf16(w), xd = gpu_->Upload(x);
    Tensor y32 = Poisoned({m, n});
    Tensor y16 = gpu_->Empty({m, n}, DType::kBF16), want16 = gpu_->Empty({m, n}, DType::kBF16);
    Tensor scratch = gpu_->Empty({static_cast<int64_t>(cuda::PrefillGemmScratchBytes(m, n, k, wd.raw()) / 4 + 1)});
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the backend's stream has uploaded x and poisoned y
    cuda::PrefillGemm(static_cast<const float*>(xd.raw()), wd.raw(), static_cast<float*>(y32.raw()), m, n, k,
                      scratch.raw(), nullptr);
    cuda::ToBf16(static_cast<const float*>(y32.raw()), want16.raw(), m * n, nullptr);
    cuda::PrefillGemmBf16Out(static_cast<const float*>(xd.raw()), wd.raw(), y16.raw(), m, n, k, scratch.raw(),
                             nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor got = gpu_->Download(y16), want = gpu_->Download(want16);
    EXPECT_EQ(std::memcmp(got.raw(), want.raw(), static_cast<size_t>(m * n) * 2), 0);
  }
}

// bf16_prefill() off (F32-held mode, the F32 goldens' mode): the same call stays on cuBLAS SGEMM
// with the F32 x, within F32 summation error of the unrounded float64 product — and so differs
// from the BF16 path, which proves the switch picks the path.
TEST_F(CudaBackendPrefillGemm, OffKeepsTheF32Path) {
  const int64_t m = 100, k = 2304, n = 576;
  Tensor x = Random({m, k}), w = Random({n, k}, 0.05f);
  const Tensor wd = UpBf16(w);
  const Tensor on = Linear(x, wd, n);
  gpu_->set_bf16_prefill(false);
  const Tensor off = Linear(x, wd, n);
  double num = 0, den = 0, num_on = 0;
  for (int64_t t = 0; t < m; ++t) {
    for (int64_t j = 0; j < n; ++j) {
      double want = 0;
      for (int64_t i = 0; i < k; ++i) want += double{x.f32()[t * k + i]} * w.f32()[j * k + i];
      const double g = off.f32()[t * n + j], g_on = on.f32()[t * n + j];
      num += std::isnan(g) ? INFINITY : (g - want) * (g - want);
      num_on += (g_on - want) * (g_on - want);
      den += want * want;
    }
  }
  EXPECT_LE(std::sqrt(num / den), 2e-6) << "bf16_prefill off: F32 accuracy";
  EXPECT_GE(std::sqrt(num_on / den), 1e-4) << "bf16_prefill on: x was rounded to BF16";
}

// Host-side argument checks: no GPU needed (outside the CudaBackend* filter, so not under memcheck).
TEST(PrefillGemmDeathTest, BadShapesAbortWithAMessage) {
  EXPECT_DEATH(cuda::PrefillGemm(nullptr, nullptr, nullptr, 0, 16, 16, nullptr, nullptr), "at least 1");
  EXPECT_DEATH(cuda::PrefillGemm(nullptr, nullptr, nullptr, int64_t{1} << 32, 16, 16, nullptr, nullptr),
               "more tiles than the grid");
  cuda::ExpertGroups g;
  cuda::ExpertPointerTable w;
  EXPECT_DEATH(cuda::MoePrefillExperts(nullptr, 100, 8, g, 16, 100, 64, w, false, 0, 1.0f, false, 1.0f, nullptr,
                                       nullptr, nullptr),
               "multiples of 8");
  EXPECT_DEATH(cuda::MoePrefillExperts(nullptr, 100, 8, g, 16, 112, 64, w, true, 0, 1.0f, false, 1.0f, nullptr,
                                       nullptr, nullptr),
               "multiples of 32");
  EXPECT_FALSE(cuda::MoePrefillSupports(100, 64, false));
  EXPECT_TRUE(cuda::MoePrefillSupports(104, 64, false));
  EXPECT_FALSE(cuda::MoePrefillSupports(104, 64, true));
}

// ---------------------------------------------------------------------------------------------
class CudaBackendMoePrefill : public PrefillFixture {
 protected:
  using Experts = testing::MoeExpertsCase;
  Experts RandomExperts(int64_t E, int64_t De, int64_t I) { return testing::RandomMoeExperts(*gpu_, rng_, E, De, I); }
  void RandomChoice(int64_t T, int64_t E, int64_t k, int64_t hot, Tensor* idx, Tensor* w) {
    testing::RandomMoeChoice(rng_, T, E, k, idx, w, hot);
  }
  static double Glu(double a, double u, const GluParams& p) {
    const double sig = 1.0 / (1.0 + std::exp(-a));
    if (p.kind == GluKind::kSilu) return a * sig * u;
    const double cap = p.linear_beta ? *p.linear_beta * std::tanh(u / *p.linear_beta) : u;
    return p.beta * std::tanh(a / p.beta) * sig * cap;
  }
  // Float64 with the kernels' two roundings: z to BF16 on the way in, h to BF16 between the GEMMs.
  static Tensor Emulated(const Tensor& z, const Tensor& idx, const Tensor& w, const ExpertWeights& f32,
                         const GluParams& p) {
    const int64_t T = z.dim(0), De = z.dim(1), k = idx.dim(1), I = f32.gate[0].dim(0);
    Tensor out = Tensor::Host({T, De});
    std::vector<double> zr(static_cast<size_t>(De)), h(static_cast<size_t>(I)), acc(static_cast<size_t>(De));
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < De; ++i) zr[static_cast<size_t>(i)] = RoundBf16(z.f32()[t * De + i]);
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < k; ++j) {
        const size_t e = static_cast<size_t>(idx.i32()[t * k + j]);
        const float *g = f32.gate[e].f32(), *u = f32.up[e].f32(), *d = f32.down[e].f32();
        for (int64_t i = 0; i < I; ++i) {
          double sg = 0, su = 0;
          for (int64_t c = 0; c < De; ++c) {
            sg += zr[static_cast<size_t>(c)] * g[i * De + c];
            su += zr[static_cast<size_t>(c)] * u[i * De + c];
          }
          h[static_cast<size_t>(i)] = RoundBf16(static_cast<float>(Glu(sg, su, p)));
        }
        const double cw = w.f32()[t * k + j];
        for (int64_t c = 0; c < De; ++c) {
          double s = 0;
          for (int64_t i = 0; i < I; ++i) s += h[static_cast<size_t>(i)] * d[c * I + i];
          acc[static_cast<size_t>(c)] += cw * static_cast<float>(s);
        }
      }
      for (int64_t c = 0; c < De; ++c) out.f32()[t * De + c] = static_cast<float>(acc[static_cast<size_t>(c)]);
    }
    return out;
  }
};

// Widths of a few scale groups that are no multiple of the tiles (De = 352: down tiles of 128,
// 128, 96 and a half k tile; I = 224: gate/up tiles of 64 with a half one), one expert chosen
// by every token (3 row tiles), SiTU as K3 configures it, then SiLU.
TEST_F(CudaBackendMoePrefill, Mxfp4GivesTheBitsOfBf16AndMatchesTheReference) {
  const int64_t E = 12, De = 352, I = 224, k = 4, T = 300;
  const Experts ex = RandomExperts(E, De, I);
  for (const GluParams& p : {GluParams{GluKind::kSitu, 4.0f, 25.0f}, GluParams{GluKind::kSilu, 1.0f, std::nullopt}}) {
    SCOPED_TRACE(p.kind == GluKind::kSilu ? "silu" : "situ");
    Tensor z = Random({T, De}), idx, w;
    RandomChoice(T, E, k, /*hot=*/5, &idx, &w);
    const Tensor packed = RunMoeExperts(z, idx, w, ex.packed, p);
    ExpectSameRows(packed, 0, RunMoeExperts(z, idx, w, ex.bf16, p), 0, T, "MXFP4 vs BF16-held");
    // Within BF16 tolerance of the CPU's F32 reference (z and h rounded to BF16: ~2⁻⁹ each).
    Tensor want = cpu_->Empty({T, De});
    cpu_->MoeExperts(z, idx, w, ex.f32, p, &want);
    const double err = RelL2(packed, want);
    EXPECT_LE(err, 1e-2) << "against the CPU's F32 reference";
    EXPECT_GE(err, 1e-5) << "BF16 inputs leave a visible difference from F32";
    // Close to the float64 emulation of the same roundings (what remains: F32 sums, and the
    // rare h that rounds the other way).
    EXPECT_LE(RelL2(packed, Emulated(z, idx, w, ex.f32, p)), 1e-4) << "against the BF16-rounding emulation";
    // bf16_prefill off: the F32 CUDA-core kernels, F32 accuracy.
    gpu_->set_bf16_prefill(false);
    EXPECT_LE(RelL2(RunMoeExperts(z, idx, w, ex.packed, p), want), 1e-5) << "bf16_prefill off";
    gpu_->set_bf16_prefill(true);
  }
}

// Batch invariance: each token's output in calls of 1000, 65 and 300 tokens (different group
// sizes and tile positions for its rows) is bit-identical.
TEST_F(CudaBackendMoePrefill, TokensAreBitIdenticalAcrossCallSizes) {
  const int64_t E = 24, De = 256, I = 128, k = 6, T = 1000;
  const Experts ex = RandomExperts(E, De, I);
  const GluParams p{GluKind::kSitu, 4.0f, 25.0f};
  Tensor z = Random({T, De}), idx, w;
  RandomChoice(T, E, k, -1, &idx, &w);
  for (const ExpertWeights* held : {&ex.packed, &ex.bf16}) {
    SCOPED_TRACE(held == &ex.packed ? "MXFP4" : "BF16");
    const Tensor all = RunMoeExperts(z, idx, w, *held, p);
    ExpectSameRows(RunMoeExperts(z.Rows(0, 65), idx.Rows(0, 65), w.Rows(0, 65), *held, p), 0, all, 0, 65, "T = 65");
    ExpectSameRows(RunMoeExperts(z.Rows(300, 300), idx.Rows(300, 300), w.Rows(300, 300), *held, p), 0, all, 300, 300,
                   "T = 300, tokens 300..599");
  }
}

// K3's routed experts (latent 3584, intermediate 3072, top-16; 20 of the 896 here) in a
// prefill-sized call: MXFP4 bit-identical to BF16-held, and within BF16 tolerance of the CPU.
TEST_F(CudaBackendMoePrefill, Mxfp4GivesTheBitsOfBf16AtK3Widths) {
  const int64_t E = 20, De = 3584, I = 3072, k = 16, T = 160;
  const Experts ex = RandomExperts(E, De, I);
  const GluParams situ{GluKind::kSitu, 4.0f, 25.0f};
  Tensor z = Random({T, De}), idx, w;
  RandomChoice(T, E, k, -1, &idx, &w);
  const Tensor packed = RunMoeExperts(z, idx, w, ex.packed, situ);
  ExpectSameRows(packed, 0, RunMoeExperts(z, idx, w, ex.bf16, situ), 0, T, "MXFP4 vs BF16-held");
  Tensor want = cpu_->Empty({T, De});
  cpu_->MoeExperts(z, idx, w, ex.f32, situ, &want);
  EXPECT_LE(RelL2(packed, want), 1e-2);
}

}  // namespace
}  // namespace kimirt
