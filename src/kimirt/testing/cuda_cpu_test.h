// The base of the CUDA op tests: the CUDA backend under test, the CPU backend as the reference,
// a seeded generator, and the helpers they all use — random host inputs (never zeros), outputs
// poisoned with NaN (an element a kernel does not write fails the check), and weights held as
// the loader holds them with --dtype bfloat16. Only built into CUDA test binaries.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <utility>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"

namespace kimirt::testing {

class CudaCpuTest : public ::testing::Test {
 protected:
  explicit CudaCpuTest(uint64_t seed = 20261201) : rng_(seed) {}

  void SetUp() override {
    auto g = MakeBackend("cuda");
    ASSERT_TRUE(g.ok()) << g.status().ToString();
    gpu_ = std::move(g).value();
    cpu_ = std::move(MakeBackend("cpu")).value();
  }

  // Normal values times `scale` plus `offset`, on the host.
  Tensor Random(Shape shape, float scale = 1.0f, float offset = 0.0f) {
    Tensor t = Tensor::Host(std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = offset + scale * rng_.FastNormal();
    return t;
  }
  // A GPU output pre-filled with NaN.
  Tensor Poisoned(Shape shape) {
    Tensor h = Tensor::Host(std::move(shape));
    for (int64_t i = 0; i < h.numel(); ++i) h.f32()[i] = std::nanf("");
    return gpu_->Upload(h);
  }
  // `w` rounded to BF16 in place (so every reference sees the same values), and its BF16 device
  // copy.
  Tensor UpBf16(Tensor& w) {
    Tensor b = Tensor::Host(w.shape(), DType::kBF16);
    F32ToBf16(w.f32(), static_cast<uint16_t*>(b.raw()), static_cast<size_t>(w.numel()));
    Bf16ToF32(static_cast<const uint16_t*>(b.raw()), w.f32(), static_cast<size_t>(w.numel()));
    return gpu_->Upload(b);
  }

  // The routed experts on the GPU (outputs poisoned first), back on the host.
  Tensor RunMoeExperts(const Tensor& z, const Tensor& idx, const Tensor& w, const ExpertWeights& ex,
                       const GluParams& p) {
    Tensor out = Poisoned({z.dim(0), z.dim(1)});
    gpu_->MoeExperts(gpu_->Upload(z), gpu_->Upload(idx), gpu_->Upload(w), ex, p, &out);
    return gpu_->Download(out);
  }
  // Relative L2 distance of host tensors; NaN anywhere or an all-zero reference never passes.
  static double RelL2(const Tensor& got, const Tensor& want) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < want.numel(); ++i) {
      const double d = static_cast<double>(got.f32()[i]) - want.f32()[i];
      num += d * d;
      den += static_cast<double>(want.f32()[i]) * want.f32()[i];
    }
    return den > 0 && !std::isnan(num) ? std::sqrt(num / den) : INFINITY;
  }

  std::unique_ptr<Backend> gpu_, cpu_;
  SplitMix64 rng_;
};

}  // namespace kimirt::testing
