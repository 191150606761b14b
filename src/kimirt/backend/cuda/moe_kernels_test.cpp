// The CUDA MoE with MXFP4 experts held as the checkpoint stores them (spec §2.9, §7.2):
//   - the device decode of every E2M1 code under a range of E8M0 scales (subnormal results, the
//     largest finite ones, overflow to inf, the NaN scale) is core/dtype_convert's, bit for bit;
//   - at K3's expert widths (latent 3584, intermediate 3072, top-16), packed experts give exactly
//     the bits of the same experts held as BF16 (the kernels sum in one order for both), for
//     decode-sized and prefill-sized steps;
//   - a token's result does not depend on the other tokens of the step (row invariance: each row
//     of a decode step bit-identical to the row computed alone, at every batch size);
//   - the grouping by expert is the stable counting sort of the choices (a host one);
//   - the warp-per-token router gives the one-thread reference router's bits, ties included, and
//     the router's F32 GEMV keeps each row's bits alone or batched;
//   - against the CPU reference (F32, dequantized at load) within the op tests' tolerance.
// Outputs are poisoned with NaN first. In the CUDA build only (CMakeLists: backend/cuda/ tests).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cuda/cuda_backend.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"
#include "kimirt/testing/cuda_cpu_test.h"
#include "kimirt/testing/moe_experts_case.h"

namespace kimirt {
namespace {

uint32_t Bits(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

class CudaBackendMoe : public testing::CudaCpuTest {
 protected:
  void RandomChoice(int64_t T, int64_t E, int64_t k, Tensor* idx, Tensor* w) {
    testing::RandomMoeChoice(rng_, T, E, k, idx, w);
  }
  // The same experts three ways: MXFP4 codes + scales and BF16 on the GPU, F32 on the CPU.
  using Experts = testing::MoeExpertsCase;
  Experts RandomExperts(int64_t E, int64_t De, int64_t I) { return testing::RandomMoeExperts(*gpu_, rng_, E, De, I); }

  static void ExpectSameBits(const Tensor& got, const Tensor& want, const std::string& what) {
    ASSERT_EQ(got.numel(), want.numel());
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < want.numel(); ++i) {
      if (std::isnan(got.f32()[i]) || Bits(got.f32()[i]) != Bits(want.f32()[i])) {
        if (differ++ == 0) first = i;
      }
    }
    EXPECT_EQ(differ, 0) << what << ": " << differ << " elements differ, the first at " << first << " ("
                         << (first >= 0 ? got.f32()[first] : 0.0f) << " vs " << (first >= 0 ? want.f32()[first] : 0.0f)
                         << ")";
  }

  // Body of the TiledMxfp4Codes tests below: E experts of [I, De] and [De, I], top-k.
  void ExpectTiledMxfp4GivesRowMajorBits(int64_t E, int64_t De, int64_t I, int64_t k) {
    const Experts ex = RandomExperts(E, De, I);
    const GluParams situ{GluKind::kSitu, 4.0f, 25.0f};
    auto copy = [&](const Tensor& t) { return gpu_->Upload(gpu_->Download(t)); };
    auto copies = [&]() {
      ExpertWeights c;
      for (int64_t e = 0; e < E; ++e) {
        c.gate.push_back(copy(ex.packed.gate[e]));
        c.up.push_back(copy(ex.packed.up[e]));
        c.down.push_back(copy(ex.packed.down[e]));
        c.gate_scales.push_back(ex.packed.gate_scales[e]);
        c.up_scales.push_back(ex.packed.up_scales[e]);
        c.down_scales.push_back(ex.packed.down_scales[e]);
      }
      return c;
    };
    const auto moved = [&](const ExpertWeights& c) {
      const Tensor a = gpu_->Download(ex.packed.down[5]), b = gpu_->Download(c.down[5]);
      return std::memcmp(a.raw(), b.raw(), a.nbytes()) != 0;
    };
    const bool was = gpu_->bf16_prefill();
    gpu_->set_bf16_prefill(true);
    ExpertWeights off = copies();
    setenv("KIMIRT_MXFP4_TILED", "0", 1);
    gpu_->HoldExpertWeights(&off, nullptr, nullptr, nullptr);
    EXPECT_FALSE(moved(off)) << "tiled with KIMIRT_MXFP4_TILED=0";
    unsetenv("KIMIRT_MXFP4_TILED");
    ExpertWeights tiled = copies();
    gpu_->set_bf16_prefill(false);
    gpu_->HoldExpertWeights(&tiled, nullptr, nullptr, nullptr);
    EXPECT_FALSE(moved(tiled)) << "tiled with bf16_prefill off (the F32 grouped path reads row-major codes)";
    gpu_->set_bf16_prefill(true);
    gpu_->HoldExpertWeights(&tiled, nullptr, nullptr, nullptr);
    EXPECT_TRUE(moved(tiled)) << "the codes were not re-laid out";
    Tensor z_all = Random({100, De}), idx_all, w_all;
    RandomChoice(100, E, k, &idx_all, &w_all);
    ExpertWeights row_major = ex.packed;
    for (const bool light : {false, true}) {  // 8 tokens a tile, and part columns
      tiled.light_load = row_major.light_load = light;
      for (int64_t T : {int64_t{1}, int64_t{16}, gpu_->RowInvariantRows(), int64_t{100}}) {
        SCOPED_TRACE("T = " + std::to_string(T) + (light ? ", light load" : ""));
        const Tensor z = z_all.Rows(0, T), idx = idx_all.Rows(0, T), w = w_all.Rows(0, T);
        ExpectSameBits(RunMoeExperts(z, idx, w, tiled, situ), RunMoeExperts(z, idx, w, row_major, situ), "tiled codes");
      }
    }
    gpu_->set_bf16_prefill(was);
  }
};

TEST_F(CudaBackendMoe, DecodesEveryMxfp4CodeAsTheCpu) {
  // Every byte value (so every pair of E2M1 codes in both nibbles) under each scale: 2^-127
  // (subnormal products down to 0.5·2^-127), small, around 1, large, 2^127 (6·2^127 overflows
  // to inf, as on the CPU), and 255 (NaN).
  const std::vector<int> scale_codes = {0, 1, 2, 3, 8, 22, 23, 24, 64, 100, 119, 126, 127, 128,
                                        129, 140, 200, 250, 252, 253, 254, 255};
  const int64_t cols = 512;  // 256 bytes = 16 scale groups
  const int64_t rows = static_cast<int64_t>(scale_codes.size());
  std::vector<uint8_t> codes(static_cast<size_t>(rows * cols / 2)), scales(static_cast<size_t>(rows * cols / 32));
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t b = 0; b < cols / 2; ++b) codes[static_cast<size_t>(r * cols / 2 + b)] = static_cast<uint8_t>(b);
    for (int64_t g = 0; g < cols / 32; ++g) {
      scales[static_cast<size_t>(r * cols / 32 + g)] = static_cast<uint8_t>(scale_codes[static_cast<size_t>(r)]);
    }
  }
  const int64_t n = rows * cols;
  std::vector<float> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeMxfp4Row(codes.data() + r * cols / 2, scales.data() + r * cols / 32, cols, want.data() + r * cols);
  }
  uint8_t *d_codes = nullptr, *d_scales = nullptr;
  float* d_out = nullptr;
  ASSERT_EQ(cudaMalloc(&d_codes, codes.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_scales, scales.size()), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&d_out, static_cast<size_t>(n) * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_codes, codes.data(), codes.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(d_scales, scales.data(), scales.size(), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemset(d_out, 0xff, static_cast<size_t>(n) * sizeof(float)), cudaSuccess);  // NaN poison
  cuda::DequantizeMxfp4(d_codes, d_scales, n, d_out, nullptr);
  ASSERT_EQ(cudaMemcpy(got.data(), d_out, static_cast<size_t>(n) * sizeof(float), cudaMemcpyDeviceToHost),
            cudaSuccess);
  cudaFree(d_codes);
  cudaFree(d_scales);
  cudaFree(d_out);
  int subnormal = 0, infinite = 0, nan = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float w = want[static_cast<size_t>(i)], g = got[static_cast<size_t>(i)];
    if (std::isnan(w)) {
      ++nan;
      EXPECT_TRUE(std::isnan(g)) << "element " << i;
      continue;
    }
    subnormal += std::fpclassify(w) == FP_SUBNORMAL;
    infinite += std::isinf(w);
    ASSERT_EQ(Bits(g), Bits(w)) << "element " << i << " (code " << ((codes[static_cast<size_t>(i / 2)] >> (4 * (i % 2))) & 15)
                                << ", scale " << scale_codes[static_cast<size_t>(i / cols)] << "): " << g << " vs " << w;
  }
  // The reference covers what the test claims to: subnormal results, overflow and NaN scales.
  EXPECT_GT(subnormal, 0);
  EXPECT_GT(infinite, 0);
  EXPECT_EQ(nan, cols);
}

// K3's routed experts (routed_expert_hidden_size 3584, moe_intermediate_size 3072, top-16; 20 of
// the 896 experts here), SiTU with both betas as K3 configures them; held as K3's loader holds
// them (light_load: part columns in the decode) and not.
TEST_F(CudaBackendMoe, Mxfp4ExpertsGiveTheBitsOfBf16ExpertsAtK3Widths) {
  const int64_t E = 20, De = 3584, I = 3072, k = 16;
  EXPECT_TRUE(LightRoutedLoad(k, 896)) << "K3's 16 of 896";
  EXPECT_FALSE(LightRoutedLoad(8, 256)) << "Kimi-Linear-48B's 8 of 256";
  Experts ex = RandomExperts(E, De, I);
  const GluParams situ{GluKind::kSitu, 4.0f, 25.0f};
  Tensor z_all = Random({100, De}), idx_all, w_all;
  RandomChoice(100, E, k, &idx_all, &w_all);
  std::vector<Tensor> step64;  // each way's 64-token step: they must differ (the path changed)
  for (const bool light : {true, false}) {
    SCOPED_TRACE(light ? "light load (part columns)" : "8 tokens a tile");
    ex.packed.light_load = ex.bf16.light_load = light;
    constexpr int64_t kAlone = 12;  // the first rows of every step, each also computed alone
    Tensor alone = Tensor::Host({kAlone, De});
    for (int64_t t = 0; t < kAlone; ++t) {
      Tensor row = RunMoeExperts(z_all.Rows(t, 1), idx_all.Rows(t, 1), w_all.Rows(t, 1), ex.packed, situ);
      std::memcpy(alone.f32() + t * De, row.f32(), static_cast<size_t>(De) * sizeof(float));
    }
    for (int64_t T : {1, 7, 40, 64, 100}) {
      SCOPED_TRACE("T = " + std::to_string(T));
      const Tensor z = z_all.Rows(0, T), idx = idx_all.Rows(0, T), w = w_all.Rows(0, T);
      const Tensor packed = RunMoeExperts(z, idx, w, ex.packed, situ);
      ExpectSameBits(packed, RunMoeExperts(z, idx, w, ex.bf16, situ), "MXFP4 vs BF16-held");
      // Row invariance: each token as computed alone, over the range the backend promises it
      // (RowInvariantRows: decode steps; more tokens take the prefill path).
      if (T <= gpu_->RowInvariantRows()) {
        const int64_t rows = std::min<int64_t>(T, kAlone);
        ExpectSameBits(packed.Rows(0, rows), alone.Rows(0, rows), "each row vs the row alone");
      }
      if (T == 7) {
        Tensor want = cpu_->Empty({T, De});
        cpu_->MoeExperts(z, idx, w, ex.f32, situ, &want);
        EXPECT_LE(RelL2(packed, want), 1e-5) << "against the CPU reference";
      }
      if (T == 64) step64.push_back(packed);
    }
  }
  ASSERT_EQ(step64.size(), 2u);
  EXPECT_NE(std::memcmp(step64[0].raw(), step64[1].raw(), step64[0].nbytes()), 0)
      << "light_load changed no bit: the part-column kernels did not run";
}

// The decode's token tiles follow the routed load (MoeDecodeTokenTiles): K3's 16 of 896 and
// Kimi-Linear's 8 of 256 take one tile up to 64 tokens; a few experts take T's count, never more.
TEST(MoeDecodeTokenTiles, FollowTheRoutedLoadUpToTsCount) {
  for (int64_t T : {1, 8, 9, 16, 17, 32, 64}) {
    const int by_t = T <= 8 ? 1 : T <= 16 ? 2 : 4;
    EXPECT_EQ(cuda::MoeDecodeTokenTiles(T, 16, 0, false), by_t) << T;
    EXPECT_EQ(cuda::MoeDecodeTokenTiles(T, 16, 896, false), 1) << T;
    EXPECT_EQ(cuda::MoeDecodeTokenTiles(T, 8, 256, false), 1) << T;
    EXPECT_EQ(cuda::MoeDecodeTokenTiles(T, 2, 4, false), by_t) << T;  // mean T / 2: 4x it needs T's count
  }
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(64, 8, 64, false), 4);  // mean 8 tokens: 4x is 4 tiles
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(64, 8, 128, false), 2);  // mean 4: 2 tiles
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(12, 8, 16, false), 2);  // 3 tiles wanted, T's count is 2
}

// Part columns: tiles of 2 tokens, enough for the mean group, T's count at most.
TEST(MoeDecodeTokenTiles, PartColumnsTakeTilesOfTwoForTheMeanGroup) {
  for (int64_t T : {1, 2, 3, 4, 5, 64}) {
    EXPECT_EQ(cuda::MoeDecodeTokenTiles(T, 16, 0, true), T <= 2 ? 1 : T <= 4 ? 2 : 4) << T;
    EXPECT_EQ(cuda::MoeDecodeTokenTiles(T, 16, 896, true), 1) << T;  // K3: a mean of 1.14 tokens at 64
  }
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(64, 8, 256, true), 1);  // mean 2 tokens: one tile
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(64, 8, 128, true), 2);  // mean 4: 2 tiles
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(64, 8, 32, true), 4);   // mean 16: 8 tiles wanted, 4 at most
  EXPECT_EQ(cuda::MoeDecodeTokenTiles(3, 8, 4, true), 2);     // mean 6: 3 wanted, T's count is 2
}

// MXFP4 codes tiled for the decode kernel (CudaBackend::TileMxfp4Experts, mxfp4_tiled.cuh; the
// default) give the row-major codes' bits at K3's widths: decode steps (1, 16, 64 tokens) and a
// prefill-sized one (100: the mma.sync prefill tile reading tiled codes). The bytes moved; with
// KIMIRT_MXFP4_TILED=0, or with bf16_prefill off, nothing is tiled.
TEST_F(CudaBackendMoe, TiledMxfp4CodesGiveTheRowMajorBits) { ExpectTiledMxfp4GivesRowMajorBits(20, 3584, 3072, 16); }

// The same at small widths (slices of two and three rounds, groups of several tokens): quick
// enough for compute-sanitizer (gpu_check.sh moesan), with the MoE trial switches on.
TEST_F(CudaBackendMoe, TiledMxfp4CodesAtSmallWidthsGiveTheRowMajorBits) { ExpectTiledMxfp4GivesRowMajorBits(6, 256, 384, 2); }

// Awkward sizes: one expert chosen by every token (a group of many tiles), SiLU, widths of a
// few scale groups, many more tokens than one tile; against the CPU reference and bit-equal to
// BF16-held.
TEST_F(CudaBackendMoe, Mxfp4ExpertsSmallWidthsAgainstTheCpu) {
  const int64_t E = 9, De = 96, I = 64, k = 3, T = 70;
  const Experts ex = RandomExperts(E, De, I);
  const GluParams silu{GluKind::kSilu, 1.0f, std::nullopt};
  Tensor z = Random({T, De}), idx, w;
  RandomChoice(T, E, k, &idx, &w);
  for (int64_t t = 0; t < T; ++t) idx.i32()[t * k] = 4;  // expert 4 in every token's first slot
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 1; j < k; ++j) {
      if (idx.i32()[t * k + j] == 4) idx.i32()[t * k + j] = static_cast<int32_t>(E - 1 - j);
    }
  }
  const Tensor packed = RunMoeExperts(z, idx, w, ex.packed, silu);
  ExpectSameBits(packed, RunMoeExperts(z, idx, w, ex.bf16, silu), "MXFP4 vs BF16-held");
  Tensor want = cpu_->Empty({T, De});
  cpu_->MoeExperts(z, idx, w, ex.f32, silu, &want);
  EXPECT_LE(RelL2(packed, want), 1e-5);
}

// The decode path (up to RowInvariantRows tokens) with experts shared by many tokens, so an
// expert's tokens fill several MMA column tiles and a token's column changes with the batch:
// at every batch size each token's row is bit-identical to the token alone, MXFP4 equals
// BF16-held bit for bit, and both match the CPU. Two width sets: Kimi-Linear-48B's (2304 × 1024,
// whose k is split across blocks, so the slice sums are covered) and odd small widths (96 × 160:
// not multiples of 128, so the byte-wise scale loads and a partial last round).
TEST_F(CudaBackendMoe, DecodeExpertsGiveEachTokenItsBitsAloneAtEveryBatchSize) {
  const GluParams silu{GluKind::kSilu, 1.0f, std::nullopt};
  const GluParams situ{GluKind::kSitu, 4.0f, 25.0f};
  struct Widths {
    int64_t E, De, I, k;
  };
  for (const Widths& wd : {Widths{12, 2304, 1024, 8}, Widths{10, 96, 160, 4}}) {
    SCOPED_TRACE("De = " + std::to_string(wd.De) + ", I = " + std::to_string(wd.I));
    if (wd.De == 2304) {
      EXPECT_GT(cuda::MoeDecodeSplits(wd.De, wd.I, wd.k, true), 1) << "the k split is what this width set covers";
      EXPECT_GT(cuda::MoeDecodeSplits(wd.De, wd.I, wd.k, false), 1);
    }
    Experts ex = RandomExperts(wd.E, wd.De, wd.I);
    const int64_t max_t = gpu_->RowInvariantRows();
    Tensor z_all = Random({max_t, wd.De}), idx_all, w_all;
    RandomChoice(max_t, wd.E, wd.k, &idx_all, &w_all);
    for (const GluParams& glu : {silu, situ}) {
      // SiLU with 8 tokens a tile, SiTU with part columns (ExpertWeights::light_load).
      ex.packed.light_load = ex.bf16.light_load = glu.kind == GluKind::kSitu;
      // Every third token (and the last) also alone: they sit in every tile and column position
      // across the batch sizes below, at a third of the runs (the suite also runs under memcheck).
      std::vector<int64_t> sampled;
      std::vector<Tensor> alone;
      for (int64_t t = 0; t < max_t; ++t) {
        if (t % 3 != 0 && t != max_t - 1) continue;
        sampled.push_back(t);
        alone.push_back(RunMoeExperts(z_all.Rows(t, 1), idx_all.Rows(t, 1), w_all.Rows(t, 1), ex.packed, glu));
      }
      for (int64_t T : {int64_t{2}, int64_t{8}, int64_t{9}, int64_t{16}, int64_t{17}, int64_t{33}, max_t}) {
        SCOPED_TRACE("T = " + std::to_string(T));
        const Tensor z = z_all.Rows(0, T), idx = idx_all.Rows(0, T), w = w_all.Rows(0, T);
        const Tensor packed = RunMoeExperts(z, idx, w, ex.packed, glu);
        ExpectSameBits(packed, RunMoeExperts(z, idx, w, ex.bf16, glu), "MXFP4 vs BF16-held");
        for (size_t i = 0; i < sampled.size() && sampled[i] < T; ++i) {
          ExpectSameBits(packed.Rows(sampled[i], 1), alone[i], "row " + std::to_string(sampled[i]) + " vs alone");
        }
        if (T == 9 || T == max_t) {
          Tensor want = cpu_->Empty({T, wd.De});
          cpu_->MoeExperts(z, idx, w, ex.f32, glu, &want);
          EXPECT_LE(RelL2(packed, want), 1e-5) << "against the CPU reference";
        }
      }
    }
  }
}

// The shared expert as expert E (Backend::MoeSharedAsExpert, RunMoe): offered for BF16 decode
// steps whose shared MLP has the experts' widths, never for MXFP4 experts or past the decode
// range; MoeExpertsWithShared gives the bits of MoeExperts over an explicit list of E + 1
// experts whose last is the shared one, each token's row is its bits alone, and against the CPU
// (the routed experts plus the shared MLP, spec §7.2 steps 3-8) it is within F32 summation error.
// Kimi-Linear-48B's widths (k split across blocks) and odd small ones (a partial last round).
TEST_F(CudaBackendMoe, SharedExpertAsExpertEGivesTheExplicitListsBits) {
  const GluParams silu{GluKind::kSilu, 1.0f, std::nullopt};
  struct Widths {
    int64_t E, De, I, k;
  };
  for (const Widths& wd : {Widths{12, 2304, 1024, 8}, Widths{10, 96, 160, 4}}) {
    SCOPED_TRACE("De = " + std::to_string(wd.De) + ", I = " + std::to_string(wd.I));
    const Experts all = RandomExperts(wd.E + 1, wd.De, wd.I);  // the last: the shared expert
    ExpertWeights routed, packed;
    for (int64_t e = 0; e < wd.E; ++e) {
      routed.gate.push_back(all.bf16.gate[e]);
      routed.up.push_back(all.bf16.up[e]);
      routed.down.push_back(all.bf16.down[e]);
      packed.gate.push_back(all.packed.gate[e]);
      packed.up.push_back(all.packed.up[e]);
      packed.down.push_back(all.packed.down[e]);
      packed.gate_scales.push_back(all.packed.gate_scales[e]);
      packed.up_scales.push_back(all.packed.up_scales[e]);
      packed.down_scales.push_back(all.packed.down_scales[e]);
    }
    const MlpTensors shared{all.bf16.gate[wd.E], all.bf16.up[wd.E], all.bf16.down[wd.E]};
    const int64_t max_t = gpu_->RowInvariantRows();
    EXPECT_TRUE(gpu_->MoeSharedAsExpert(routed, shared, 1));
    EXPECT_TRUE(gpu_->MoeSharedAsExpert(routed, shared, max_t));
    EXPECT_FALSE(gpu_->MoeSharedAsExpert(routed, shared, max_t + 1)) << "past the decode range";
    EXPECT_FALSE(gpu_->MoeSharedAsExpert(packed, shared, 1)) << "MXFP4 routed experts";
    EXPECT_FALSE(cpu_->MoeSharedAsExpert(routed, shared, 1)) << "the CPU keeps the dense MLP";
    // Each token's k routed choices, then expert E with weight 1 (MoeRoute's append_expert).
    Tensor z_all = Random({max_t, wd.De}), idx_k, w_k;
    RandomChoice(max_t, wd.E, wd.k, &idx_k, &w_k);
    const int64_t ks = wd.k + 1;
    Tensor idx_all = Tensor::Host({max_t, ks}, DType::kI32), w_all = Tensor::Host({max_t, ks});
    for (int64_t t = 0; t < max_t; ++t) {
      for (int64_t j = 0; j < wd.k; ++j) {
        idx_all.i32()[t * ks + j] = idx_k.i32()[t * wd.k + j];
        w_all.f32()[t * ks + j] = w_k.f32()[t * wd.k + j];
      }
      idx_all.i32()[t * ks + wd.k] = static_cast<int32_t>(wd.E);
      w_all.f32()[t * ks + wd.k] = 1.0f;
    }
    const auto fused = [&](const Tensor& z, const Tensor& idx, const Tensor& w) {
      Tensor out = Poisoned({z.dim(0), wd.De});
      gpu_->MoeExpertsWithShared(gpu_->Upload(z), gpu_->Upload(idx), gpu_->Upload(w), routed, shared, silu, &out);
      return gpu_->Download(out);
    };
    const Tensor last_alone = fused(z_all.Rows(max_t - 1, 1), idx_all.Rows(max_t - 1, 1), w_all.Rows(max_t - 1, 1));
    const Tensor first_alone = fused(z_all.Rows(0, 1), idx_all.Rows(0, 1), w_all.Rows(0, 1));
    for (int64_t T : {int64_t{1}, int64_t{9}, max_t}) {
      SCOPED_TRACE("T = " + std::to_string(T));
      const Tensor z = z_all.Rows(0, T), idx = idx_all.Rows(0, T), w = w_all.Rows(0, T);
      const Tensor got = fused(z, idx, w);
      ExpectSameBits(got, RunMoeExperts(z, idx, w, all.bf16, silu), "with shared vs the explicit E + 1 list");
      ExpectSameBits(got.Rows(0, 1), first_alone, "row 0 vs alone");
      if (T == max_t) ExpectSameBits(got.Rows(T - 1, 1), last_alone, "the last row vs alone");
      Tensor want = cpu_->Empty({T, wd.De});
      cpu_->MoeExperts(z, idx, w, all.f32, silu, &want);
      EXPECT_LE(RelL2(got, want), 1e-5) << "against the CPU's routed experts plus shared MLP";
    }
  }
}

// Experts held decode-tiled (Backend::HoldExpertWeights: the routed experts and the shared one
// together) give the row-major experts' bits: decode steps (1, 9, 64 tokens), with the shared
// expert as expert E, and a prefill-sized step (100 tokens, bf16_prefill: the wgmma prefill
// kernels), at Kimi-Linear-48B's expert widths. The bytes moved; a row-major shared expert is not
// run as expert E of tiled experts.
TEST_F(CudaBackendMoe, TiledExpertsGiveTheRowMajorBits) {
  const GluParams silu{GluKind::kSilu, 1.0f, std::nullopt};
  const int64_t E = 12, De = 2304, I = 1024, k = 8;
  const Experts all = RandomExperts(E + 1, De, I);  // the last: the shared expert
  auto copy = [&](const Tensor& t) { return gpu_->Upload(gpu_->Download(t)); };
  ExpertWeights routed, tiled;
  for (int64_t e = 0; e < E; ++e) {
    for (auto [from, to, mine] : {std::tuple{&all.bf16.gate, &tiled.gate, &routed.gate},
                                  std::tuple{&all.bf16.up, &tiled.up, &routed.up},
                                  std::tuple{&all.bf16.down, &tiled.down, &routed.down}}) {
      mine->push_back((*from)[static_cast<size_t>(e)]);
      to->push_back(copy((*from)[static_cast<size_t>(e)]));
    }
  }
  Tensor sg = copy(all.bf16.gate[E]), su = copy(all.bf16.up[E]), sd = copy(all.bf16.down[E]);
  gpu_->HoldExpertWeights(&tiled, &sg, &su, &sd);
  const Tensor a = gpu_->Download(all.bf16.down[3]), b = gpu_->Download(tiled.down[3]);
  EXPECT_NE(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << "the experts were not re-laid out";
  const Tensor c = gpu_->Download(all.bf16.up[E]), d = gpu_->Download(su);
  EXPECT_NE(std::memcmp(c.raw(), d.raw(), c.nbytes()), 0) << "the shared expert was not re-laid out";
  const MlpTensors shared_rm{all.bf16.gate[E], all.bf16.up[E], all.bf16.down[E]}, shared_tiled{sg, su, sd};
  EXPECT_TRUE(gpu_->MoeSharedAsExpert(tiled, shared_tiled, 1));
  EXPECT_FALSE(gpu_->MoeSharedAsExpert(tiled, shared_rm, 1)) << "one layout across the table";

  const int64_t max_t = gpu_->RowInvariantRows();
  Tensor z_all = Random({100, De}), idx_k, w_k;
  RandomChoice(100, E, k, &idx_k, &w_k);
  const bool was = gpu_->bf16_prefill();
  gpu_->set_bf16_prefill(true);
  for (int64_t T : {int64_t{1}, int64_t{9}, max_t, int64_t{100}}) {
    SCOPED_TRACE("T = " + std::to_string(T));
    const Tensor z = z_all.Rows(0, T), idx = idx_k.Rows(0, T), w = w_k.Rows(0, T);
    ExpectSameBits(RunMoeExperts(z, idx, w, tiled, silu), RunMoeExperts(z, idx, w, routed, silu), "routed experts");
  }
  // The shared expert as expert E (each token's choices, then E with weight 1).
  const int64_t ks = k + 1;
  Tensor idx_all = Tensor::Host({max_t, ks}, DType::kI32), w_all = Tensor::Host({max_t, ks});
  for (int64_t t = 0; t < max_t; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      idx_all.i32()[t * ks + j] = idx_k.i32()[t * k + j];
      w_all.f32()[t * ks + j] = w_k.f32()[t * k + j];
    }
    idx_all.i32()[t * ks + k] = static_cast<int32_t>(E);
    w_all.f32()[t * ks + k] = 1.0f;
  }
  const auto with_shared = [&](const ExpertWeights& ex, const MlpTensors& sh, int64_t T) {
    Tensor out = Poisoned({T, De});
    gpu_->MoeExpertsWithShared(gpu_->Upload(z_all.Rows(0, T)), gpu_->Upload(idx_all.Rows(0, T)),
                               gpu_->Upload(w_all.Rows(0, T)), ex, sh, silu, &out);
    return gpu_->Download(out);
  };
  for (int64_t T : {int64_t{1}, max_t}) {
    SCOPED_TRACE("with the shared expert, T = " + std::to_string(T));
    ExpectSameBits(with_shared(tiled, shared_tiled, T), with_shared(routed, shared_rm, T), "routed + shared");
  }
  gpu_->set_bf16_prefill(was);
}

// The decode step's route chain in one launch (the CUDA MoeRouteExpertsWithShared:
// cuda::MoeRouteGroupSplit's top-k, grouping and split of y) gives the bits of the Backend's two
// calls, MoeRoute then MoeExpertsWithShared: at Kimi-Linear-48B's expert count with small widths,
// logits on a coarse grid (exact sums, so many choice values tie), and at its widths with few
// experts; 1, 9 and 64 tokens (more than the fused kernel's 16 routing warps); both combine rules.
TEST_F(CudaBackendMoe, FusedRouteChainGivesTheTwoCallsBits) {
  const GluParams silu{GluKind::kSilu, 1.0f, std::nullopt};
  struct Widths {
    int64_t E, De, I, k;
    bool coarse;
  };
  for (const Widths& wd : {Widths{256, 64, 96, 8, true}, Widths{12, 2304, 1024, 8, false}}) {
    SCOPED_TRACE("E = " + std::to_string(wd.E) + ", De = " + std::to_string(wd.De));
    const Experts all = RandomExperts(wd.E + 1, wd.De, wd.I);  // the last: the shared expert
    ExpertWeights routed;
    for (int64_t e = 0; e < wd.E; ++e) {
      routed.gate.push_back(all.bf16.gate[e]);
      routed.up.push_back(all.bf16.up[e]);
      routed.down.push_back(all.bf16.down[e]);
    }
    const MlpTensors shared{all.bf16.gate[wd.E], all.bf16.up[wd.E], all.bf16.down[wd.E]};
    const int64_t max_t = gpu_->RowInvariantRows();
    Tensor y = Random({max_t, wd.De}), router = Random({wd.E, wd.De}, 0.02f), bias = Random({wd.E}, 0.01f);
    if (wd.coarse) {
      for (int64_t i = 0; i < y.numel(); ++i) y.f32()[i] = static_cast<float>(rng_.Next() % 3) - 1.0f;
      for (int64_t i = 0; i < router.numel(); ++i) router.f32()[i] = static_cast<float>(rng_.Next() % 5) / 8.0f - 0.25f;
      for (int64_t i = 0; i < wd.E; ++i) bias.f32()[i] = static_cast<float>(rng_.Next() % 3) / 16.0f;
    }
    const Tensor d_router = gpu_->Upload(router), d_bias = gpu_->Upload(bias);
    ASSERT_TRUE(gpu_->MoeSharedAsExpert(routed, shared, max_t));
    ASSERT_TRUE(cuda::MoeRouteGroupSplitSupported(max_t, wd.E, wd.k, wd.E + 1)) << "the fused path runs";
    for (const bool combine_biased : {false, true}) {
      RouteParams rp;
      rp.top_k = wd.k;
      rp.scaling = 2.446f;
      rp.combine_biased = combine_biased;
      rp.append_expert = static_cast<int32_t>(wd.E);
      for (const int64_t T : {int64_t{1}, int64_t{9}, max_t}) {
        SCOPED_TRACE("T = " + std::to_string(T) + (combine_biased ? ", biased combine" : ""));
        const Tensor d_y = gpu_->Upload(y.Rows(0, T));
        Tensor fused = Poisoned({T, wd.De}), calls = Poisoned({T, wd.De});
        const uint64_t launches = cuda::MoeRouteGroupSplitLaunches();
        gpu_->MoeRouteExpertsWithShared(d_y, d_router, d_bias, rp, routed, shared, silu, &fused);
        EXPECT_EQ(cuda::MoeRouteGroupSplitLaunches(), launches + 1) << "the fused path ran";
        gpu_->Backend::MoeRouteExpertsWithShared(d_y, d_router, d_bias, rp, routed, shared, silu, &calls);
        EXPECT_EQ(cuda::MoeRouteGroupSplitLaunches(), launches + 1) << "the two calls launch no fused chain";
        ExpectSameBits(gpu_->Download(fused), gpu_->Download(calls), "one launch vs MoeRoute + MoeExpertsWithShared");
      }
    }
  }
}

// The warp-per-token router gives the one-thread reference kernel's indices and weights bit
// for bit, at K3's and Kimi-Linear's expert counts and a count that fills every lane's 32
// experts, with logits and biases on a coarse grid so that many choice values tie exactly (the
// tie rule: the lower expert id first), for both combine rules and with and without
// renormalization.
TEST_F(CudaBackendMoe, RouterWarpKernelGivesTheSerialKernelsBits) {
  struct Case {
    int64_t E, k;
  };
  const int64_t T = 64;
  for (const Case& c : {Case{256, 8}, Case{896, 16}, Case{1024, 16}, Case{70, 64}}) {
    SCOPED_TRACE("E = " + std::to_string(c.E) + ", k = " + std::to_string(c.k));
    Tensor logits = Tensor::Host({T, c.E}), bias = Tensor::Host({c.E});
    for (int64_t i = 0; i < logits.numel(); ++i) logits.f32()[i] = static_cast<float>(rng_.Next() % 33) / 8.0f - 2.0f;
    for (int64_t i = 0; i < c.E; ++i) bias.f32()[i] = static_cast<float>(rng_.Next() % 3) / 16.0f;
    const Tensor d_logits = gpu_->Upload(logits), d_bias = gpu_->Upload(bias);
    // append: the shared expert as expert E after every token's k (RouteParams::append_expert):
    // rows of k + 1, the first k the plain call's bits, the last (E, 1).
    Tensor plain_idx, plain_w;
    for (bool combine_biased : {false, true}) {
      for (bool renormalize : {true, false}) {
        for (int32_t append : {-1, static_cast<int32_t>(c.E)}) {
          const int64_t ks = append >= 0 ? c.k + 1 : c.k;
          Tensor idx[2] = {gpu_->Empty({T, ks}, DType::kI32), gpu_->Empty({T, ks}, DType::kI32)};
          Tensor w[2] = {Poisoned({T, ks}), Poisoned({T, ks})};
          const auto* lp = static_cast<const float*>(d_logits.raw());
          const auto* bp = static_cast<const float*>(d_bias.raw());
          // The kernels run on the default stream; the uploads and poison went on the backend's own
          // (non-blocking) stream: wait for them.
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          cuda::MoeRoute(lp, bp, T, c.E, c.k, renormalize, 2.5f, combine_biased, append,
                         static_cast<int32_t*>(idx[0].raw()), static_cast<float*>(w[0].raw()), nullptr);
          cuda::MoeRouteSerial(lp, bp, T, c.E, c.k, renormalize, 2.5f, combine_biased, append,
                               static_cast<int32_t*>(idx[1].raw()), static_cast<float*>(w[1].raw()), nullptr);
          ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
          const Tensor got_idx = gpu_->Download(idx[0]), want_idx = gpu_->Download(idx[1]);
          const Tensor got_w = gpu_->Download(w[0]);
          for (int64_t i = 0; i < T * ks; ++i) ASSERT_EQ(got_idx.i32()[i], want_idx.i32()[i]) << "slot " << i;
          ExpectSameBits(got_w, gpu_->Download(w[1]), "combine weights");
          if (append < 0) {
            plain_idx = got_idx;
            plain_w = got_w;
            continue;
          }
          for (int64_t t = 0; t < T; ++t) {
            for (int64_t j = 0; j < c.k; ++j) {
              ASSERT_EQ(got_idx.i32()[t * ks + j], plain_idx.i32()[t * c.k + j]) << "token " << t << " slot " << j;
              ASSERT_EQ(Bits(got_w.f32()[t * ks + j]), Bits(plain_w.f32()[t * c.k + j])) << "token " << t << " slot " << j;
            }
            ASSERT_EQ(got_idx.i32()[t * ks + c.k], append) << "token " << t;
            ASSERT_EQ(got_w.f32()[t * ks + c.k], 1.0f) << "token " << t;
          }
        }
      }
    }
  }
}

// The router's F32 GEMV at K3's widths (896 experts × 7168): each row of a decode batch
// bit-identical to the row alone, and the CPU's logits within F32 summation error.
TEST_F(CudaBackendMoe, RouterGemvRowsAreBitIdenticalToAloneAtK3Widths) {
  const int64_t E = 896, D = 7168, T = gpu_->RowInvariantRows();
  const Tensor x = Random({T, D}), w = Random({E, D}, 0.02f);
  const Tensor d_w = gpu_->Upload(w);
  Tensor all = Poisoned({T, E});
  gpu_->Linear(gpu_->Upload(x), d_w, &all);
  const Tensor got = gpu_->Download(all);
  for (int64_t t = 0; t < T; t += 9) {
    Tensor one = Poisoned({1, E});
    gpu_->Linear(gpu_->Upload(x.Rows(t, 1)), d_w, &one);
    ExpectSameBits(got.Rows(t, 1), gpu_->Download(one), "row " + std::to_string(t) + " vs alone");
  }
  Tensor want = cpu_->Empty({T, E});
  cpu_->Linear(x, w, &want);
  EXPECT_LE(RelL2(got, want), 1e-5);
}

// The router held as stored (Backend::RouterAsStored: BF16, the checkpoint's dtype) against the
// same values widened to F32 at load, as the CPU holds it: MoeRoute's indices and weights bit for
// bit, decode rows (the Gemv's BF16 slots) and prefill rows (widened, then the SGEMM the F32
// router gets), at K3's and Kimi-Linear's widths.
TEST_F(CudaBackendMoe, Bf16RouterGivesTheF32RoutersChoices) {
  ASSERT_TRUE(gpu_->RouterAsStored());
  ASSERT_FALSE(cpu_->RouterAsStored());
  struct Case {
    int64_t E, D, k;
  };
  for (const Case& c : {Case{896, 7168, 16}, Case{256, 2304, 8}}) {
    Tensor router = Random({c.E, c.D}, 0.02f);
    const Tensor d_router16 = UpBf16(router);  // router now holds the BF16 values
    const Tensor d_router32 = gpu_->Upload(router), d_bias = gpu_->Upload(Random({c.E}, 0.01f));
    ASSERT_EQ(d_router16.dtype(), DType::kBF16);
    RouteParams rp;
    rp.top_k = c.k;
    rp.scaling = 2.446f;
    for (const int64_t T : {int64_t{1}, int64_t{7}, gpu_->RowInvariantRows(), int64_t{100}}) {
      SCOPED_TRACE("E = " + std::to_string(c.E) + ", T = " + std::to_string(T));
      const Tensor d_y = gpu_->Upload(Random({T, c.D}));
      Tensor idx[2] = {gpu_->Empty({T, c.k}, DType::kI32), gpu_->Empty({T, c.k}, DType::kI32)};
      Tensor w[2] = {Poisoned({T, c.k}), Poisoned({T, c.k})};
      gpu_->MoeRoute(d_y, d_router16, d_bias, rp, &idx[0], &w[0]);
      gpu_->MoeRoute(d_y, d_router32, d_bias, rp, &idx[1], &w[1]);
      const Tensor i16 = gpu_->Download(idx[0]), i32 = gpu_->Download(idx[1]);
      EXPECT_EQ(std::memcmp(i16.raw(), i32.raw(), static_cast<size_t>(T * c.k) * sizeof(int32_t)), 0)
          << "indices, BF16 vs F32 router";
      ExpectSameBits(gpu_->Download(w[0]), gpu_->Download(w[1]), "weights, BF16 vs F32 router");
    }
  }
}

// MoeGroupByExpert against a host stable counting sort, every output array exactly: a 2,048-token
// prefill chunk's choices (top-8 of 256, the placement split over warps in runs), K3's top-16 of
// 896 plus the shared expert, decode-sized calls (runs shorter than a warp, some empty), one
// choice. The choices are skewed so that some experts take none and runs share experts.
TEST_F(CudaBackendMoe, GroupingIsTheStableCountingSort) {
  struct Case {
    int64_t n, E;
  };
  auto* stream = static_cast<cudaStream_t>(CudaBackendStream(*gpu_));
  for (const Case& c : {Case{16384, 256}, Case{2048 * 17, 897}, Case{7, 256}, Case{577, 897}, Case{1, 5}, Case{32, 257},
                        Case{33, 257}, Case{9, 897}}) {
    SCOPED_TRACE("n = " + std::to_string(c.n) + ", E = " + std::to_string(c.E));
    Tensor idx = Tensor::Host({c.n}, DType::kI32);
    for (int64_t s = 0; s < c.n; ++s) {
      const uint64_t r = rng_.Next();
      idx.i32()[s] = static_cast<int32_t>(r % 4 == 0 ? r / 4 % c.E : r / 4 % std::max<int64_t>(1, c.E / 3));
    }
    const int64_t a = std::min(c.E, c.n);
    const Tensor d_idx = gpu_->Upload(idx);
    Tensor order = gpu_->Empty({c.n}, DType::kI32), pos = gpu_->Empty({c.n}, DType::kI32);
    Tensor active = gpu_->Empty({a}, DType::kI32), begin = gpu_->Empty({a + 1}, DType::kI32);
    Tensor num = gpu_->Empty({1}, DType::kI32);
    const auto ints = [](Tensor& t) { return static_cast<int32_t*>(t.raw()); };
    cuda::ExpertGroups g{ints(order), ints(pos), ints(active), ints(begin), ints(num)};
    cuda::MoeGroupByExpert(static_cast<const int32_t*>(d_idx.raw()), c.n, c.E, g, stream);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<int32_t> want_order(static_cast<size_t>(c.n)), want_pos(static_cast<size_t>(c.n)), want_active,
        want_begin;
    std::iota(want_order.begin(), want_order.end(), 0);
    std::stable_sort(want_order.begin(), want_order.end(),
                     [&](int32_t x, int32_t y) { return idx.i32()[x] < idx.i32()[y]; });
    for (int64_t i = 0; i < c.n; ++i) {
      want_pos[static_cast<size_t>(want_order[static_cast<size_t>(i)])] = static_cast<int32_t>(i);
      const int32_t e = idx.i32()[want_order[static_cast<size_t>(i)]];
      if (want_active.empty() || want_active.back() != e) {
        want_active.push_back(e);
        want_begin.push_back(static_cast<int32_t>(i));
      }
    }
    want_begin.push_back(static_cast<int32_t>(c.n));
    const Tensor h_order = gpu_->Download(order), h_pos = gpu_->Download(pos), h_active = gpu_->Download(active),
                 h_begin = gpu_->Download(begin), h_num = gpu_->Download(num);
    const auto list = [](const Tensor& t, int64_t n) { return std::vector<int32_t>(t.i32(), t.i32() + n); };
    ASSERT_EQ(h_num.i32()[0], static_cast<int32_t>(want_active.size()));
    EXPECT_EQ(list(h_order, c.n), want_order);
    EXPECT_EQ(list(h_pos, c.n), want_pos);
    EXPECT_EQ(list(h_active, h_num.i32()[0]), want_active);
    EXPECT_EQ(list(h_begin, h_num.i32()[0] + 1), want_begin);
  }
}

}  // namespace
}  // namespace kimirt
