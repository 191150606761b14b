// CPU implementation of the Backend ops (backend.h) in FP32. The KDA, MLA and MoE kernels live
// in kda_kernels.cpp / mla_kernels.cpp / moe_kernels.cpp (as on CUDA, cuda/*_kernels.cu); the
// small ops are here.
#include "kimirt/backend/cpu/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kimirt/backend/cpu/cpu_kv_storage.h"
#include "kimirt/backend/cpu/gemm.h"
#include "kimirt/backend/cpu/kda_kernels.h"
#include "kimirt/backend/cpu/mla_kernels.h"
#include "kimirt/backend/cpu/moe_kernels.h"
#include "kimirt/core/argmax.h"
#include "kimirt/core/parallel_for.h"

namespace kimirt {
namespace {

float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

class CpuBackend final : public Backend {
 public:
  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::kCpu; }
  // Every op computes a row as it would alone (cpu::Gemm's fixed order of sums, the rest per row
  // or per sequence), so the engine may batch decode steps; 64 as on CUDA.
  int64_t RowInvariantRows() const override { return 64; }

  Tensor Empty(Shape shape, DType dtype) override { return Tensor::Host(std::move(shape), dtype); }
  Tensor Zeros(Shape shape, DType dtype) override { return Tensor::Host(std::move(shape), dtype); }
  Tensor Upload(const Tensor& host) override { return host; }
  Tensor Download(const Tensor& t) override { return t; }
  std::vector<int32_t> ArgmaxRows(const Tensor& logits) override {
    KIMIRT_CHECK(logits.rank() == 2 && logits.dtype() == DType::kF32);
    const int64_t R = logits.dim(0), V = logits.dim(1);
    std::vector<int32_t> ids(static_cast<size_t>(R));
    for (int64_t r = 0; r < R; ++r) ids[static_cast<size_t>(r)] = ArgmaxOf(logits.f32() + r * V, static_cast<size_t>(V));
    return ids;
  }
  std::unique_ptr<KvStorage> MakeKvStorage(const KvStorageShape& shape) override { return MakeCpuKvStorage(shape); }

  void CopyColumns(const Tensor& x, int64_t begin, int64_t count, Tensor* y) override {
    const int64_t T = Rows(x), C = Cols(x);
    KIMIRT_CHECK(begin >= 0 && begin + count <= C && Rows(*y) == T && Cols(*y) == count);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(y->f32() + t * count, x.f32() + t * C + begin, static_cast<size_t>(count) * sizeof(float));
    }
  }

  void CopyColumnsTo(const Tensor& x, int64_t begin, Tensor* y) override {
    const int64_t T = Rows(x), C = Cols(x), N = Cols(*y);
    KIMIRT_CHECK(begin >= 0 && begin + C <= N && Rows(*y) == T);
    for (int64_t t = 0; t < T; ++t) {
      std::memcpy(y->f32() + t * N + begin, x.f32() + t * C, static_cast<size_t>(C) * sizeof(float));
    }
  }

  void Linear(const Tensor& x, const Tensor& w, Tensor* y) override {
    const int64_t T = Rows(x), K = Cols(x), N = Rows(w);
    KIMIRT_CHECK_MSG(Cols(w) == K && Rows(*y) == T && Cols(*y) == N, "Linear shapes");
    cpu::Gemm(x.f32(), w.f32(), y->f32(), T, N, K);
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

  void Glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor* y) override { cpu::Glu(gate, up, p, y); }

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
    cpu::MoeRoute(y, w, bias, p, idx, weights);
  }

  void MoeExperts(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                  const GluParams& p, Tensor* out) override {
    cpu::MoeExperts(z, idx, weights, ex, p, out);
  }
};

}  // namespace

std::unique_ptr<Backend> MakeCpuBackend() { return std::make_unique<CpuBackend>(); }

void SetCpuBackendThreads(int threads) {
  if (threads <= 0) return;
  SetParallelForThreads(threads - 1);  // the caller is the other thread
}

}  // namespace kimirt
