// CPU implementation of the Backend ops (backend.h) in FP32. KDA and MLA cores live in
// kda_kernels.cpp / mla_kernels.cpp; the small ops are here.
#include "kimirt/backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "kimirt/backend/cpu/cpu_kv_storage.h"
#include "kimirt/backend/cpu/kda_kernels.h"
#include "kimirt/backend/cpu/mla_kernels.h"
#include "kimirt/core/parallel_for.h"

namespace kimirt {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

int64_t Rows(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(0); }
int64_t Cols(const Tensor& t) { return Rows(t) == 0 ? 0 : t.numel() / Rows(t); }

// y [m, n] = x [m, k] · w [n, k]ᵀ
void Gemm(const float* x, const float* w, float* y, int64_t m, int64_t n, int64_t k) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(y, y + m * n, 0.0f);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), 1.0f, x, static_cast<int>(k), w, static_cast<int>(k), 0.0f, y,
              static_cast<int>(n));
}

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }

  Tensor Empty(Shape shape, DType dtype) override { return Tensor::Host(std::move(shape), dtype); }
  Tensor Zeros(Shape shape, DType dtype) override { return Tensor::Host(std::move(shape), dtype); }
  Tensor Upload(const Tensor& host) override { return host; }
  Tensor Download(const Tensor& t) override { return t; }
  std::unique_ptr<KvStorage> MakeKvStorage(const KvStorageShape& shape) override { return MakeCpuKvStorage(shape); }

  void CopyColumns(const Tensor& x, int64_t begin, int64_t count, Tensor* y) override {
    const int64_t T = Rows(x), C = Cols(x);
    KIMIRT_CHECK(begin >= 0 && begin + count <= C && Rows(*y) == T && Cols(*y) == count);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(y->f32() + t * count, x.f32() + t * C + begin, static_cast<size_t>(count) * sizeof(float));
    }
  }

  void Linear(const Tensor& x, const Tensor& w, Tensor* y) override {
    const int64_t T = Rows(x), K = Cols(x), N = Rows(w);
    KIMIRT_CHECK_MSG(Cols(w) == K && Rows(*y) == T && Cols(*y) == N, "Linear shapes");
    Gemm(x.f32(), w.f32(), y->f32(), T, N, K);
  }

  void RmsNorm(const Tensor& x, const Tensor& w, float eps, Tensor* y) override {
    const int64_t T = Rows(x), n = Cols(x);
    KIMIRT_CHECK(w.numel() == n && y->numel() == x.numel());
    const float* xs = x.f32();
    const float* ws = w.f32();
    float* ys = y->f32();
    for (int64_t t = 0; t < T; ++t) {
      const float* r = xs + t * n;
      float ss = 0.0f;
      for (int64_t i = 0; i < n; ++i) ss += r[i] * r[i];
      const float inv = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
      for (int64_t i = 0; i < n; ++i) ys[t * n + i] = ws[i] * (r[i] * inv);
    }
  }

  void Add(const Tensor& a, const Tensor& b, Tensor* y) override {
    KIMIRT_CHECK(a.numel() == b.numel() && a.numel() == y->numel());
    const float* pa = a.f32();
    const float* pb = b.f32();
    float* py = y->f32();
    for (int64_t i = 0; i < a.numel(); ++i) py[i] = pa[i] + pb[i];
  }

  void SigmoidMul(const Tensor& x, const Tensor& g, Tensor* y) override {
    KIMIRT_CHECK(x.numel() == g.numel() && x.numel() == y->numel());
    const float* px = x.f32();
    const float* pg = g.f32();
    float* py = y->f32();
    for (int64_t i = 0; i < x.numel(); ++i) py[i] = px[i] * Sigmoid(pg[i]);
  }

  void Glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor* y) override {
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

  void Embedding(std::span<const int32_t> ids, const Tensor& table, int64_t row_begin, Tensor* y) override {
    const int64_t V = Rows(table), D = Cols(table);
    KIMIRT_CHECK(Rows(*y) == static_cast<int64_t>(ids.size()) && Cols(*y) == D);
    for (size_t t = 0; t < ids.size(); ++t) {
      const int64_t r = ids[t] - row_begin;
      float* dst = y->f32() + static_cast<int64_t>(t) * D;
      if (r >= 0 && r < V) {
        std::memcpy(dst, table.f32() + r * D, static_cast<size_t>(D) * sizeof(float));
      } else {
        std::fill(dst, dst + D, 0.0f);
      }
    }
  }

  void AttnResMix(std::span<const Tensor* const> cands, const Tensor& proj, const Tensor& norm_w,
                  float eps, Tensor* y) override {
    const int64_t n = static_cast<int64_t>(cands.size());
    KIMIRT_CHECK(n >= 1);
    const int64_t T = Rows(*cands[0]), D = Cols(*cands[0]);
    // Spec §8.2 step 3: the reference folds the key-norm gain into the pseudo-query.
    std::vector<float> q(static_cast<size_t>(D));
    for (int64_t d = 0; d < D; ++d) q[static_cast<size_t>(d)] = norm_w.f32()[d] * proj.f32()[d];
    std::vector<float> score(static_cast<size_t>(n));
    float* out = y->f32();
    for (int64_t t = 0; t < T; ++t) {
      float mx = -INFINITY;
      for (int64_t i = 0; i < n; ++i) {
        const float* v = cands[static_cast<size_t>(i)]->f32() + t * D;
        float ss = 0.0f, dot = 0.0f;
        for (int64_t d = 0; d < D; ++d) {
          ss += v[d] * v[d];
          dot += q[static_cast<size_t>(d)] * v[d];
        }
        // q · (v * rsqrt(mean(v²) + eps)) = rsqrt(...) * (q · v)
        score[static_cast<size_t>(i)] = dot / std::sqrt(ss / static_cast<float>(D) + eps);
        mx = std::max(mx, score[static_cast<size_t>(i)]);
      }
      float z = 0.0f;
      for (float& s : score) z += (s = std::exp(s - mx));
      float* o = out + t * D;
      std::fill(o, o + D, 0.0f);
      for (int64_t i = 0; i < n; ++i) {
        const float p = score[static_cast<size_t>(i)] / z;
        const float* v = cands[static_cast<size_t>(i)]->f32() + t * D;
        for (int64_t d = 0; d < D; ++d) o[d] += p * v[d];
      }
    }
  }

  void CausalConvSilu(const Tensor& x, const Tensor& w, Tensor* window, Tensor* y) override {
    cpu::CausalConvSilu(x.f32(), Rows(x), Cols(x), w.f32(), Cols(w), window->f32(), y->f32());
  }

  void KdaLogDecay(const Tensor& f, const Tensor& a_log, const Tensor& dt_bias,
                   std::optional<float> lower_bound, Tensor* alpha) override {
    cpu::KdaGateParams p;
    p.heads = a_log.numel();
    p.head_dim = dt_bias.numel() / p.heads;
    p.a_log = a_log.f32();
    p.dt_bias = dt_bias.f32();
    p.lower_bound = lower_bound;
    cpu::KdaLogDecay(f.f32(), Rows(f), p, alpha->f32());
  }

  void KdaCore(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& beta_logits,
               const Tensor& alpha, int64_t heads, KdaForm form, Tensor* state, Tensor* o) override {
    cpu::KdaCoreArgs a;
    a.tokens = Rows(q);
    a.heads = heads;
    a.head_dim = Cols(q) / heads;
    a.q = q.f32();
    a.k = k.f32();
    a.v = v.f32();
    a.beta_logits = beta_logits.f32();
    a.alpha = alpha.f32();
    if (form == KdaForm::kChunked) {
      cpu::KdaChunked(a, state->f32(), o->f32());
    } else {
      cpu::KdaRecurrent(a, state->f32(), o->f32());
    }
  }

  void GatedRmsNorm(const Tensor& x, const Tensor& g, const Tensor& w, float eps, Tensor* y) override {
    const int64_t K = w.numel();
    cpu::GatedRmsNorm(x.f32(), g.f32(), w.f32(), Rows(x), Cols(x) / K, K, eps, y->f32());
  }

  void MlaAttention(const Tensor& q, const Tensor& cache_c, const Tensor& cache_ks, const Tensor& w_kvb,
                    const MlaShape& s, int64_t start, MlaForm form, Tensor* o) override {
    cpu::MlaAttentionArgs a;
    a.tokens = Rows(q);
    a.start = start;
    a.heads = s.heads;
    a.nope_dim = s.nope_dim;
    a.rope_dim = s.rope_dim;
    a.v_dim = s.v_dim;
    a.latent_dim = s.latent_dim;
    a.q = q.f32();
    a.cache_c = cache_c.f32();
    a.cache_ks = cache_ks.f32();
    a.w_kvb = w_kvb.f32();
    a.scale = 1.0f / std::sqrt(static_cast<float>(s.nope_dim + s.rope_dim));
    if (form == MlaForm::kAbsorbed) {
      cpu::MlaAttentionAbsorbed(a, o->f32());
    } else {
      cpu::MlaAttentionExpanded(a, o->f32());
    }
  }

  void MoeRoute(const Tensor& y, const Tensor& w, const Tensor& bias, const RouteParams& p, Tensor* idx,
                Tensor* weights) override {
    const int64_t T = Rows(y), D = Cols(y), E = Rows(w), k = p.top_k;
    KIMIRT_CHECK(Cols(w) == D && bias.numel() == E && k >= 1 && k <= E);
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
        idx->i32()[t * k + j] = e;
        weights->f32()[t * k + j] = wv;
        sum += wv;
      }
      for (int64_t j = 0; j < k; ++j) {
        float& wv = weights->f32()[t * k + j];
        if (p.renormalize && k > 1) wv /= (sum + 1e-20f);
        wv *= p.scaling;
      }
    }
  }

  void MoeExperts(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                  const GluParams& p, Tensor* out) override {
    const int64_t T = Rows(z), De = Cols(z), k = Cols(idx);
    const int64_t E = static_cast<int64_t>(ex.gate.size());
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
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

void SetCpuBackendThreads(int threads) {
  if (threads <= 0) return;
  openblas_set_num_threads(threads);
  SetParallelForThreads(threads - 1);  // the caller is the other thread
}

}  // namespace kimirt
