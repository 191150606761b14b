// CPU reference kernels of NoPE MLA attention (spec §6.2–§6.6): the expanded form and the
// weight-absorbed form over one sequence's contiguous latent cache, in FP32.
//
// Thread-safety: pure functions. They read only the argument arrays, write only `o`, and keep no
// state, so concurrent calls are safe as long as their `o` arrays do not overlap. Single-threaded
// and deterministic: the same inputs give the same bits on every run (fixed loop order, no
// reassociation).
//
// Both forms loop over heads; per head, a query t attends to cache positions 0 .. start+t (spec
// §6.4, causal; no rotary anywhere, §6.3). The masked positions are never visited, which is the
// same as a score of -inf. Because the work for query t depends only on cache rows 0 .. start+t
// and on nothing else of the call, computing T tokens at once gives the same bits as computing
// them one at a time or in chunks.
#include "kimirt/backend/cpu/mla_kernels.h"

#include "kimirt/core/parallel_for.h"

#include <cmath>
#include <cstddef>
#include <vector>

#include "kimirt/core/check.h"

namespace kimirt::cpu {
namespace {

void CheckArgs(const MlaAttentionArgs& a, const float* o) {
  KIMIRT_CHECK(a.tokens >= 0 && a.start >= 0);
  KIMIRT_CHECK(a.heads > 0 && a.nope_dim > 0 && a.rope_dim >= 0 && a.v_dim > 0 &&
               a.latent_dim > 0);
  if (a.tokens == 0) return;
  KIMIRT_CHECK(a.q != nullptr && a.cache_c != nullptr && a.w_kvb != nullptr && o != nullptr);
  KIMIRT_CHECK(a.rope_dim == 0 || a.cache_ks != nullptr);
  KIMIRT_CHECK_MSG(std::isfinite(a.scale) && a.scale > 0.0f,
                   "MLA softmax scale must be set (1/sqrt(dn + dr), spec §6.4)");
}

// One FP32 accumulator, left to right.
float Dot(const float* x, const float* y, int64_t n) {
  float s = 0.0f;
  for (int64_t i = 0; i < n; ++i) s += x[i] * y[i];
  return s;
}

// y[0..n) += alpha * x[0..n)
void Axpy(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

// scores[0..n) := exp(scores - max) in place; returns 1 / their sum. Subtracting the max keeps
// exp() in range however large the raw scores are (the largest term is exp(0) = 1, so the sum is
// in [1, n]) — spec §6.4 asks for the softmax in FP32, where exp overflows above ~88.7.
float SoftmaxUnnormalized(float* scores, int64_t n) {
  float max = scores[0];
  for (int64_t s = 1; s < n; ++s) max = scores[s] > max ? scores[s] : max;
  float sum = 0.0f;
  for (int64_t s = 0; s < n; ++s) {
    scores[s] = std::exp(scores[s] - max);
    sum += scores[s];
  }
  return 1.0f / sum;
}

}  // namespace

void MlaAttentionExpanded(const MlaAttentionArgs& a, float* o) {
  CheckArgs(a, o);
  if (a.tokens == 0) return;
  const int64_t T = a.tokens, H = a.heads, dn = a.nope_dim, dr = a.rope_dim, dv = a.v_dim,
                r = a.latent_dim;
  const int64_t S = a.start + T;  // cached positions this call sees
  const int64_t dq = dn + dr;

  // Per head, k_n and v of every cached position, computed once per call (not once per query):
  // that is S·(dn+dv)·r work per head, and the attention itself S·T·(dq+dv), so a prefill stays
  // quadratic in its length. Reused across heads.
  // Heads are independent and write disjoint outputs: one task per head, each with its own
  // scratch, so the result does not depend on the thread count.
  ParallelFor(H, [&](int64_t h) {
    std::vector<float> kn(static_cast<size_t>(S * dn));
    std::vector<float> v(static_cast<size_t>(S * dv));
    std::vector<float> p(static_cast<size_t>(S));
    // W_UK,h = rows [h(dn+dv), h(dn+dv)+dn) of kv_b_proj, W_UV,h = the next dv rows (§2.5, §6.2).
    const float* w_uk = a.w_kvb + h * (dn + dv) * r;
    const float* w_uv = w_uk + dn * r;
    for (int64_t s = 0; s < S; ++s) {
      const float* c = a.cache_c + s * r;
      for (int64_t i = 0; i < dn; ++i) kn[s * dn + i] = Dot(w_uk + i * r, c, r);
      for (int64_t i = 0; i < dv; ++i) v[s * dv + i] = Dot(w_uv + i * r, c, r);
    }

    for (int64_t t = 0; t < T; ++t) {
      const float* q = a.q + (t * H + h) * dq;  // [q_n ‖ q_s]
      const int64_t len = a.start + t + 1;      // causal: positions 0 .. start+t
      for (int64_t s = 0; s < len; ++s) {
        // q · [k_n ‖ k_s]: one accumulator over the concatenated key; the dr shared-key dims
        // are the same for every head and unrotated (§6.2, §6.3).
        float dot = Dot(q, kn.data() + s * dn, dn);
        const float* ks = a.cache_ks + s * dr;
        for (int64_t i = 0; i < dr; ++i) dot += q[dn + i] * ks[i];
        p[s] = a.scale * dot;
      }
      const float inv_sum = SoftmaxUnnormalized(p.data(), len);

      float* out = o + (t * H + h) * dv;
      for (int64_t i = 0; i < dv; ++i) out[i] = 0.0f;
      for (int64_t s = 0; s < len; ++s) Axpy(p[s], v.data() + s * dv, out, dv);
      for (int64_t i = 0; i < dv; ++i) out[i] *= inv_sum;
    }
  });
}

void MlaAttentionAbsorbed(const MlaAttentionArgs& a, float* o) {
  KIMIRT_CHECK(a.tokens == 0 || a.cache_c != nullptr);
  MlaAttentionAbsorbedRows(
      a,
      [&a](int64_t s, float*, const float** c, const float** ks) {
        *c = a.cache_c + s * a.latent_dim;
        *ks = a.cache_ks + s * a.rope_dim;
      },
      o);
}

void MlaAttentionAbsorbedRows(const MlaAttentionArgs& a, const LatentRowReader& rows, float* o) {
  MlaAttentionArgs checked = a;
  if (checked.cache_c == nullptr) checked.cache_c = checked.q;  // rows come from `rows`
  if (checked.cache_ks == nullptr) checked.cache_ks = checked.q;
  CheckArgs(checked, o);
  if (a.tokens == 0) return;
  const int64_t T = a.tokens, H = a.heads, dn = a.nope_dim, dr = a.rope_dim, dv = a.v_dim,
                r = a.latent_dim;
  const int64_t dq = dn + dr;

  ParallelFor(H, [&](int64_t h) {
    std::vector<float> q_bar(static_cast<size_t>(r));
    std::vector<float> o_bar(static_cast<size_t>(r));
    std::vector<float> p(static_cast<size_t>(a.start + T));
    std::vector<float> scratch(static_cast<size_t>(r + a.rope_dim));
    const float* w_uk = a.w_kvb + h * (dn + dv) * r;  // [dn, r]
    const float* w_uv = w_uk + dn * r;                // [dv, r]
    for (int64_t t = 0; t < T; ++t) {
      const float* q_n = a.q + (t * H + h) * dq;
      const float* q_s = q_n + dn;

      // q̄ = W_UKᵀ q_n (§6.6), as a sum of W_UK's rows so memory is read row by row.
      for (int64_t j = 0; j < r; ++j) q_bar[j] = 0.0f;
      for (int64_t i = 0; i < dn; ++i) Axpy(q_n[i], w_uk + i * r, q_bar.data(), r);

      // score(t, s) = scale · (q̄ · c_s + q_s · k_s,s), causal (§6.6, §6.4).
      const int64_t len = a.start + t + 1;
      for (int64_t s = 0; s < len; ++s) {
        const float *c = nullptr, *ks = nullptr;
        rows(s, scratch.data(), &c, &ks);
        const float latent = Dot(q_bar.data(), c, r);
        const float shared = Dot(q_s, ks, dr);
        p[s] = a.scale * (latent + shared);
      }
      const float inv_sum = SoftmaxUnnormalized(p.data(), len);

      // ō = Σ_s p c_s in the latent space, then o = W_UV ō (§6.6).
      for (int64_t j = 0; j < r; ++j) o_bar[j] = 0.0f;
      for (int64_t s = 0; s < len; ++s) {
        const float *c = nullptr, *ks = nullptr;
        rows(s, scratch.data(), &c, &ks);
        Axpy(p[s], c, o_bar.data(), r);
      }
      for (int64_t j = 0; j < r; ++j) o_bar[j] *= inv_sum;

      float* out = o + (t * H + h) * dv;
      for (int64_t i = 0; i < dv; ++i) out[i] = Dot(w_uv + i * r, o_bar.data(), r);
    }
  });
}

}  // namespace kimirt::cpu
