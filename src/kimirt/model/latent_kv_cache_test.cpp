#include "kimirt/model/latent_kv_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

// The cache keeps a reference to the backend that made its storage: one for the whole test.
Backend* CpuBackend() {
  static std::unique_ptr<Backend> be = MakeCpuBackend();
  return be.get();
}

Tensor RandomRows(int64_t rows, int64_t cols, uint64_t seed, float scale = 1.0f) {
  Tensor t = Tensor::Host({rows, cols});
  SplitMix64 rng(seed);
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = scale * static_cast<float>(rng.Normal());
  return t;
}

TEST(LatentKvCache, PagedWritesReadBackAcrossBlocksAndLayers) {
  const int layers = 3, block = 4;
  const int64_t r = 10, dr = 3;
  LatentKvCache kv(*CpuBackend(), layers, 16, block, r, dr, KvCacheDType::kF32, false);
  // Two sequences interleave their block allocations, so tables are not contiguous.
  // Every layer gets its own rows (a layer-offset bug would read another layer's back).
  std::vector<int32_t> a, b;
  std::vector<Tensor> ca, ka, cb, kb;
  for (int l = 0; l < layers; ++l) {
    const uint64_t seed = 10 * static_cast<uint64_t>(l);
    ca.push_back(RandomRows(11, r, seed + 1));
    ka.push_back(RandomRows(11, dr, seed + 2));
    cb.push_back(RandomRows(7, r, seed + 3));
    kb.push_back(RandomRows(7, dr, seed + 4));
  }
  ASSERT_TRUE(kv.Reserve(&a, 3).ok());
  ASSERT_TRUE(kv.Reserve(&b, 7).ok());
  ASSERT_TRUE(kv.Reserve(&a, 11).ok());
  EXPECT_EQ(a.size(), 3u);
  EXPECT_EQ(b.size(), 2u);
  EXPECT_EQ(kv.used_blocks(), 5);
  for (int l = 0; l < layers; ++l) {
    // Sequence a written in two pieces that straddle a block boundary.
    kv.Write(l, a, 0, ca[l].Rows(0, 6), ka[l].Rows(0, 6));
    kv.Write(l, a, 6, ca[l].Rows(6, 5), ka[l].Rows(6, 5));
    kv.Write(l, b, 0, cb[l], kb[l]);
  }
  for (int l = 0; l < layers; ++l) {
    SCOPED_TRACE("layer " + std::to_string(l));
    Tensor c = Tensor::Host({11, r}), k = Tensor::Host({11, dr});
    kv.Gather(l, a, 11, &c, &k);
    EXPECT_TRUE(std::equal(c.f32(), c.f32() + c.numel(), ca[l].f32()));
    EXPECT_TRUE(std::equal(k.f32(), k.f32() + k.numel(), ka[l].f32()));
    Tensor c2 = Tensor::Host({7, r}), k2 = Tensor::Host({7, dr});
    kv.Gather(l, b, 7, &c2, &k2);
    EXPECT_TRUE(std::equal(c2.f32(), c2.f32() + c2.numel(), cb[l].f32()));
    EXPECT_TRUE(std::equal(k2.f32(), k2.f32() + k2.numel(), kb[l].f32()));
  }
  kv.FreeBlocks(a);
  kv.FreeBlocks(b);
  EXPECT_EQ(kv.used_blocks(), 0);
}

TEST(LatentKvCache, ReserveFailsWholeWhenThePoolIsShort) {
  LatentKvCache kv(*CpuBackend(), 1, 3, 2, 4, 2, KvCacheDType::kBF16, false);
  std::vector<int32_t> t;
  ASSERT_TRUE(kv.Reserve(&t, 4).ok());  // 2 blocks
  Status s = kv.Reserve(&t, 7);         // needs 2 more, 1 free
  EXPECT_EQ(s.code(), ErrorCode::kResourceExhausted);
  EXPECT_EQ(t.size(), 2u);
  EXPECT_EQ(kv.free_blocks(), 1);
  LatentKvCache grow(*CpuBackend(), 1, 0, 2, 4, 2, KvCacheDType::kF32, true);
  std::vector<int32_t> g;
  ASSERT_TRUE(grow.Reserve(&g, 100).ok());
  EXPECT_EQ(g.size(), 50u);
}

// Storage error bounds. BF16: 8 significant bits, so |error| ≤ 2^-9·|v| (checked at 2^-8).
// FP8 E4M3 with the per-token scale s = amax/448: normal codes have 3 mantissa bits, so
// |error| ≤ 2^-4·|v|; below 2^-6 in code units (subnormals) the step is 2^-9·s, so
// |error| ≤ 2^-10·s. The checks use |v|/16 and s·0.0079 (> 2^-10·s).
TEST(LatentKvCache, Bf16AndFp8StorageErrorsAreBounded) {
  const int64_t r = 512, dr = 64, T = 9;
  const Tensor c = RandomRows(T, r, 5), ks = RandomRows(T, dr, 6, 30.0f);  // different scales
  for (KvCacheDType dt : {KvCacheDType::kBF16, KvCacheDType::kFP8}) {
    LatentKvCache kv(*CpuBackend(), 2, 4, 8, r, dr, dt, false);
    std::vector<int32_t> t;
    ASSERT_TRUE(kv.Reserve(&t, T).ok());
    kv.Write(1, t, 0, c, ks);
    Tensor c2 = Tensor::Host({T, r}), k2 = Tensor::Host({T, dr});
    kv.Gather(1, t, T, &c2, &k2);
    for (int64_t row = 0; row < T; ++row) {
      float amax_c = 0, amax_k = 0;
      for (int64_t i = 0; i < r; ++i) amax_c = std::max(amax_c, std::fabs(c.f32()[row * r + i]));
      for (int64_t i = 0; i < dr; ++i) amax_k = std::max(amax_k, std::fabs(ks.f32()[row * dr + i]));
      for (int64_t i = 0; i < r; ++i) {
        const float want = c.f32()[row * r + i], got = c2.f32()[row * r + i];
        if (dt == KvCacheDType::kBF16) {
          EXPECT_LE(std::fabs(got - want), std::ldexp(std::fabs(want), -8)) << i;
        } else {
          EXPECT_LE(std::fabs(got - want), std::max(std::fabs(want) / 16.0f, amax_c / 448.0f * 0.0079f)) << i;
        }
      }
      for (int64_t i = 0; i < dr; ++i) {
        const float want = ks.f32()[row * dr + i], got = k2.f32()[row * dr + i];
        const float tol = dt == KvCacheDType::kBF16 ? std::ldexp(std::fabs(want), -8)
                                                    : std::max(std::fabs(want) / 16.0f, amax_k / 448.0f * 0.0079f);
        EXPECT_LE(std::fabs(got - want), tol) << i;
      }
    }
  }
  EXPECT_EQ(ParseKvCacheDType("fp8"), KvCacheDType::kFP8);
  EXPECT_EQ(ParseKvCacheDType("bfloat16"), KvCacheDType::kBF16);
  EXPECT_FALSE(ParseKvCacheDType("int4").has_value());
}

}  // namespace
}  // namespace kimirt

namespace kimirt {
namespace {

TEST(LatentKvCache, ASharedBlockReturnsToThePoolWithItsLastReference) {
  LatentKvCache kv(*CpuBackend(), 1, 4, 2, 3, 1, KvCacheDType::kF32, false);
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.Reserve(&a, 4).ok());  // two blocks, one reference each
  EXPECT_EQ(kv.free_blocks(), 2);
  kv.Share(std::span<const int32_t>(a).first(1));  // a second holder of a's first block
  EXPECT_EQ(kv.refs(a[0]), 2);
  EXPECT_EQ(kv.refs(a[1]), 1);
  kv.FreeBlocks(a);  // a ends: its second block is free, the shared one is still held
  EXPECT_EQ(kv.free_blocks(), 3);
  EXPECT_EQ(kv.refs(a[0]), 1);
  kv.FreeBlocks(std::span<const int32_t>(a).first(1));
  EXPECT_EQ(kv.free_blocks(), 4);
  EXPECT_EQ(kv.refs(a[0]), 0);
}

TEST(LatentKvCacheDeathTest, WritingIntoASharedBlockIsRefused) {
  LatentKvCache kv(*CpuBackend(), 1, 4, 2, 3, 1, KvCacheDType::kF32, false);
  std::vector<int32_t> a;
  ASSERT_TRUE(kv.Reserve(&a, 4).ok());
  kv.Share(std::span<const int32_t>(a).first(1));
  const Tensor c = RandomRows(1, 3, 1), ks = RandomRows(1, 1, 2);
  kv.Write(0, a, 2, c, ks);  // the unshared second block: fine
  EXPECT_DEATH(kv.Write(0, a, 1, c, ks), "shared latent block");
}

}  // namespace
}  // namespace kimirt
