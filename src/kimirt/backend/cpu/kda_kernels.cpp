// CPU reference kernels of Kimi Delta Attention (spec §3.2, §3.4, §3.5, §5): the short causal
// conv + SiLU, the decay gate, the recurrent and chunked forms of the delta rule, and the gated
// RMSNorm. All FP32, single-threaded, and deterministic: every reduction runs in one fixed order,
// so the same inputs give the same bits.
//
// The KDA core is written per head (KdaRecurrentHead, KdaChunkedHead): heads share nothing but
// read-only inputs and write disjoint slices of state and o, so a caller may later run the heads
// on separate threads without changing a single bit of the results.
#include "kimirt/backend/cpu/kda_kernels.h"

#include "kimirt/core/parallel_for.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kimirt/core/check.h"

namespace kimirt::cpu {
namespace {

// Elementwise activations, written out so the op order is fixed (spec §3.5, §5.3).
inline float Sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }
inline float Silu(float x) { return x / (1.0f + std::exp(-x)); }

// torch.nn.functional.softplus with beta 1 and threshold 20: above the threshold
// log1p(exp(x)) == x in FP32 anyway, and exp(x) would overflow for x > 88.
inline float Softplus(float x) { return x > 20.0f ? x : std::log1p(std::exp(x)); }

// dst = src * rsqrt(sum(src^2) + 1e-6) * scale (spec §3.4: eps inside the sqrt of the SUM).
// The scale (1/sqrt(K) for q, 1 for k) is applied after the normalization as fla does.
void L2NormScaled(const float* src, int64_t n, float scale, float* dst) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += src[i] * src[i];
  const float rstd = 1.0f / std::sqrt(sum + 1e-6f);
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] * rstd * scale;
}

// Strides of the [T, H, K] inputs and outputs of the KDA core.
struct HeadView {
  int64_t H, K;
  int64_t Row(int64_t t, int64_t h) const { return (t * H + h) * K; }
};

// One head, all tokens, token by token (spec §5.4). S is this head's [K, K] state.
void KdaRecurrentHead(const KdaCoreArgs& a, int64_t h, float* S, float* o) {
  const int64_t K = a.head_dim;
  const HeadView hv{a.heads, K};
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(K));
  std::vector<float> q(K), k(K), p(K), out(K);
  for (int64_t t = 0; t < a.tokens; ++t) {
    const int64_t row = hv.Row(t, h);
    L2NormScaled(a.q + row, K, q_scale, q.data());
    L2NormScaled(a.k + row, K, 1.0f, k.data());
    const float beta = Sigmoid(a.beta_logits[t * a.heads + h]);
    const float* alpha = a.alpha + row;
    const float* v = a.v + row;
    // Steps 1-2: decay row d, then accumulate its share of p = k̂ᵀS (d ascending for every j).
    std::fill(p.begin(), p.end(), 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * K;
      const float decay = std::exp(alpha[d]);
      for (int64_t j = 0; j < K; ++j) {
        Sd[j] *= decay;
        p[j] += k[d] * Sd[j];
      }
    }
    // Step 3: δ = β (v − p), kept in p.
    for (int64_t j = 0; j < K; ++j) p[j] = beta * (v[j] - p[j]);
    // Steps 4-5: rank-1 write, then read o = q̂ᵀS from the updated rows.
    std::fill(out.begin(), out.end(), 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      float* Sd = S + d * K;
      for (int64_t j = 0; j < K; ++j) {
        Sd[j] += k[d] * p[j];
        out[j] += q[d] * Sd[j];
      }
    }
    std::memcpy(o + row, out.data(), sizeof(float) * K);
  }
}

// Scratch for one chunk of one head; sized once per call, reused across chunks.
struct ChunkScratch {
  int64_t C, K;
  std::vector<float> q, k, v, beta;  // [C,K] normalized q̂ (scaled), k̂; v; β [C]
  std::vector<float> exp_gamma;      // [C,K] exp(Γ_r)            (decay from chunk start)
  std::vector<float> exp_gamma_last; // [K]   exp(Γ_{L−1})        (decay over the whole chunk)
  std::vector<float> k_to_end;       // [C,K] k̂_c ⊙ exp(Γ_{L−1} − Γ_c)
  std::vector<float> A, Aqk, Tm;     // [C,C] A (strictly lower), masked q̂k̂ scores, T
  std::vector<float> W, U;           // [C,K] WY factors; U becomes V' = U − W S in place
  std::vector<float> dsum, e;        // [K]   running Γ_r − Γ_c and its exp
  ChunkScratch(int64_t c, int64_t k_dim)
      : C(c), K(k_dim), q(c * k_dim), k(c * k_dim), v(c * k_dim), beta(c),
        exp_gamma(c * k_dim), exp_gamma_last(k_dim), k_to_end(c * k_dim), A(c * c), Aqk(c * c),
        Tm(c * c), W(c * k_dim), U(c * k_dim), dsum(k_dim), e(k_dim) {}
};

// Loads tokens t0 .. t0+L−1 of head h: normalized q̂, k̂, raw v, β (spec §5.3).
void LoadChunk(const KdaCoreArgs& a, int64_t h, int64_t t0, int64_t L, ChunkScratch& s) {
  const int64_t K = s.K;
  const HeadView hv{a.heads, K};
  const float q_scale = 1.0f / std::sqrt(static_cast<float>(K));
  for (int64_t r = 0; r < L; ++r) {
    const int64_t row = hv.Row(t0 + r, h);
    L2NormScaled(a.q + row, K, q_scale, &s.q[r * K]);
    L2NormScaled(a.k + row, K, 1.0f, &s.k[r * K]);
    std::memcpy(&s.v[r * K], a.v + row, sizeof(float) * K);
    s.beta[r] = Sigmoid(a.beta_logits[(t0 + r) * a.heads + h]);
  }
}

// Every decay factor of the chunk, each as exp(Σ_{i=c+1..r} α_i) with the sum taken directly
// over the α's in token order (spec §5.5 "exponent arguments are always ≤ 0").
//
// Why not exp(Γ_r)·exp(−Γ_c): with α down to −5 per token, Γ reaches −320 over 64 tokens and
// exp(−Γ_c) overflows FP32 (and exp(Γ_r) underflows), giving inf·0 = NaN. Why not exp(Γ_r − Γ_c)
// from the cumulative sums: once |Γ| is large its FP32 ulp is large (3e-5 at 320), and the
// difference of two large sums loses that much absolute accuracy even when Γ_r − Γ_c is near 0,
// i.e. exactly where the factor is near 1 and matters. Summing α_{c+1..r} directly keeps the
// error relative to the difference itself. All arguments are ≤ 0 (the gates give α ≤ 0), so an
// exp can only underflow, and only when the true factor is below 1e-38, i.e. the term it scales
// is negligible; nothing overflows and no NaN can appear.
//
// Fills, for r ≥ c:   A[r,c] (r > c) = −β_r Σ_d k̂_r k̂_c exp(Γ_r − Γ_c)
//                     Aqk[r,c]       =  Σ_d q̂_r k̂_c exp(Γ_r − Γ_c)   (diagonal included)
//                     k_to_end[c]    =  k̂_c ⊙ exp(Γ_{L−1} − Γ_c)
//                     exp_gamma[r]   =  exp(Γ_r), exp_gamma_last = exp(Γ_{L−1})
// O(L² K) exps per chunk: a reference kernel trades speed for the safe form.
void ChunkDecays(const float* alpha, int64_t alpha_stride, int64_t L, ChunkScratch& s) {
  const int64_t K = s.K, C = s.C;
  // From the chunk start ("c = −1"): Γ_r itself.
  std::fill(s.dsum.begin(), s.dsum.end(), 0.0f);
  for (int64_t r = 0; r < L; ++r) {
    const float* ar = alpha + r * alpha_stride;
    for (int64_t d = 0; d < K; ++d) {
      s.dsum[d] += ar[d];
      s.exp_gamma[r * K + d] = std::exp(s.dsum[d]);
    }
  }
  std::memcpy(s.exp_gamma_last.data(), &s.exp_gamma[(L - 1) * K], sizeof(float) * K);
  // From each in-chunk token c.
  for (int64_t c = 0; c < L; ++c) {
    const float* kc = &s.k[c * K];
    std::fill(s.dsum.begin(), s.dsum.end(), 0.0f);
    for (int64_t r = c; r < L; ++r) {
      if (r > c) {
        const float* ar = alpha + r * alpha_stride;
        for (int64_t d = 0; d < K; ++d) s.dsum[d] += ar[d];
      }
      for (int64_t d = 0; d < K; ++d) s.e[d] = std::exp(s.dsum[d]);
      const float* kr = &s.k[r * K];
      const float* qr = &s.q[r * K];
      float kk = 0.0f, qk = 0.0f;
      for (int64_t d = 0; d < K; ++d) {
        const float kce = kc[d] * s.e[d];
        kk += kr[d] * kce;
        qk += qr[d] * kce;
      }
      s.A[r * C + c] = r > c ? -s.beta[r] * kk : 0.0f;
      s.Aqk[r * C + c] = qk;
    }
    for (int64_t d = 0; d < K; ++d) s.k_to_end[c * K + d] = kc[d] * s.e[d];
  }
}

// T = (I − A)^{-1} diag(β) by forward substitution over rows (spec §5.5): with N = (I − A)^{-1},
// N = I + A N, so N[r,c] = A[r,c] + Σ_{c<m<r} A[r,m] N[m,c] for c < r and N[r,r] = 1.
void SolveT(int64_t L, ChunkScratch& s) {
  const int64_t C = s.C;
  for (int64_t r = 0; r < L; ++r) {
    for (int64_t c = 0; c < r; ++c) {
      float n = s.A[r * C + c];
      for (int64_t m = c + 1; m < r; ++m) n += s.A[r * C + m] * s.Tm[m * C + c];
      s.Tm[r * C + c] = n;  // N for now; β scaling after the row is complete
    }
    s.Tm[r * C + r] = 1.0f;
  }
  // The recursion above reads N of earlier rows, so scale columns only once all rows exist.
  for (int64_t r = 0; r < L; ++r)
    for (int64_t c = 0; c <= r; ++c) s.Tm[r * C + c] *= s.beta[c];
}

// W = T (exp(Γ) ⊙ K̂), U = T V, then V' = U − W S (kept in U) with the incoming state S.
void ComputeVPrime(int64_t L, const float* S, ChunkScratch& s) {
  const int64_t K = s.K, C = s.C;
  for (int64_t r = 0; r < L; ++r) {
    float* Wr = &s.W[r * K];
    float* Ur = &s.U[r * K];
    std::fill(Wr, Wr + K, 0.0f);
    std::fill(Ur, Ur + K, 0.0f);
    for (int64_t c = 0; c <= r; ++c) {
      const float t = s.Tm[r * C + c];
      const float* kc = &s.k[c * K];
      const float* gc = &s.exp_gamma[c * K];
      const float* vc = &s.v[c * K];
      for (int64_t d = 0; d < K; ++d) {
        Wr[d] += t * (gc[d] * kc[d]);
        Ur[d] += t * vc[d];
      }
    }
    // Ur −= Wr S: accumulate Wr S in d order, then subtract once.
    std::vector<float>& ws = s.e;  // K floats of free scratch at this point
    std::fill(ws.begin(), ws.end(), 0.0f);
    for (int64_t d = 0; d < K; ++d) {
      const float w = Wr[d];
      const float* Sd = S + d * K;
      for (int64_t j = 0; j < K; ++j) ws[j] += w * Sd[j];
    }
    for (int64_t j = 0; j < K; ++j) Ur[j] -= ws[j];
  }
}

// O_r = (q̂_r ⊙ exp(Γ_r))ᵀ S + Σ_{c≤r} Aqk[r,c] V'_c, with S the incoming state.
void ChunkOutputs(const KdaCoreArgs& a, int64_t h, int64_t t0, int64_t L, const float* S,
                  const ChunkScratch& s, float* o) {
  const int64_t K = s.K, C = s.C;
  const HeadView hv{a.heads, K};
  for (int64_t r = 0; r < L; ++r) {
    float* out = o + hv.Row(t0 + r, h);
    std::fill(out, out + K, 0.0f);
    const float* qr = &s.q[r * K];
    const float* gr = &s.exp_gamma[r * K];
    for (int64_t d = 0; d < K; ++d) {
      const float qg = qr[d] * gr[d];
      const float* Sd = S + d * K;
      for (int64_t j = 0; j < K; ++j) out[j] += qg * Sd[j];
    }
    for (int64_t c = 0; c <= r; ++c) {
      const float w = s.Aqk[r * C + c];
      const float* vc = &s.U[c * K];
      for (int64_t j = 0; j < K; ++j) out[j] += w * vc[j];
    }
  }
}

// S ← exp(Γ_{L−1}) ⊙_rows S + (K̂ ⊙ exp(Γ_{L−1} − Γ))ᵀ V'.
void ChunkStateUpdate(int64_t L, const ChunkScratch& s, float* S) {
  const int64_t K = s.K;
  for (int64_t d = 0; d < K; ++d) {
    float* Sd = S + d * K;
    const float decay = s.exp_gamma_last[d];
    for (int64_t j = 0; j < K; ++j) Sd[j] *= decay;
    for (int64_t c = 0; c < L; ++c) {
      const float kd = s.k_to_end[c * K + d];
      const float* vc = &s.U[c * K];
      for (int64_t j = 0; j < K; ++j) Sd[j] += kd * vc[j];
    }
  }
}

// One head, all tokens, chunk by chunk (spec §5.5). S is this head's [K, K] state.
void KdaChunkedHead(const KdaCoreArgs& a, int64_t h, int64_t chunk, float* S, float* o) {
  const int64_t K = a.head_dim;
  const HeadView hv{a.heads, K};
  ChunkScratch s(std::min(chunk, a.tokens), K);
  for (int64_t t0 = 0; t0 < a.tokens; t0 += chunk) {
    const int64_t L = std::min(chunk, a.tokens - t0);
    LoadChunk(a, h, t0, L, s);
    ChunkDecays(a.alpha + hv.Row(t0, h), a.heads * K, L, s);
    SolveT(L, s);
    ComputeVPrime(L, S, s);
    ChunkOutputs(a, h, t0, L, S, s, o);  // reads the incoming S, so before the update
    ChunkStateUpdate(L, s, S);
  }
}

}  // namespace

void CausalConvSilu(const float* x, int64_t T, int64_t C, const float* w, int64_t W, float* window,
                    float* y) {
  KIMIRT_CHECK(W >= 1);
  const int64_t hist = W - 1;
  // Input at relative time src (≥ −hist): x for src ≥ 0, else the carried window row.
  auto input_row = [&](int64_t src) {
    return src >= 0 ? x + src * C : window + (hist + src) * C;
  };
  for (int64_t t = 0; t < T; ++t) {
    float* yt = y + t * C;
    std::fill(yt, yt + C, 0.0f);
    // Taps in order j = 0..W−1 for every output, so a split sequence gives the same bits.
    for (int64_t j = 0; j < W; ++j) {
      const float* xs = input_row(t - hist + j);
      for (int64_t c = 0; c < C; ++c) yt[c] += w[c * W + j] * xs[c];
    }
    for (int64_t c = 0; c < C; ++c) yt[c] = Silu(yt[c]);
  }
  // New window = last `hist` rows of (window ++ x) (spec §5.7), oldest first.
  if (hist == 0 || T == 0) return;
  if (T >= hist) {
    std::memcpy(window, x + (T - hist) * C, sizeof(float) * hist * C);
  } else {
    std::memmove(window, window + T * C, sizeof(float) * (hist - T) * C);
    std::memcpy(window + (hist - T) * C, x, sizeof(float) * T * C);
  }
}

void KdaLogDecay(const float* f, int64_t T, const KdaGateParams& p, float* alpha) {
  const int64_t H = p.heads, K = p.head_dim;
  for (int64_t h = 0; h < H; ++h) {
    const float a = std::exp(p.a_log[h]);
    for (int64_t t = 0; t < T; ++t) {
      const int64_t base = t * H * K + h * K;
      for (int64_t d = 0; d < K; ++d) {
        const float x = f[base + d] + p.dt_bias[h * K + d];
        // The lower bound is reached through the sigmoid, not by clamping (spec §5.3).
        alpha[base + d] = p.lower_bound ? *p.lower_bound * Sigmoid(a * x) : -a * Softplus(x);
      }
    }
  }
}

void KdaRecurrent(const KdaCoreArgs& a, float* state, float* o) {
  // Heads are independent (see the top of the file): each writes only its own state and output
  // slices, so running them on several threads changes no bit.
  ParallelFor(a.heads, [&](int64_t h) { KdaRecurrentHead(a, h, state + h * a.head_dim * a.head_dim, o); });
}

void KdaChunked(const KdaCoreArgs& a, float* state, float* o, int64_t chunk) {
  KIMIRT_CHECK(chunk >= 1);
  if (a.tokens == 0) return;
  ParallelFor(a.heads, [&](int64_t h) { KdaChunkedHead(a, h, chunk, state + h * a.head_dim * a.head_dim, o); });
}

void GatedRmsNorm(const float* x, const float* g, const float* w, int64_t T, int64_t H, int64_t K,
                  float eps, float* y) {
  for (int64_t row = 0; row < T * H; ++row) {
    const float* xr = x + row * K;
    const float* gr = g + row * K;
    float* yr = y + row * K;
    float sum = 0.0f;
    for (int64_t d = 0; d < K; ++d) sum += xr[d] * xr[d];
    const float rstd = 1.0f / std::sqrt(sum / static_cast<float>(K) + eps);
    // Weight before gate (spec §3.2).
    for (int64_t d = 0; d < K; ++d) yr[d] = xr[d] * rstd * w[d] * Sigmoid(gr[d]);
  }
}

void KdaDecode(const KdaDecodeArgs& a) {
  const int64_t H = a.heads, K = a.head_dim, P = H * K, W = a.conv_taps, hist = W - 1;
  KIMIRT_CHECK(H >= 1 && K >= 1 && W >= 1);
  std::vector<float> q(P), k(P), v(P), alpha(P), o(P);
  KdaGateParams gp{H, K, a.a_log, a.dt_bias, std::nullopt};
  if (a.has_lower_bound) gp.lower_bound = a.lower_bound;
  for (int64_t b = 0; b < a.rows; ++b) {
    const int64_t slot = a.slots[b];
    KIMIRT_CHECK_MSG(slot >= 0 && slot < a.slot_count, "KdaDecode: slot out of range");
    const int64_t row = b * P;
    CausalConvSilu(a.q + row, 1, P, a.conv_q, W, a.window_q + slot * hist * P, q.data());
    CausalConvSilu(a.k + row, 1, P, a.conv_k, W, a.window_k + slot * hist * P, k.data());
    CausalConvSilu(a.v + row, 1, P, a.conv_v, W, a.window_v + slot * hist * P, v.data());
    KdaLogDecay(a.f + row, 1, gp, alpha.data());
    const KdaCoreArgs core{1, H, K, q.data(), k.data(), v.data(), a.beta_logits + b * H, alpha.data()};
    KdaRecurrent(core, a.recurrent + slot * H * K * K, o.data());
    GatedRmsNorm(o.data(), a.gate + row, a.o_norm, 1, H, K, a.norm_eps, a.out + row);
  }
}

}  // namespace kimirt::cpu
