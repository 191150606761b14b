// CPU reference kernels of the FFN (spec §3.3, §7): the GLU activation, the MoE router and the
// routed experts, in FP32. Deterministic: the router breaks ties by expert id, and each token's
// expert outputs are combined in its top-k slot order whatever the grouping by expert.
#include "kimirt/backend/cpu/moe_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "kimirt/backend/cpu/gemm.h"

namespace kimirt::cpu {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void Glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor* y) {
  KIMIRT_CHECK(gate.numel() == up.numel() && gate.numel() == y->numel());
  const float* a = gate.f32();
  const float* u = up.f32();
  float* out = y->f32();
  const int64_t n = gate.numel();
  if (p.kind == GluKind::kSilu) {
    for (int64_t i = 0; i < n; ++i) out[i] = a[i] * Sigmoid(a[i]) * u[i];
    return;
  }
  // Spec §3.3: the gate branch uses sigmoid of the RAW a, not of a/beta.
  const float b1 = p.beta;
  for (int64_t i = 0; i < n; ++i) {
    const float s = b1 * std::tanh(a[i] / b1) * Sigmoid(a[i]);
    const float c = p.linear_beta ? *p.linear_beta * std::tanh(u[i] / *p.linear_beta) : u[i];
    out[i] = s * c;
  }
}

void MoeRoute(const Tensor& y, const Tensor& w, const Tensor& bias, const RouteParams& p, Tensor* idx,
              Tensor* weights) {
  const int64_t T = Rows(y), D = Cols(y), E = Rows(w), k = p.top_k;
  const int64_t ks = p.append_expert >= 0 ? k + 1 : k;  // idx / weights row stride
  KIMIRT_CHECK(Cols(w) == D && bias.numel() == E && k >= 1 && k <= E && Cols(*idx) == ks && Cols(*weights) == ks);
  std::vector<float> logits(static_cast<size_t>(T * E));
  Gemm(y.f32(), w.f32(), logits.data(), T, E, D);
  std::vector<float> s(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  std::vector<int32_t> order(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t e = 0; e < E; ++e) {
      s[static_cast<size_t>(e)] = Sigmoid(logits[static_cast<size_t>(t * E + e)]);
      // Spec §7.2: the correction bias only selects (noaux_tc).
      choice[static_cast<size_t>(e)] = s[static_cast<size_t>(e)] + bias.f32()[e];
    }
    std::iota(order.begin(), order.end(), 0);
    // Ties broken by the lower expert id, so selection is deterministic.
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const float ca = choice[static_cast<size_t>(a)], cb = choice[static_cast<size_t>(b)];
      return ca > cb || (ca == cb && a < b);
    });
    float sum = 0.0f;
    for (int64_t j = 0; j < k; ++j) {
      const int32_t e = order[static_cast<size_t>(j)];
      const float wv = p.combine_biased ? choice[static_cast<size_t>(e)] : s[static_cast<size_t>(e)];
      idx->i32()[t * ks + j] = e;
      weights->f32()[t * ks + j] = wv;
      sum += wv;
    }
    for (int64_t j = 0; j < k; ++j) {
      float& wv = weights->f32()[t * ks + j];
      if (p.renormalize && k > 1) wv /= (sum + 1e-20f);
      wv *= p.scaling;
    }
    if (ks > k) {
      idx->i32()[t * ks + k] = p.append_expert;
      weights->f32()[t * ks + k] = 1.0f;
    }
  }
}

void MoeExperts(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                const GluParams& p, Tensor* out) {
  const int64_t T = Rows(z), De = Cols(z), k = Cols(idx);
  const int64_t E = static_cast<int64_t>(ex.gate.size());
  KIMIRT_CHECK_MSG(!ex.mxfp4(), "the CPU backend takes F32 experts (the loader widens MXFP4 ones for it)");
  // Tokens are grouped per expert so each expert runs one GEMM; outputs land in per-slot rows
  // and are combined in slot order afterwards, so a token's sum does not depend on grouping.
  std::vector<std::vector<int64_t>> rows_of(static_cast<size_t>(E));  // flat slot t*k + j
  for (int64_t s = 0; s < T * k; ++s) {
    const int32_t e = idx.i32()[s];
    KIMIRT_CHECK(e >= 0 && e < E);
    rows_of[static_cast<size_t>(e)].push_back(s);
  }
  std::vector<float> slot_out(static_cast<size_t>(T * k * De));
  std::vector<float> xin, g, u, h, o;
  for (int64_t e = 0; e < E; ++e) {
    const std::vector<int64_t>& slots = rows_of[static_cast<size_t>(e)];
    if (slots.empty()) continue;
    const int64_t n = static_cast<int64_t>(slots.size());
    const Tensor& w1 = ex.gate[static_cast<size_t>(e)];
    const int64_t I = Rows(w1);
    xin.resize(static_cast<size_t>(n * De));
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(xin.data() + r * De, z.f32() + (slots[static_cast<size_t>(r)] / k) * De,
                  static_cast<size_t>(De) * sizeof(float));
    }
    g.resize(static_cast<size_t>(n * I));
    u.resize(static_cast<size_t>(n * I));
    h.resize(static_cast<size_t>(n * I));
    o.resize(static_cast<size_t>(n * De));
    Gemm(xin.data(), w1.f32(), g.data(), n, I, De);
    Gemm(xin.data(), ex.up[static_cast<size_t>(e)].f32(), u.data(), n, I, De);
    Tensor gt(nullptr, g.data(), {n, I}, DType::kF32, Device::kCpu);
    Tensor ut(nullptr, u.data(), {n, I}, DType::kF32, Device::kCpu);
    Tensor ht(nullptr, h.data(), {n, I}, DType::kF32, Device::kCpu);
    Glu(gt, ut, p, &ht);
    Gemm(h.data(), ex.down[static_cast<size_t>(e)].f32(), o.data(), n, De, I);
    for (int64_t r = 0; r < n; ++r) {
      std::memcpy(slot_out.data() + slots[static_cast<size_t>(r)] * De, o.data() + r * De,
                  static_cast<size_t>(De) * sizeof(float));
    }
  }
  float* dst = out->f32();
  for (int64_t t = 0; t < T; ++t) {
    float* row = dst + t * De;
    std::fill(row, row + De, 0.0f);
    for (int64_t j = 0; j < k; ++j) {
      const float wv = weights.f32()[t * k + j];
      const float* src = slot_out.data() + (t * k + j) * De;
      for (int64_t d = 0; d < De; ++d) row[d] += wv * src[d];
    }
  }
}

}  // namespace kimirt::cpu
