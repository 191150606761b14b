// Random routed experts and routing for the CUDA MoE tests (moe_kernels_test.cpp,
// prefill_gemm_test.cpp): the same experts three ways — MXFP4 codes + scales as the checkpoint
// stores them (spec §2.9) and their exact values as BF16 on the device, and F32 on the host for
// the CPU reference — and each token's k distinct experts with positive combine weights.
// Header-only; nothing in the product includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"

namespace kimirt::testing {

// One matrix as the checkpoint stores it (host U8 codes [rows, cols/2], scales [rows, cols/32])
// and its exact values (host F32 [rows, cols]).
struct Mxfp4Matrix {
  Tensor codes, scales, values;
};

// Random codes (every byte equally likely, so every E2M1 code) and scales in [lo, hi].
inline Mxfp4Matrix RandomMxfp4(SplitMix64& rng, int64_t rows, int64_t cols, int lo, int hi) {
  Mxfp4Matrix m{Tensor::Host({rows, cols / 2}, DType::kU8), Tensor::Host({rows, cols / 32}, DType::kU8),
                Tensor::Host({rows, cols})};
  uint8_t* c = static_cast<uint8_t*>(m.codes.raw());
  for (int64_t i = 0; i < m.codes.numel(); i += 8) {
    const uint64_t r = rng.Next();
    std::memcpy(c + i, &r, static_cast<size_t>(std::min<int64_t>(8, m.codes.numel() - i)));
  }
  uint8_t* s = static_cast<uint8_t*>(m.scales.raw());
  for (int64_t i = 0; i < m.scales.numel(); ++i) s[i] = static_cast<uint8_t>(lo + rng.Next() % (hi - lo + 1));
  for (int64_t r = 0; r < rows; ++r) {
    DequantizeMxfp4Row(c + r * cols / 2, s + r * cols / 32, cols, m.values.f32() + r * cols);
  }
  return m;
}

// Host F32 values (exactly BF16 values) → a BF16 tensor on `gpu`.
inline Tensor UploadAsBf16(Backend& gpu, const Tensor& f32) {
  Tensor b = Tensor::Host(f32.shape(), DType::kBF16);
  F32ToBf16(f32.f32(), static_cast<uint16_t*>(b.raw()), static_cast<size_t>(f32.numel()));
  return gpu.Upload(b);
}

struct MoeExpertsCase {
  ExpertWeights packed, bf16, f32;
};
// E experts of gate/up [I, De] and down [De, I], scales 2^-9 .. 2^-5 (activations stay O(1)
// through K3-width sums).
inline MoeExpertsCase RandomMoeExperts(Backend& gpu, SplitMix64& rng, int64_t E, int64_t De, int64_t I) {
  MoeExpertsCase ex;
  for (int64_t e = 0; e < E; ++e) {
    Mxfp4Matrix g = RandomMxfp4(rng, I, De, 118, 122), u = RandomMxfp4(rng, I, De, 118, 122),
                d = RandomMxfp4(rng, De, I, 118, 122);
    for (auto [m, packed, packed_s, bf16, f32] :
         {std::tuple{&g, &ex.packed.gate, &ex.packed.gate_scales, &ex.bf16.gate, &ex.f32.gate},
          std::tuple{&u, &ex.packed.up, &ex.packed.up_scales, &ex.bf16.up, &ex.f32.up},
          std::tuple{&d, &ex.packed.down, &ex.packed.down_scales, &ex.bf16.down, &ex.f32.down}}) {
      packed->push_back(gpu.Upload(m->codes));
      packed_s->push_back(gpu.Upload(m->scales));
      bf16->push_back(UploadAsBf16(gpu, m->values));
      f32->push_back(m->values);
    }
  }
  return ex;
}

// Each token chooses k distinct experts of E (a random order: top-k order is not sorted) with
// positive combine weights; with hot ≥ 0 every token's first choice is expert `hot` (a group of
// many row tiles).
inline void RandomMoeChoice(SplitMix64& rng, int64_t T, int64_t E, int64_t k, Tensor* idx, Tensor* w,
                            int64_t hot = -1) {
  *idx = Tensor::Host({T, k}, DType::kI32);
  *w = Tensor::Host({T, k});
  std::vector<int32_t> perm(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    std::iota(perm.begin(), perm.end(), 0);
    for (int64_t i = E - 1; i > 0; --i) std::swap(perm[static_cast<size_t>(i)], perm[rng.Next() % (i + 1)]);
    if (hot >= 0) std::swap(perm[0], *std::find(perm.begin(), perm.end(), static_cast<int32_t>(hot)));
    for (int64_t j = 0; j < k; ++j) {
      idx->i32()[t * k + j] = perm[static_cast<size_t>(j)];
      w->f32()[t * k + j] = 0.05f + static_cast<float>(rng.Uniform());
    }
  }
}

}  // namespace kimirt::testing
