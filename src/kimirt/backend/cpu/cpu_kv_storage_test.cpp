// The CPU storage's batched paged decode ops (backend.h KvStorage::SetDecodeStep, WriteDecode,
// AttendDecode) against the path they replace: each sequence's rows gathered to F32 and
// attended by the reference absorbed kernel (cpu/mla_kernels.h). The CPU is the reference every
// GPU op is checked against, so the paged path must give the very same bits, for every cache
// dtype, with block tables that interleave in the pool, and each row alone as in the batch.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cpu/mla_kernels.h"
#include "kimirt/testing/paged_decode_case.h"

namespace kimirt {
namespace {

// o [H·dv] of sequence b by the gather-then-attend path.
std::vector<float> GatheredReference(Backend& be, KvStorage& kv, const testing::PagedDecodeCase& c, int layer,
                                     int64_t b) {
  const int64_t len = c.step.context[static_cast<size_t>(b)];
  Tensor cc = be.Empty({len, c.kv.latent_dim}), ks = be.Empty({len, c.kv.rope_dim});
  kv.Gather(layer, c.step.table(b), len, &cc, &ks);
  const int64_t H = c.mla.heads, dq = c.mla.nope_dim + c.mla.rope_dim;
  Tensor q = c.q.Rows(b, 1);
  Tensor o = be.Empty({1, H * c.mla.v_dim});
  be.MlaAttention(q, cc, ks, c.w_kvb, c.mla, len - 1, MlaForm::kAbsorbed, &o);
  EXPECT_EQ(q.numel(), H * dq);
  return std::vector<float>(o.f32(), o.f32() + o.numel());
}

bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

TEST(CpuPagedMlaDecodeTest, SameBitsAsGatherThenAttendForEveryDtype) {
  auto cpu = std::move(MakeBackend("cpu")).value();
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    const testing::PagedDecodeCase c =
        testing::MakePagedDecodeCase({100, 1, 4097, 17}, /*heads=*/12, dtype, 7 + static_cast<uint64_t>(dtype));
    const int layer = 1;
    auto kv = testing::FillPagedDecodeStorage(*cpu, c, layer);
    const int64_t B = c.step.size(), width = c.mla.heads * c.mla.v_dim;
    Tensor o = cpu->Empty({B, width});
    std::fill(o.f32(), o.f32() + o.numel(), std::nanf(""));
    kv->AttendDecode(layer, c.q, c.w_kvb, c.mla, &o);
    for (int64_t b = 0; b < B; ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const std::vector<float> want = GatheredReference(*cpu, *kv, c, layer, b);
      EXPECT_TRUE(SameBits(o.f32() + b * width, want.data(), width));
      // The new row went where WriteDecode should put it: the gathered last row is it, coded.
      Tensor cc = cpu->Empty({c.step.context[static_cast<size_t>(b)], c.kv.latent_dim});
      Tensor ks = cpu->Empty({c.step.context[static_cast<size_t>(b)], c.kv.rope_dim});
      kv->Gather(layer, c.step.table(b), cc.dim(0), &cc, &ks);
      const float* got = cc.f32() + (cc.dim(0) - 1) * c.kv.latent_dim;
      const float tol = dtype == DType::kF32 ? 0.0f : dtype == DType::kBF16 ? 1.0f / 128 : 1.0f / 8;
      for (int64_t i = 0; i < c.kv.latent_dim; ++i) {
        const float v = c.new_c.f32()[b * c.kv.latent_dim + i];
        ASSERT_LE(std::fabs(got[i] - v), tol * std::max(std::fabs(v), 0.25f)) << i;
      }
    }
    // Each sequence alone gives its row of the batch, bit for bit (batch invariance).
    for (int64_t b = 0; b < B; ++b) {
      PagedDecodeStep alone;
      alone.Add(c.step.table(b), c.step.context[static_cast<size_t>(b)]);
      kv->SetDecodeStep(alone);
      Tensor o1 = cpu->Empty({1, width});
      kv->AttendDecode(layer, c.q.Rows(b, 1), c.w_kvb, c.mla, &o1);
      EXPECT_TRUE(SameBits(o1.f32(), o.f32() + b * width, width)) << "sequence " << b;
    }
  }
}

// KvStorage::AttendPrefill on the CPU (issue 14's paged prefill; the reference the CUDA kernel
// is checked against): each sequence's rows, queries at rows of the call out of order, give the
// bits of Gather + the expanded MlaAttention, alone or in the batch; a row no sequence names
// keeps its value.
TEST(CpuPagedMlaPrefillTest, SameBitsAsGatherThenExpandedAttention) {
  auto cpu = std::move(MakeBackend("cpu")).value();
  for (DType dtype : {DType::kF32, DType::kF8E4M3, DType::kBF16}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    // Contexts = start + new tokens: (start 0, 17 new), (5, 3), (40, 1).
    const std::vector<int64_t> starts = {0, 5, 40}, counts = {17, 3, 1}, rows = {4, 0, 3};
    const testing::PagedDecodeCase c =
        testing::MakePagedDecodeCase({17, 8, 41}, /*heads=*/3, dtype, 21 + static_cast<uint64_t>(dtype));
    const int layer = 0;
    auto kv = testing::FillPagedDecodeStorage(*cpu, c, layer);
    const int64_t H = c.mla.heads, dq = c.mla.nope_dim + c.mla.rope_dim, width = H * c.mla.v_dim, n_rows = 22;
    SplitMix64 rng(5);
    const Tensor q = testing::RandomHost(rng, {n_rows, H * dq}, 1.0f);
    PagedPrefill batch;
    for (size_t b = 0; b < starts.size(); ++b) {
      batch.Add(c.step.table(static_cast<int64_t>(b)), starts[b], counts[b], rows[b]);
    }
    Tensor o = cpu->Empty({n_rows, width});
    std::fill(o.f32(), o.f32() + o.numel(), 7.0f);
    kv->AttendPrefill(layer, batch, q, c.w_kvb, c.mla, &o);
    for (size_t b = 0; b < starts.size(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b));
      const int64_t len = starts[b] + counts[b];
      Tensor cc = cpu->Empty({len, c.kv.latent_dim}), ks = cpu->Empty({len, c.kv.rope_dim});
      kv->Gather(layer, c.step.table(static_cast<int64_t>(b)), len, &cc, &ks);
      Tensor want = cpu->Empty({counts[b], width});
      cpu->MlaAttention(q.Rows(rows[b], counts[b]), cc, ks, c.w_kvb, c.mla, starts[b], MlaForm::kExpanded, &want);
      EXPECT_TRUE(SameBits(o.f32() + rows[b] * width, want.f32(), counts[b] * width));
      PagedPrefill alone;
      alone.Add(c.step.table(static_cast<int64_t>(b)), starts[b], counts[b], rows[b]);
      Tensor o1 = cpu->Empty({n_rows, width});
      kv->AttendPrefill(layer, alone, q, c.w_kvb, c.mla, &o1);
      EXPECT_TRUE(SameBits(o1.f32() + rows[b] * width, want.f32(), counts[b] * width));
    }
    for (int64_t r = 21 * width; r < n_rows * width; ++r) ASSERT_EQ(o.f32()[r], 7.0f) << "row 21 was written";
  }
}

TEST(CpuPagedMlaDecodeTest, RefusesATableThatDoesNotCoverItsContext) {
  auto cpu = std::move(MakeBackend("cpu")).value();
  const testing::PagedDecodeCase c = testing::MakePagedDecodeCase({40}, 2, DType::kF32, 3);
  auto kv = cpu->MakeKvStorage(c.kv);
  kv->Resize(c.blocks);
  PagedDecodeStep step;
  step.Add(c.step.table(0).subspan(0, 2), 40);  // 2 blocks of 16 < 40 positions
  EXPECT_DEATH(kv->SetDecodeStep(step), "does not cover");
}

}  // namespace
}  // namespace kimirt
