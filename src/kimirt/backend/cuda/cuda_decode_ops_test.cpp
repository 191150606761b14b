// The batched decode ops on CUDA against the CPU reference. KDA: Backend::KdaDecode over a
// slot pool (slots out of order, the others untouched). MLA: the CUDA storage's batched paged decode (backend.h KvStorage::SetDecodeStep, WriteDecode,
// AttendDecode; cuda/mla_kernels.cu MlaPagedDecode) against the CPU reference, at K3's widths
// (latent 512 + 64, head dims 128; 12 heads = K3's 96 at TP 8, and Kimi-Linear's 32), over
// contexts from 1 to 32K (one split to the most splits), the three cache dtypes, several
// sequences whose block tables interleave in the pool, outputs poisoned with NaN first.
// Tolerance: relative L2 2e-5 (both FP32; the GPU sums in splits and tiles, the CPU in one pass).
// Batch invariance: every row equals its sequence decoded alone, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"
#include "kimirt/testing/paged_decode_case.h"

namespace kimirt {
namespace {

class CudaBackendDecodeOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto g = MakeBackend("cuda");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    gpu_ = std::move(g).value();
    cpu_ = std::move(MakeBackend("cpu")).value();
  }

  Tensor Poisoned(Shape shape) {
    Tensor h = Tensor::Host(std::move(shape));
    for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = std::nanf("");
    return gpu_->Upload(h);
  }

  static double RelL2(const float* got, const float* want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (std::isnan(got[i]) != std::isnan(want[i])) return INFINITY;
      num += (double{got[i]} - want[i]) * (double{got[i]} - want[i]);
      den += double{want[i]} * want[i];
    }
    return std::sqrt(num / std::max(den, 1e-30));
  }

  // Runs `c` on both backends (kv_b held as BF16 on the GPU when `bf16_weights`; the CPU then
  // gets the rounded values) and checks the GPU against the CPU, row by row, and each row
  // against its sequence alone.
  void Check(testing::PagedDecodeCase c, bool bf16_weights) {
    const int layer = 1;
    Tensor gpu_w;
    if (bf16_weights) {
      Tensor b = Tensor::Host(c.w_kvb.shape(), DType::kBF16);
      F32ToBf16(c.w_kvb.f32(), static_cast<uint16_t*>(b.raw()), static_cast<size_t>(c.w_kvb.numel()));
      Bf16ToF32(static_cast<const uint16_t*>(b.raw()), c.w_kvb.f32(), static_cast<size_t>(c.w_kvb.numel()));
      gpu_w = gpu_->Upload(b);
    } else {
      gpu_w = gpu_->Upload(c.w_kvb);
    }
    auto cpu_kv = testing::FillPagedDecodeStorage(*cpu_, c, layer);
    auto gpu_kv = testing::FillPagedDecodeStorage(*gpu_, c, layer);
    const int64_t B = c.step.size(), width = c.mla.heads * c.mla.v_dim;
    // WriteDecode stored the CPU's codes (read back through Gather on both).
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = c.step.context[static_cast<size_t>(b)];
      Tensor cc = cpu_->Empty({len, c.kv.latent_dim}), cks = cpu_->Empty({len, c.kv.rope_dim});
      Tensor gc = gpu_->Empty({len, c.kv.latent_dim}), gks = gpu_->Empty({len, c.kv.rope_dim});
      cpu_kv->Gather(layer, c.step.table(b), len, &cc, &cks);
      gpu_kv->Gather(layer, c.step.table(b), len, &gc, &gks);
      Tensor hc = gpu_->Download(gc);
      ASSERT_EQ(std::memcmp(hc.f32() + (len - 1) * c.kv.latent_dim, cc.f32() + (len - 1) * c.kv.latent_dim,
                            static_cast<size_t>(c.kv.latent_dim) * sizeof(float)),
                0)
          << "new row of sequence " << b;
    }
    Tensor want = cpu_->Empty({B, width});
    cpu_kv->AttendDecode(layer, c.q, c.w_kvb, c.mla, &want);
    Tensor q = gpu_->Upload(c.q);
    Tensor o = Poisoned({B, width});
    gpu_kv->AttendDecode(layer, q, gpu_w, c.mla, &o);
    const Tensor got = gpu_->Download(o);
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_LE(RelL2(got.f32() + b * width, want.f32() + b * width, width), 2e-5)
          << "sequence " << b << " of context " << c.step.context[static_cast<size_t>(b)];
    }
    // Each sequence alone, then the batch again: the same bits.
    for (int64_t b = 0; b < B; ++b) {
      PagedDecodeStep alone;
      alone.Add(c.step.table(b), c.step.context[static_cast<size_t>(b)]);
      gpu_kv->SetDecodeStep(alone);
      Tensor o1 = Poisoned({1, width});
      gpu_kv->AttendDecode(layer, q.Rows(b, 1), gpu_w, c.mla, &o1);
      const Tensor h1 = gpu_->Download(o1);
      EXPECT_EQ(std::memcmp(h1.f32(), got.f32() + b * width, static_cast<size_t>(width) * sizeof(float)), 0)
          << "sequence " << b << " alone differs from its row of the batch";
    }
    gpu_kv->SetDecodeStep(c.step);
    Tensor o2 = Poisoned({B, width});
    gpu_kv->AttendDecode(layer, q, gpu_w, c.mla, &o2);
    const Tensor again = gpu_->Download(o2);
    EXPECT_EQ(std::memcmp(again.f32(), got.f32(), static_cast<size_t>(B * width) * sizeof(float)), 0);
  }

  std::unique_ptr<Backend> gpu_, cpu_;
};

TEST_F(CudaBackendDecodeOpsTest, PagedDecodeMatchesCpuAtK3WidthsForEveryDtype) {
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    Check(testing::MakePagedDecodeCase({100, 1, 4097, 32768, 33}, /*heads=*/12, dtype,
                                       11 + static_cast<uint64_t>(dtype)),
          /*bf16_weights=*/false);
  }
}

TEST_F(CudaBackendDecodeOpsTest, PagedDecodeKimiLinearHeadsWithBf16HeldKvB) {
  Check(testing::MakePagedDecodeCase({5000, 3, 257}, /*heads=*/32, DType::kBF16, 5, /*block_size=*/64),
        /*bf16_weights=*/true);
}

// A KDA layer at K3's head width (K 128; 8 heads), conv width 4, six slots of random state.
TEST_F(CudaBackendDecodeOpsTest, KdaDecodeOverSlotsMatchesCpu) {
  SplitMix64 rng(31);
  const int64_t H = 8, K = 128, Pl = H * K, W = 4, slots_n = 6;
  auto rnd = [&](Shape s, float scale) { return testing::RandomHost(rng, std::move(s), scale); };
  const KdaStatePool host{rnd({slots_n, W - 1, Pl}, 1.0f), rnd({slots_n, W - 1, Pl}, 1.0f),
                          rnd({slots_n, W - 1, Pl}, 1.0f), rnd({slots_n, H, K, K}, 0.1f)};
  const Tensor taps_q = rnd({Pl, W}, 0.3f), taps_k = rnd({Pl, W}, 0.3f), taps_v = rnd({Pl, W}, 0.3f);
  const Tensor a_log = rnd({H}, 0.5f), dt_bias = rnd({Pl}, 0.5f);
  const std::vector<int32_t> slots = {4, 0, 2};
  const int64_t B = static_cast<int64_t>(slots.size());
  const Tensor q_raw = rnd({B, Pl}, 1.0f), k_raw = rnd({B, Pl}, 1.0f), v_raw = rnd({B, Pl}, 1.0f);
  const Tensor f = rnd({B, Pl}, 1.0f), beta = rnd({B, H}, 1.0f);
  auto copy_pool = [](Backend& be, const KdaStatePool& p) {
    auto copy = [&](const Tensor& t) {
      Tensor h = Tensor::Host(t.shape());
      std::memcpy(h.f32(), t.f32(), static_cast<size_t>(t.numel()) * sizeof(float));
      return be.Upload(h);
    };
    return KdaStatePool{copy(p.conv_q), copy(p.conv_k), copy(p.conv_v), copy(p.recurrent)};
  };
  for (const std::optional<float> lb : {std::optional<float>(), std::optional<float>(-5.0f)}) {
    SCOPED_TRACE(lb ? "bounded gate" : "softplus gate");
    KdaDecodeWeights cw{&taps_q, &taps_k, &taps_v, &a_log, &dt_bias, lb};
    KdaStatePool cpu_pool = copy_pool(*cpu_, host);
    Tensor want = cpu_->Empty({B, Pl});
    cpu_->KdaDecode(slots, q_raw, k_raw, v_raw, f, beta, cw, &cpu_pool, &want);

    const Tensor g_tq = gpu_->Upload(taps_q), g_tk = gpu_->Upload(taps_k), g_tv = gpu_->Upload(taps_v);
    const Tensor g_alog = gpu_->Upload(a_log), g_dt = gpu_->Upload(dt_bias);
    KdaDecodeWeights gw{&g_tq, &g_tk, &g_tv, &g_alog, &g_dt, lb};
    const Tensor gq = gpu_->Upload(q_raw), gk = gpu_->Upload(k_raw), gv = gpu_->Upload(v_raw);
    const Tensor gf = gpu_->Upload(f), gb = gpu_->Upload(beta);
    KdaStatePool gpu_pool = copy_pool(*gpu_, host);
    Tensor o = Poisoned({B, Pl});
    gpu_->KdaDecode(slots, gq, gk, gv, gf, gb, gw, &gpu_pool, &o);
    const Tensor got = gpu_->Download(o);
    EXPECT_LE(RelL2(got.f32(), want.f32(), want.numel()), 2e-5);
    const Tensor got_state = gpu_->Download(gpu_pool.recurrent), got_win = gpu_->Download(gpu_pool.conv_v);
    const int64_t per_state = H * K * K, per_win = (W - 1) * Pl;
    for (int32_t s = 0; s < slots_n; ++s) {
      const bool used = s == 4 || s == 0 || s == 2;
      const float* ref_state = (used ? cpu_pool.recurrent : host.recurrent).f32() + s * per_state;
      const float* ref_win = (used ? cpu_pool.conv_v : host.conv_v).f32() + s * per_win;
      if (used) {
        EXPECT_LE(RelL2(got_state.f32() + s * per_state, ref_state, per_state), 2e-5) << "slot " << s;
        EXPECT_EQ(std::memcmp(got_win.f32() + s * per_win, ref_win, static_cast<size_t>(per_win) * 4), 0);
      } else {  // not in the batch: untouched, bit for bit
        EXPECT_EQ(std::memcmp(got_state.f32() + s * per_state, ref_state, static_cast<size_t>(per_state) * 4), 0);
        EXPECT_EQ(std::memcmp(got_win.f32() + s * per_win, ref_win, static_cast<size_t>(per_win) * 4), 0);
      }
    }
    // Each row alone from the same starting state: the same bits as in the batch.
    for (int64_t b = 0; b < B; ++b) {
      KdaStatePool alone_pool = copy_pool(*gpu_, host);
      Tensor o1 = Poisoned({1, Pl});
      const int32_t one[] = {slots[static_cast<size_t>(b)]};
      gpu_->KdaDecode(one, gq.Rows(b, 1), gk.Rows(b, 1), gv.Rows(b, 1), gf.Rows(b, 1), gb.Rows(b, 1), gw, &alone_pool,
                      &o1);
      const Tensor h1 = gpu_->Download(o1), s1 = gpu_->Download(alone_pool.recurrent);
      EXPECT_EQ(std::memcmp(h1.f32(), got.f32() + b * Pl, static_cast<size_t>(Pl) * 4), 0) << "row " << b;
      EXPECT_EQ(std::memcmp(s1.f32() + one[0] * per_state, got_state.f32() + one[0] * per_state,
                            static_cast<size_t>(per_state) * 4),
                0)
          << "row " << b;
    }
  }
}

}  // namespace
}  // namespace kimirt
