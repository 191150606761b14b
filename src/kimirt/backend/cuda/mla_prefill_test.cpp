// Issue 14's MLA prefill on tensor cores: the flash-attention kernel (kernels.h
// MlaPrefillAttention) against a float64 reference, and the paged path (KvStorage::AttendPrefill)
// against the CPU's F32 reference.
//
// The kernel takes BF16 operands, so its inputs here are random values already rounded to BF16
// (never zeros): the reference then sees the kernel's very operands, and what is left is the
// kernel's own rounding, chiefly P rounded to BF16 for P·V (RMS 2^-9/√3 ≈ 1.1e-3 relative per
// probability, which the output inherits): each row within 4e-3 relative L2. Shapes: T new
// tokens in {1, 17, 64, 65, 300} (one block, one and a bit, several) after start in {0, 5, 1000}
// cached ones, as one varlen batch with the sequences' query rows out of order, at the models'
// head widths (dn = dv = 128 with dr = 64, Kimi-Linear's and K3's, and dr = 0) and 4 or 32 heads.
// Outputs are poisoned with NaN first. Row independence, bit for bit: each sequence alone gives
// its rows of the batch, and a sequence cut into three chunks at other token boundaries (each
// its own call, over the same keys) gives the rows of the whole; every kernel shape
// (kMlaPrefillVariants) gives the same bits.
//
// The paged path at Kimi-Linear's widths (32 heads) for the F32, BF16 and FP8 caches: against
// the CPU backend's F32 expanded attention over the same codes within 1e-2 (its k_nope, v and q
// rounded to BF16 on top: ~2.5e-3 expected), each sequence alone bit-identical to its rows of
// the batch, and a row no sequence names left untouched. Widths without a kernel: the F32 path's
// bits.
//
// The expanded history a storage keeps between a prefill's chunks (expanded_history.h): chunk by
// chunk, the bits of a storage that re-expands every row at every call; reuse shown by rewriting
// the rows behind the storage's back; blocks freed through LatentKvCache and handed out again with
// other latents expanded anew (against the CPU).
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"
#include "kimirt/model/latent_kv_cache.h"
#include "kimirt/testing/cuda_cpu_test.h"
#include "kimirt/testing/paged_decode_case.h"

namespace kimirt {
namespace {

#define TEST_CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << #expr

struct Seq {
  int64_t start, count;
};

class CudaBackendMlaPrefill : public testing::CudaCpuTest {
 protected:
  // Random normal values rounded to BF16: `vals` gets the rounded F32, the result the codes.
  std::vector<uint16_t> RandomBf16(int64_t n, float scale, std::vector<float>* vals) {
    vals->resize(static_cast<size_t>(n));
    for (float& v : *vals) v = scale * rng_.FastNormal();
    std::vector<uint16_t> codes(static_cast<size_t>(n));
    F32ToBf16(vals->data(), codes.data(), codes.size());
    Bf16ToF32(codes.data(), vals->data(), codes.size());
    return codes;
  }
  Tensor UpCodes(const std::vector<uint16_t>& codes) {
    Tensor h = Tensor::Host({static_cast<int64_t>(codes.size())}, DType::kBF16);
    std::memcpy(h.raw(), codes.data(), codes.size() * sizeof(uint16_t));
    return gpu_->Upload(h);
  }
  Tensor UpFloats(const std::vector<float>& v, Shape shape) {
    Tensor h = Tensor::Host(std::move(shape));
    std::memcpy(h.f32(), v.data(), v.size() * sizeof(float));
    return gpu_->Upload(h);
  }

  static MlaShape Mla(int64_t heads, int64_t nope, int64_t rope, int64_t v, int64_t latent) {
    MlaShape m;
    m.heads = heads;
    m.nope_dim = nope;
    m.rope_dim = rope;
    m.v_dim = v;
    m.latent_dim = latent;
    return m;
  }

  static double RelL2(const float* got, const double* want, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(got[i])) return INFINITY;
      num += (got[i] - want[i]) * (got[i] - want[i]);
      den += want[i] * want[i];
    }
    return std::sqrt(num / std::max(den, 1e-300));
  }

  // One kernel call over `seqs`, their keys at PlanMlaPrefill's rows of kv and ks (sequence after
  // sequence from row 0), their query and output rows at `rows`.
  void Run(const std::vector<Seq>& seqs, const std::vector<int64_t>& rows, const float* q, const void* kv,
           const void* ks, int64_t dr, int64_t H, int64_t dn, int64_t dv, float* o,
           int variant = cuda::kMlaPrefillDefaultVariant) {
    std::vector<int64_t> start, count;
    for (const Seq& s : seqs) {
      start.push_back(s.start);
      count.push_back(s.count);
    }
    const cuda::MlaPrefillPlan plan = cuda::PlanMlaPrefill(start, count, rows, variant);
    Tensor meta = Tensor::Host({static_cast<int64_t>(plan.meta.size())}, DType::kI32);
    std::memcpy(meta.raw(), plan.meta.data(), plan.meta.size() * sizeof(int32_t));
    Tensor d_meta = gpu_->Upload(meta);
    TEST_CUDA_OK(cudaDeviceSynchronize());  // the backend's stream is not the default one
    cuda::MlaPrefillArgs a =
        cuda::PlannedMlaPrefillArgs(plan, static_cast<const int32_t*>(d_meta.raw()), H, dn, dr, dv);
    a.q = q;
    a.kv = kv;
    a.ks = ks;
    a.o = o;
    cuda::MlaPrefillAttention(a, nullptr);
    TEST_CUDA_OK(cudaDeviceSynchronize());
  }

  // The kernel against float64 on the varlen batch `seqs`, then row independence.
  void CheckKernel(int64_t H, int64_t dn, int64_t dr, int64_t dv, const std::vector<Seq>& seqs) {
    SCOPED_TRACE("H " + std::to_string(H) + ", dr " + std::to_string(dr));
    ASSERT_TRUE(cuda::MlaPrefillSupported(dn, dr, dv));
    const int64_t B = static_cast<int64_t>(seqs.size()), dq = dn + dr, dkv = dn + dv;
    // Query rows: the sequences in reverse order.
    std::vector<int64_t> rows(static_cast<size_t>(B)), key_begin(static_cast<size_t>(B));
    int64_t n_rows = 0, keys = 0;
    for (int64_t b = B - 1; b >= 0; --b) {
      rows[static_cast<size_t>(b)] = n_rows;
      n_rows += seqs[static_cast<size_t>(b)].count;
    }
    for (int64_t b = 0; b < B; ++b) {
      key_begin[static_cast<size_t>(b)] = keys;
      keys += seqs[static_cast<size_t>(b)].start + seqs[static_cast<size_t>(b)].count;
    }
    std::vector<float> qv, kvv, ksv;
    RandomBf16(n_rows * H * dq, 1.5f, &qv);  // the kernel rounds the F32 query itself
    const Tensor q = UpFloats(qv, {n_rows, H * dq});
    const Tensor kv = UpCodes(RandomBf16(keys * H * dkv, 1.0f, &kvv));
    const Tensor ks = dr > 0 ? UpCodes(RandomBf16(keys * dr, 1.0f, &ksv)) : Tensor();
    const void* ks_ptr = dr > 0 ? ks.raw() : nullptr;
    Tensor o = Poisoned({n_rows, H * dv});
    Run(seqs, rows, static_cast<const float*>(q.raw()), kv.raw(), ks_ptr, dr, H, dn, dv,
        static_cast<float*>(o.raw()));
    const Tensor got = gpu_->Download(o);
    const double scale = 1.0 / std::sqrt(static_cast<double>(dq));
    double worst = 0;
    for (int64_t b = 0; b < B; ++b) {
      const Seq& s = seqs[static_cast<size_t>(b)];
      const int64_t k0 = key_begin[static_cast<size_t>(b)];
      for (int64_t t = 0; t < s.count; ++t) {
        std::vector<double> want(static_cast<size_t>(H * dv), 0.0), p(static_cast<size_t>(s.start + t + 1));
        for (int64_t h = 0; h < H; ++h) {
          const float* qr = qv.data() + ((rows[static_cast<size_t>(b)] + t) * H + h) * dq;
          double mx = -INFINITY;
          for (int64_t j = 0; j <= s.start + t; ++j) {
            const float* kn = kvv.data() + ((k0 + j) * H + h) * dkv;
            double dot = 0;
            for (int64_t i = 0; i < dn; ++i) dot += double{qr[i]} * kn[i];
            for (int64_t i = 0; i < dr; ++i) dot += double{qr[dn + i]} * ksv[static_cast<size_t>((k0 + j) * dr + i)];
            p[static_cast<size_t>(j)] = dot * scale;
            mx = std::max(mx, dot * scale);
          }
          double sum = 0;
          for (double& x : p) sum += (x = std::exp(x - mx));
          double* out = want.data() + h * dv;
          for (int64_t j = 0; j <= s.start + t; ++j) {
            const float* v = kvv.data() + ((k0 + j) * H + h) * dkv + dn;
            for (int64_t i = 0; i < dv; ++i) out[i] += p[static_cast<size_t>(j)] / sum * v[i];
          }
        }
        const double err = RelL2(got.f32() + (rows[static_cast<size_t>(b)] + t) * H * dv, want.data(), H * dv);
        worst = std::max(worst, err);
        ASSERT_LE(err, 4e-3) << "start " << s.start << ", T " << s.count << ", token " << t;
      }
    }
    std::printf("MlaPrefill kernel H %lld dr %lld: worst row rel L2 %.2e\n", static_cast<long long>(H),
                static_cast<long long>(dr), worst);

    // The other kernel shapes: the same bits, row for row.
    for (int variant = 0; variant < cuda::kMlaPrefillVariants; ++variant) {
      if (variant == cuda::kMlaPrefillDefaultVariant) continue;
      Tensor ov = Poisoned({n_rows, H * dv});
      Run(seqs, rows, static_cast<const float*>(q.raw()), kv.raw(), ks_ptr, dr, H, dn, dv,
          static_cast<float*>(ov.raw()), variant);
      const Tensor other = gpu_->Download(ov);
      int64_t differ = 0;
      double worst_diff = 0;
      for (int64_t i = 0; i < got.numel(); ++i) {
        const float x = other.f32()[i], y = got.f32()[i];
        if (std::memcmp(&x, &y, sizeof(float)) != 0) {
          ++differ;
          worst_diff = std::max(worst_diff, std::fabs(static_cast<double>(x) - y));
        }
      }
      EXPECT_EQ(differ, 0) << "variant " << variant << " differs from variant " << cuda::kMlaPrefillDefaultVariant
                           << " in " << differ << " of " << got.numel() << " outputs (largest difference "
                           << worst_diff << ")";
    }

    // Each sequence alone (its keys where they are, its rows where they are): the same bits.
    auto bf16_at = [](const Tensor& t, int64_t elem) {
      return static_cast<const void*>(static_cast<const uint16_t*>(t.raw()) + elem);
    };
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      Tensor o1 = Poisoned({n_rows, H * dv});
      Run({seqs[i]}, {rows[i]}, static_cast<const float*>(q.raw()), bf16_at(kv, key_begin[i] * H * dkv),
          dr > 0 ? bf16_at(ks, key_begin[i] * dr) : nullptr, dr, H, dn, dv, static_cast<float*>(o1.raw()));
      const Tensor alone = gpu_->Download(o1);
      const int64_t at = rows[i] * H * dv, n = seqs[i].count * H * dv;
      EXPECT_EQ(std::memcmp(alone.f32() + at, got.f32() + at, static_cast<size_t>(n) * sizeof(float)), 0)
          << "sequence " << b << " alone differs from its rows of the batch";
    }
    // The longest sequence cut into three chunks (one call): the same bits as in one piece.
    const auto longest = std::max_element(seqs.begin(), seqs.end(), [](const Seq& x, const Seq& y) {
      return x.count < y.count;
    });
    const size_t li = static_cast<size_t>(longest - seqs.begin());
    const Seq whole = *longest;
    if (whole.count >= 3) {
      const int64_t c1 = std::min<int64_t>(17, whole.count - 2), c2 = std::min<int64_t>(c1 + 64, whole.count - 1);
      const std::vector<Seq> chunks = {
          {whole.start, c1}, {whole.start + c1, c2 - c1}, {whole.start + c2, whole.count - c2}};
      const std::vector<int64_t> chunk_rows = {rows[li], rows[li] + c1, rows[li] + c2};
      // A chunk's keys are a prefix of the whole sequence's, at the same rows.
      Tensor o2 = Poisoned({n_rows, H * dv});
      for (size_t k = 0; k < chunks.size(); ++k) {
        Run({chunks[k]}, {chunk_rows[k]}, static_cast<const float*>(q.raw()), bf16_at(kv, key_begin[li] * H * dkv),
            dr > 0 ? bf16_at(ks, key_begin[li] * dr) : nullptr, dr, H, dn, dv, static_cast<float*>(o2.raw()));
      }
      const Tensor chunked = gpu_->Download(o2);
      const int64_t at = rows[li] * H * dv, n = whole.count * H * dv;
      EXPECT_EQ(std::memcmp(chunked.f32() + at, got.f32() + at, static_cast<size_t>(n) * sizeof(float)), 0)
          << "chunks at " << c1 << ", " << c2 << " differ from the sequence in one piece";
    }
  }

};

std::vector<Seq> AllShapes() {
  std::vector<Seq> seqs;
  for (int64_t start : {0, 5, 1000}) {
    for (int64_t T : {1, 17, 64, 65, 300}) seqs.push_back({start, T});
  }
  return seqs;
}

TEST_F(CudaBackendMlaPrefill, KernelMatchesFloat64AtFourHeads) {
  CheckKernel(4, 128, 64, 128, AllShapes());
}

TEST_F(CudaBackendMlaPrefill, KernelMatchesFloat64WithoutSharedKeyDims) {
  CheckKernel(4, 128, 0, 128, AllShapes());
}

TEST_F(CudaBackendMlaPrefill, KernelMatchesFloat64AtKimiLinearHeads) {
  CheckKernel(32, 128, 64, 128, {{1000, 65}, {0, 300}, {5, 1}, {1000, 17}, {5, 64}});
}

// The paged path (KvStorage::AttendPrefill) at Kimi-Linear's widths over the three cache dtypes.
TEST_F(CudaBackendMlaPrefill, PagedMatchesCpuForEveryCacheDtype) {
  const std::vector<Seq> seqs = {{0, 300}, {1000, 65}, {5, 17}, {0, 1}};
  const std::vector<int64_t> rows = {90, 0, 65, 82};  // row 83 .. 89: no sequence's
  const int64_t n_rows = 390;
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kF8E4M3}) {
    SCOPED_TRACE(std::string(DTypeName(dtype)));
    std::vector<int64_t> contexts;
    for (const Seq& s : seqs) contexts.push_back(s.start + s.count);
    testing::PagedDecodeCase c =
        testing::MakePagedDecodeCase(contexts, /*heads=*/32, dtype, 40 + static_cast<uint64_t>(dtype));
    const int layer = 1;
    auto cpu_kv = testing::FillPagedDecodeStorage(*cpu_, c, layer);
    auto gpu_kv = testing::FillPagedDecodeStorage(*gpu_, c, layer);
    const Tensor gpu_w = UpBf16(c.w_kvb);
    const int64_t H = c.mla.heads, width = H * c.mla.v_dim;
    const Tensor q = testing::RandomHost(rng_, {n_rows, H * (c.mla.nope_dim + c.mla.rope_dim)}, 1.0f);
    const Tensor gq = gpu_->Upload(q);
    PagedPrefill batch;
    for (size_t b = 0; b < seqs.size(); ++b) {
      batch.Add(c.step.table(static_cast<int64_t>(b)), seqs[b].start, seqs[b].count, rows[b]);
    }
    Tensor want = cpu_->Empty({n_rows, width});
    cpu_kv->AttendPrefill(layer, batch, q, c.w_kvb, c.mla, &want);
    Tensor o = Poisoned({n_rows, width});
    gpu_kv->AttendPrefill(layer, batch, gq, gpu_w, c.mla, &o);
    const Tensor got = gpu_->Download(o);
    for (size_t b = 0; b < seqs.size(); ++b) {
      const int64_t at = rows[b] * width, n = seqs[b].count * width;
      std::vector<double> ref(want.f32() + at, want.f32() + at + n);
      EXPECT_LE(RelL2(got.f32() + at, ref.data(), n), 1e-2) << "sequence " << b;
      PagedPrefill alone;
      alone.Add(c.step.table(static_cast<int64_t>(b)), seqs[b].start, seqs[b].count, rows[b]);
      Tensor o1 = Poisoned({n_rows, width});
      gpu_kv->AttendPrefill(layer, alone, gq, gpu_w, c.mla, &o1);
      const Tensor h1 = gpu_->Download(o1);
      EXPECT_EQ(std::memcmp(h1.f32() + at, got.f32() + at, static_cast<size_t>(n) * sizeof(float)), 0)
          << "sequence " << b << " alone differs from its rows of the batch";
    }
    for (int64_t i = 83 * width; i < 90 * width; ++i) ASSERT_TRUE(std::isnan(got.f32()[i])) << "unnamed row written";
  }
}

// Widths without a kernel (the tiny fixtures') take the F32 path inside AttendPrefill: Gather +
// MlaAttention's expanded form, the same bits as calling them.
TEST_F(CudaBackendMlaPrefill, OtherWidthsTakeTheF32Path) {
  ASSERT_FALSE(cuda::MlaPrefillSupported(16, 8, 16));
  const KvStorageShape shape{2, 16, 64, 8, DType::kBF16};
  const MlaShape mla = Mla(4, 16, 8, 16, 64);
  const int64_t start = 30, n = 21, len = start + n, width = mla.heads * mla.v_dim;
  auto kv = gpu_->MakeKvStorage(shape);
  kv->Resize(6);
  const std::vector<int32_t> table = {5, 2, 0, 4};
  kv->Write(1, table, 0, gpu_->Upload(testing::RandomHost(rng_, {len, 64}, 1.0f)),
            gpu_->Upload(testing::RandomHost(rng_, {len, 8}, 1.0f)));
  Tensor w = testing::RandomHost(rng_, {mla.heads * 32, 64}, 0.1f);
  const Tensor gw = UpBf16(w);
  const Tensor q = gpu_->Upload(testing::RandomHost(rng_, {n, mla.heads * 24}, 1.0f));
  Tensor c = gpu_->Empty({len, 64}), ks = gpu_->Empty({len, 8});
  kv->Gather(1, table, len, &c, &ks);
  Tensor want = Poisoned({n, width});
  gpu_->MlaAttention(q, c, ks, gw, mla, start, MlaForm::kExpanded, &want);
  PagedPrefill batch;
  batch.Add(table, start, n, 0);
  Tensor got = Poisoned({n, width});
  kv->AttendPrefill(1, batch, q, gw, mla, &got);
  const Tensor a = gpu_->Download(got), b = gpu_->Download(want);
  EXPECT_FALSE(std::isnan(a.f32()[0]));
  EXPECT_EQ(std::memcmp(a.f32(), b.f32(), static_cast<size_t>(n * width) * sizeof(float)), 0);
}

// A storage that keeps the expanded history against one that re-expands every row at every call
// (prefill_history_bytes 0), two layers, chunks of 200, 3, 317, 1 and 179 tokens (not block
// aligned; the 3- and 1-token chunks' rows go through the prefill tile too, so a row's bits do not
// depend on its chunk), the kept buffers growing twice: the same bits at every chunk and layer.
// Then the latents are rewritten without telling the storage (a contract breach no caller makes):
// the keeping storage still attends over the old rows below the chunk — which shows it reuses
// them — until Released drops them, after which the bits agree again.
TEST_F(CudaBackendMlaPrefill, KeptHistoryGivesTheBitsOfReexpandingIt) {
  gpu_->set_bf16_prefill(true);
  KvStorageShape shape{2, 16, 512, 64, DType::kBF16};
  KvStorageShape off = shape;
  off.prefill_history_bytes = 0;
  const MlaShape mla = Mla(8, 128, 64, 128, 512);
  const int64_t len = 700, H = mla.heads, width = H * mla.v_dim;
  std::vector<int32_t> table;
  for (int32_t i = 0; i < 44; ++i) table.push_back((i * 7 + 3) % 50);
  auto kept = gpu_->MakeKvStorage(shape), fresh = gpu_->MakeKvStorage(off);
  kept->Resize(50);
  fresh->Resize(50);
  auto fill = [&](float scale) {
    for (int l = 0; l < 2; ++l) {
      const Tensor c = gpu_->Upload(Random({len, 512}, scale)), ks = gpu_->Upload(Random({len, 64}, scale));
      kept->Write(l, table, 0, c, ks);
      fresh->Write(l, table, 0, c, ks);
    }
  };
  fill(1.0f);
  Tensor w = Random({H * 256, 512}, 0.05f);
  const Tensor gw = UpBf16(w);
  const Tensor q = gpu_->Upload(Random({len, H * 192}, 1.0f));
  // Rows [start, start + n) of both storages' outputs, layer by layer: how many differ.
  auto chunk = [&](int64_t start, int64_t n) {
    int64_t differ = 0;
    for (int l = 0; l < 2; ++l) {
      PagedPrefill batch;
      batch.Add(table, start, n, start);
      Tensor a = Poisoned({len, width}), b = Poisoned({len, width});
      kept->AttendPrefill(l, batch, q, gw, mla, &a);
      fresh->AttendPrefill(l, batch, q, gw, mla, &b);
      const Tensor ha = gpu_->Download(a), hb = gpu_->Download(b);
      for (int64_t i = start * width; i < (start + n) * width; ++i) {
        EXPECT_FALSE(std::isnan(ha.f32()[i]) || std::isnan(hb.f32()[i])) << "row " << i / width;
        differ += std::memcmp(ha.f32() + i, hb.f32() + i, sizeof(float)) != 0;
      }
    }
    return differ;
  };
  int64_t at = 0;
  for (int64_t n : {200, 3, 317, 1, 179}) {
    EXPECT_EQ(chunk(at, n), 0) << "chunk at " << at;
    at += n;
  }
  fill(2.0f);
  EXPECT_GT(chunk(600, 100), 0) << "the kept rows [0, 600) were read again, not reused";
  kept->Released(std::span<const int32_t>(table).subspan(5, 1));
  EXPECT_EQ(chunk(600, 100), 0);
}

// LatentKvCache::FreeBlocks tells its storage: a sequence's blocks freed and handed out again in the
// same order, holding other latents, are expanded anew — the continuation chunk matches the CPU's
// expanded attention over the new latents (kept rows of the old ones would be off by O(1)).
TEST_F(CudaBackendMlaPrefill, FreedBlocksAreExpandedAnew) {
  gpu_->set_bf16_prefill(true);
  LatentKvCache gkv(*gpu_, 1, 24, 16, 512, 64, KvCacheDType::kBF16, false);
  LatentKvCache ckv(*cpu_, 1, 24, 16, 512, 64, KvCacheDType::kBF16, false);
  const MlaShape mla = Mla(8, 128, 64, 128, 512);
  const int64_t len = 300, start = 200, width = mla.heads * mla.v_dim;
  Tensor w = Random({mla.heads * 256, 512}, 0.05f);
  const Tensor gw = UpBf16(w);
  const Tensor q = Random({len, mla.heads * 192}, 1.0f), gq = gpu_->Upload(q);
  std::vector<int32_t> table, ctable;
  ASSERT_TRUE(gkv.Reserve(&table, len).ok());
  ASSERT_TRUE(ckv.Reserve(&ctable, len).ok());
  ASSERT_EQ(table, ctable);
  auto write = [&](float scale) {
    const Tensor c = Random({len, 512}, scale), ks = Random({len, 64}, scale);
    gkv.Write(0, table, 0, gpu_->Upload(c), gpu_->Upload(ks));
    ckv.Write(0, table, 0, c, ks);
  };
  auto attend = [&](int64_t from, int64_t n, Tensor* o) {
    PagedPrefill batch;
    batch.Add(table, from, n, from);
    gkv.AttendPrefill(0, batch, gq, gw, mla, o);
  };
  write(1.0f);
  Tensor o = Poisoned({len, width});
  attend(0, start, &o);
  attend(start, len - start, &o);
  gkv.FreeBlocks(table);
  ckv.FreeBlocks(table);
  std::vector<int32_t> again;
  for (size_t i = 0; i < table.size(); ++i) again.push_back(gkv.AllocateBlock().value());
  for (size_t i = 0; i < table.size(); ++i) ASSERT_TRUE(ckv.AllocateBlock().has_value());
  std::reverse(again.begin(), again.end());  // the pool hands the freed blocks back last in, first out
  ASSERT_EQ(again, table);
  write(-1.5f);
  attend(start, len - start, &o);
  Tensor want = cpu_->Empty({len, width});
  PagedPrefill batch;
  batch.Add(table, start, len - start, start);
  ckv.AttendPrefill(0, batch, q, w, mla, &want);
  const Tensor got = gpu_->Download(o);
  const int64_t n = (len - start) * width;
  Tensor g = Tensor::Host({n}), r = Tensor::Host({n});
  std::memcpy(g.raw(), got.f32() + start * width, static_cast<size_t>(n) * sizeof(float));
  std::memcpy(r.raw(), want.f32() + start * width, static_cast<size_t>(n) * sizeof(float));
  EXPECT_LE(CudaCpuTest::RelL2(g, r), 1e-2);
}

}  // namespace
}  // namespace kimirt
