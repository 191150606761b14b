// cuda::Gemv, the F32 GEMV of ≤ 64 rows (weight_kernels.cu; the MoE router's logits from its F32
// or stored BF16 weight, every F32-held Linear of a decode step), bit for bit against a host computation of the order its
// comment promises (testing/gemv_reference.h: lane sums with fmaf, then the xor butterfly). The
// router's choices depend on these bits, so they may not change with the kernel (issue 12).
//   - the staged kernel (F32, 16-byte aligned rows) at m = 1, 2, 7, 8, 9, 31, 32, 33, 64 (each
//     tile it picks, rows split across blocks or not, partial last tiles), n = 1, 3, 256
//     (Kimi-Linear-48B's experts), 896 (K3's), k = 2304, 7168 (their hidden sizes) and 100 (no
//     multiple of 32: a partial last step); rows m / 2 and m − 1 alone (m = 1) as in the batch;
//     the same at small n and k (every tile, with and without row splits) for memcheck;
//   - BF16 weights (the routers as stored) through the staged kernel's BF16 slots, the same
//     shapes and the same reference on the BF16 values;
//   - the general kernel at k = 4097 (no multiple of 4), with BF16 weights of rows no multiple of
//     16 bytes, and with x not 16-byte aligned: the same reference;
//   - through the backend (PDL launches) after and before other kernels, eagerly and replayed
//     from a CUDA graph: x is the previous kernel's output, y the next one's input.
// Outputs are poisoned with NaN first. In the CUDA build only (CMakeLists: backend/cuda/ tests).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/testing/cuda_cpu_test.h"
#include "kimirt/testing/gemv_reference.h"

namespace kimirt {
namespace {

// y [m, n] of host x [m, k] and w [n, k], the columns spread over the host's cores.
std::vector<float> Reference(const float* x, const float* w, int64_t m, int64_t n, int64_t k) {
  std::vector<float> y(static_cast<size_t>(m * n));
  const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(n, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int64_t t = 0; t < threads; ++t) {
    pool.emplace_back([&, t] {
      for (int64_t c = t; c < n; c += threads) {
        for (int64_t r = 0; r < m; ++r) {
          y[static_cast<size_t>(r * n + c)] = testing::GemvReferenceDot(x + r * k, w + c * k, k);
        }
      }
    });
  }
  for (std::thread& th : pool) th.join();
  return y;
}

class CudaBackendGemv : public testing::CudaCpuTest {
 protected:
  static constexpr int64_t kMaxRows = 64;
  static_assert(kMaxRows == cuda::kGemvMaxRows, "every row count Gemv takes");

  // Random host values away from zero (|v| ≥ 0.05 · scale), so no term vanishes.
  Tensor NonZero(Shape shape, float scale) {
    Tensor t = Random(std::move(shape), scale);
    for (int64_t i = 0; i < t.numel(); ++i) {
      float& v = t.f32()[i];
      if (std::fabs(v) < 0.05f * scale) v = std::copysign(0.05f * scale, v == 0.0f ? 1.0f : v);
    }
    return t;
  }

  // cuda::Gemv on the default stream (the uploads went on the backend's own: synchronized first),
  // its m × n result on the host; the output poisoned with NaN first.
  std::vector<float> RunGemv(const float* x, const void* w, bool w_bf16, int64_t m, int64_t n, int64_t k) {
    Tensor y = Poisoned({m, n});
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    cuda::Gemv(x, w, w_bf16, static_cast<float*>(y.raw()), m, n, k, nullptr);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const Tensor h = gpu_->Download(y);
    return std::vector<float>(h.f32(), h.f32() + m * n);
  }

  // got [m, n] against rows [row0, row0 + m) of want [*, n], every bit; NaN never passes.
  static void ExpectBits(const std::vector<float>& got, const std::vector<float>& want, int64_t row0, int64_t m,
                         int64_t n, const std::string& what) {
    int64_t differ = 0, first = -1;
    for (int64_t i = 0; i < m * n; ++i) {
      const float g = got[static_cast<size_t>(i)], w = want[static_cast<size_t>(row0 * n + i)];
      if (std::isnan(g) || std::memcmp(&g, &w, sizeof(float)) != 0) {
        if (differ++ == 0) first = i;
      }
    }
    EXPECT_EQ(differ, 0) << what << ": " << differ << " of " << m * n << " differ, the first (row "
                         << (first >= 0 ? row0 + first / n : -1) << ", column " << (first >= 0 ? first % n : -1)
                         << ") " << (first >= 0 ? got[static_cast<size_t>(first)] : 0.0f) << " vs "
                         << (first >= 0 ? want[static_cast<size_t>(row0 * n + first)] : 0.0f);
  }

  // For each k and n: every row count of kRowCounts against the reference, and each row that is
  // the middle or the last of one of them alone. x holds kMaxRows rows; a call of m rows reads its
  // first m, so every m must give the reference's first m rows.
  // bf16: the weight rounded to BF16 and held so (the router as stored), the reference on the
  // rounded values: the staged kernel's BF16 slots must give the F32 weight's order and bits.
  void CheckEveryRowCount(std::initializer_list<int64_t> ks, std::initializer_list<int64_t> ns, bool bf16 = false) {
    for (const int64_t k : ks) {
      const Tensor x = NonZero({kMaxRows, k}, 1.0f);
      const Tensor d_x = gpu_->Upload(x);
      const auto* xp = static_cast<const float*>(d_x.raw());
      for (const int64_t n : ns) {
        SCOPED_TRACE("n = " + std::to_string(n) + ", k = " + std::to_string(k) + (bf16 ? ", BF16" : ""));
        Tensor w = NonZero({n, k}, 0.02f);
        const Tensor d_w = bf16 ? UpBf16(w) : gpu_->Upload(w);  // UpBf16 leaves w the BF16 values
        const std::vector<float> want = Reference(x.f32(), w.f32(), kMaxRows, n, k);
        std::set<int64_t> alone;
        for (const int64_t m : kRowCounts) {
          ExpectBits(RunGemv(xp, d_w.raw(), bf16, m, n, k), want, 0, m, n, "m = " + std::to_string(m));
          alone.insert({m / 2, m - 1});
        }
        for (const int64_t t : alone) {
          ExpectBits(RunGemv(xp + t * k, d_w.raw(), bf16, 1, n, k), want, t, 1, n,
                     "row " + std::to_string(t) + " alone");
        }
      }
    }
  }

  static constexpr int64_t kRowCounts[] = {1, 2, 7, 8, 9, 31, 32, 33, 64};
};

// The routers' widths (Kimi-Linear-48B: 256 × 2304, K3: 896 × 7168) and odd ones. Not under
// memcheck (scripts/gpu_check.sh): SmallShapesHaveTheReferenceOrdersBits runs the same plans there.
TEST_F(CudaBackendGemv, EveryRowCountHasTheReferenceOrdersBits) {
  CheckEveryRowCount({2304, 7168, 100, 4097}, {1, 3, 256, 896});
}

// Small shapes through the same tiles, row splits and partial steps (n = 300: 3 columns a block
// at m ≤ 8, 8-row slices of x at m = 64; k = 2052: chunks of at most 1,024, then a last one whose
// last step is partial), cheap enough for memcheck.
TEST_F(CudaBackendGemv, SmallShapesHaveTheReferenceOrdersBits) {
  CheckEveryRowCount({100, 292, 2052}, {3, 40, 300});
}

// The routers held as stored (Backend::RouterAsStored): BF16 weights through the staged kernel's
// BF16 slots at the routers' widths and odd ones (k = 2052: a partial last step), the F32
// weight's order and bits. Not under memcheck (its SmallShapes case is).
TEST_F(CudaBackendGemv, Bf16RoutersHaveTheReferenceOrdersBits) {
  CheckEveryRowCount({2304, 7168, 2052}, {3, 256, 896}, /*bf16=*/true);
}

// The staged kernel's BF16 slots at small shapes, cheap enough for memcheck.
TEST_F(CudaBackendGemv, SmallShapesBf16HaveTheReferenceOrdersBits) {
  CheckEveryRowCount({104, 296, 2056}, {3, 40, 300}, /*bf16=*/true);
}

// The general kernel's inputs: BF16-held weights whose rows are no multiple of 16 bytes (k = 100),
// and x whose rows are not 16-byte aligned (BF16 weights at k = 2304 take the staged kernel).
TEST_F(CudaBackendGemv, Bf16WeightsAndUnalignedXHaveTheReferenceOrdersBits) {
  for (const int64_t k : {int64_t{2304}, int64_t{100}}) {
    const int64_t n = 256;
    SCOPED_TRACE("k = " + std::to_string(k));
    const Tensor x = NonZero({kMaxRows, k}, 1.0f);
    Tensor w = NonZero({n, k}, 0.02f);
    const Tensor d_w16 = UpBf16(w);  // w now holds the BF16 values
    const Tensor d_w = gpu_->Upload(w);
    const std::vector<float> want = Reference(x.f32(), w.f32(), kMaxRows, n, k);
    // x one float past an aligned buffer's start: rows 4 bytes off 16-byte alignment.
    Tensor shifted = Tensor::Host({kMaxRows * k + 1});
    shifted.f32()[0] = 1.0f;
    std::copy(x.f32(), x.f32() + kMaxRows * k, shifted.f32() + 1);
    const Tensor d_x = gpu_->Upload(x), d_shifted = gpu_->Upload(shifted);
    const auto* xp = static_cast<const float*>(d_x.raw());
    const auto* xs = static_cast<const float*>(d_shifted.raw()) + 1;
    for (const int64_t m : {1, 9, 33, 64}) {
      ExpectBits(RunGemv(xp, d_w16.raw(), true, m, n, k), want, 0, m, n, "BF16, m = " + std::to_string(m));
      ExpectBits(RunGemv(xs, d_w.raw(), false, m, n, k), want, 0, m, n, "unaligned x, m = " + std::to_string(m));
    }
  }
}

// Through the backend, as a decode step runs it: x = a + b (the kernel before, launched with
// PDL), y = x · wᵀ (Linear → Gemv), z = y + y (the kernel after, reading y): eagerly, then
// captured in a CUDA graph and replayed. y has the reference's bits and z is exactly 2y, so the
// GEMV waited for x and the next kernel for y.
TEST_F(CudaBackendGemv, InAGraphBetweenOtherKernelsKeepsTheBits) {
  const int64_t n = 896, k = 7168;
  const Tensor w = NonZero({n, k}, 0.02f);
  const Tensor d_w = gpu_->Upload(w);
  for (const int64_t m : {1, 8, 33, 64}) {
    SCOPED_TRACE("m = " + std::to_string(m));
    const Tensor a = NonZero({m, k}, 1.0f), b = NonZero({m, k}, 0.5f);
    Tensor x = Tensor::Host({m, k});
    for (int64_t i = 0; i < m * k; ++i) x.f32()[i] = a.f32()[i] + b.f32()[i];
    const std::vector<float> want = Reference(x.f32(), w.f32(), m, n, k);
    std::vector<float> twice(want.size());
    for (size_t i = 0; i < want.size(); ++i) twice[i] = want[i] + want[i];
    const Tensor d_a = gpu_->Upload(a), d_b = gpu_->Upload(b);
    auto check = [&](const Tensor& y, const Tensor& z, const std::string& what) {
      const Tensor hy = gpu_->Download(y), hz = gpu_->Download(z);
      ExpectBits(std::vector<float>(hy.f32(), hy.f32() + m * n), want, 0, m, n, what + ": y");
      ExpectBits(std::vector<float>(hz.f32(), hz.f32() + m * n), twice, 0, m, n, what + ": z = y + y");
    };
    {
      Tensor d_x = Poisoned({m, k}), y = Poisoned({m, n}), z = Poisoned({m, n});
      gpu_->Add(d_a, d_b, &d_x);
      gpu_->Linear(d_x, d_w, &y);
      gpu_->Add(y, y, &z);
      check(y, z, "eager");
    }
    Tensor d_x = Poisoned({m, k}), y = Poisoned({m, n}), z = Poisoned({m, n});
    const std::string key = "gemv-" + std::to_string(m);
    gpu_->CaptureBegin(key);
    gpu_->Add(d_a, d_b, &d_x);
    gpu_->Linear(d_x, d_w, &y);
    gpu_->Add(y, y, &z);
    ASSERT_TRUE(gpu_->CaptureEnd(z));
    gpu_->Replay(key);
    check(y, z, "graph");
  }
}

// Backend::PrefetchWeights is a hint on a stream beside the chain (l2_prefetch.cu): the same
// three kernels with weights asked into L2 between them — an unaligned view of w, an empty
// tensor, a host tensor, more ranges than one launch takes, more bytes than the budget — give the
// same bits eagerly and as a graph, whose capture must end with the prefetch stream joined
// (a fork left unjoined fails cudaStreamEndCapture), also when the prefetch is the last call.
TEST_F(CudaBackendGemv, PrefetchedWeightsChangeNothingInOrOutOfAGraph) {
  const int64_t n = 896, k = 7168, m = 1;
  const Tensor w = NonZero({n, k}, 0.02f);
  const Tensor d_w = gpu_->Upload(w), empty = gpu_->Empty({0, k}), odd = d_w.Reshape({n * k}).Rows(3, 1001);
  const Tensor a = NonZero({m, k}, 1.0f), b = NonZero({m, k}, 0.5f);
  Tensor x = Tensor::Host({m, k});
  for (int64_t i = 0; i < m * k; ++i) x.f32()[i] = a.f32()[i] + b.f32()[i];
  const std::vector<float> want = Reference(x.f32(), w.f32(), m, n, k);
  std::vector<Tensor> rows;  // 20 one-row views: more ranges than a launch takes
  for (int64_t r = 0; r < 20; ++r) rows.push_back(d_w.Rows(r, 1));
  std::vector<const Tensor*> many = {&odd, &empty, &w};
  for (const Tensor& r : rows) many.push_back(&r);
  const std::vector<const Tensor*> big = {&d_w, &d_w};  // 51 MB: past the budget
  const Tensor d_a = gpu_->Upload(a), d_b = gpu_->Upload(b);
  auto run = [&](Tensor* y, Tensor* z, bool prefetch_last) {
    Tensor d_x = Poisoned({m, k});
    gpu_->PrefetchWeights(many);
    gpu_->Add(d_a, d_b, &d_x);
    gpu_->PrefetchWeights(big);
    gpu_->Linear(d_x, d_w, y);
    gpu_->Add(*y, *y, z);
    if (prefetch_last) gpu_->PrefetchWeights(many);
  };
  auto check = [&](const Tensor& y, const Tensor& z, const std::string& what) {
    const Tensor hy = gpu_->Download(y), hz = gpu_->Download(z);
    ExpectBits(std::vector<float>(hy.f32(), hy.f32() + m * n), want, 0, m, n, what + ": y");
    for (int64_t i = 0; i < m * n; ++i) ASSERT_EQ(hz.f32()[i], hy.f32()[i] + hy.f32()[i]) << what << ": z at " << i;
  };
  {
    Tensor y = Poisoned({m, n}), z = Poisoned({m, n});
    run(&y, &z, true);
    check(y, z, "eager");
  }
  for (const bool last : {false, true}) {
    Tensor y = Poisoned({m, n}), z = Poisoned({m, n});
    const std::string key = std::string("prefetch-") + (last ? "last" : "inside");
    gpu_->CaptureBegin(key);
    run(&y, &z, last);
    ASSERT_TRUE(gpu_->CaptureEnd(z)) << key;
    gpu_->Replay(key);
    check(y, z, key);
  }
}

}  // namespace
}  // namespace kimirt
