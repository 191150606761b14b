// Tests of the KDA CPU kernels (kda_kernels.h): the recurrence against a double-precision
// transcription of spec §5.4, the chunked form (§5.5) against the recurrence, state carrying
// across calls, the causal conv window (§3.5, §5.7), the decay gates (§5.3) and the gated
// RMSNorm (§3.2).
#include "kimirt/backend/cpu/kda_kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/core/random.h"

namespace kimirt::cpu {
namespace {

// max |a − b| / max |b|: errors relative to the scale of the reference, as the tolerances in
// the spec's validation ladder are stated. A NaN anywhere makes the error infinite (std::max
// would silently drop it).
double MaxRelErr(const std::vector<float>& a, const std::vector<double>& b) {
  double err = 0.0, scale = 0.0;
  for (size_t i = 0; i < b.size(); ++i) {
    const double diff = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (std::isnan(diff)) return std::numeric_limits<double>::infinity();
    err = std::max(err, diff);
    scale = std::max(scale, std::fabs(b[i]));
  }
  return scale > 0.0 ? err / scale : err;
}
double MaxRelErr(const std::vector<float>& a, const std::vector<float>& b) {
  return MaxRelErr(a, std::vector<double>(b.begin(), b.end()));
}
// Records a measured error in the test's XML output (--gtest_output=xml), for reports.
void RecordErr(const std::string& key, double err) {
  std::ostringstream s;
  s.precision(2);
  s << std::scientific << err;
  ::testing::Test::RecordProperty(key, s.str());
}
bool AllFinite(const std::vector<float>& x) {
  return std::all_of(x.begin(), x.end(), [](float v) { return std::isfinite(v); });
}
bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

std::vector<float> Normal(SplitMix64& rng, size_t n, double scale = 1.0, double mean = 0.0) {
  std::vector<float> x(n);
  for (float& v : x) v = static_cast<float>(mean + scale * rng.Normal());
  return x;
}

// The three decay regimes the tests cover.
enum class Gate {
  kLowerBound,  // K3: lb = −5, A_log = log U(1,16), dt_bias 0.1 N, f ~ N(0,1)
  kSoftplus,    // Kimi-Linear: A_log = log U(0.1,2), dt_bias −1 + 0.5 N, f ~ N(0,1)
  kStrong,      // K3 gate driven into saturation: α ≈ −5 on every channel of every token
};

// Random inputs of the KDA core with realistic magnitudes; α comes from KdaLogDecay.
struct KdaInputs {
  int64_t T, H, K;
  std::vector<float> q, k, v, beta_logits, alpha, state0;

  KdaInputs(int64_t t, int64_t h, int64_t k_dim, Gate gate, uint64_t seed)
      : T(t), H(h), K(k_dim) {
    SplitMix64 rng(seed);
    const size_t n = static_cast<size_t>(T * H * K);
    q = Normal(rng, n);
    k = Normal(rng, n);
    v = Normal(rng, n);
    beta_logits = Normal(rng, static_cast<size_t>(T * H), 2.0);
    state0 = Normal(rng, static_cast<size_t>(H * K * K), 0.5);
    alpha.resize(n);
    MakeAlpha(rng, gate);
  }

  void MakeAlpha(SplitMix64& rng, Gate gate) {
    std::vector<float> a_log(H), dt_bias;
    KdaGateParams p;
    p.heads = H;
    p.head_dim = K;
    std::vector<float> f = Normal(rng, static_cast<size_t>(T * H * K));
    if (gate == Gate::kSoftplus) {
      for (float& a : a_log) a = static_cast<float>(std::log(0.1 + 1.9 * rng.Uniform()));
      dt_bias = Normal(rng, static_cast<size_t>(H * K), 0.5, -1.0);
    } else {
      for (float& a : a_log) a = static_cast<float>(std::log(1.0 + 15.0 * rng.Uniform()));
      dt_bias = Normal(rng, static_cast<size_t>(H * K), 0.1);
      p.lower_bound = -5.0f;
      if (gate == Gate::kStrong)
        for (float& x : f) x += 30.0f;  // sigmoid(≥ 30) rounds to 1: α = −5 in FP32
    }
    p.a_log = a_log.data();
    p.dt_bias = dt_bias.data();
    KdaLogDecay(f.data(), T, p, alpha.data());
  }

  // The core arguments for tokens t0 .. t0+n−1.
  KdaCoreArgs Args(int64_t t0 = 0, int64_t n = -1) const {
    KdaCoreArgs a;
    a.tokens = n < 0 ? T - t0 : n;
    a.heads = H;
    a.head_dim = K;
    const int64_t row = t0 * H * K;
    a.q = q.data() + row;
    a.k = k.data() + row;
    a.v = v.data() + row;
    a.alpha = alpha.data() + row;
    a.beta_logits = beta_logits.data() + t0 * H;
    return a;
  }
};

// Spec §5.3–§5.4 transcribed literally in double: the ground truth for KdaRecurrent.
void ReferenceKda(const KdaInputs& in, std::vector<double>& S, std::vector<double>& o) {
  const int64_t T = in.T, H = in.H, K = in.K;
  S.assign(in.state0.begin(), in.state0.end());
  o.assign(static_cast<size_t>(T * H * K), 0.0);
  std::vector<double> q(K), k(K), p(K);
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t row = (t * H + h) * K;
      double sq = 0.0, sk = 0.0;
      for (int64_t d = 0; d < K; ++d) {
        sq += double(in.q[row + d]) * in.q[row + d];
        sk += double(in.k[row + d]) * in.k[row + d];
      }
      for (int64_t d = 0; d < K; ++d) {
        q[d] = in.q[row + d] / std::sqrt(sq + 1e-6) / std::sqrt(double(K));
        k[d] = in.k[row + d] / std::sqrt(sk + 1e-6);
      }
      const double beta = 1.0 / (1.0 + std::exp(-double(in.beta_logits[t * H + h])));
      double* Sh = &S[h * K * K];
      for (int64_t d = 0; d < K; ++d)
        for (int64_t j = 0; j < K; ++j) Sh[d * K + j] *= std::exp(double(in.alpha[row + d]));
      for (int64_t j = 0; j < K; ++j) {
        p[j] = 0.0;
        for (int64_t d = 0; d < K; ++d) p[j] += k[d] * Sh[d * K + j];
      }
      for (int64_t d = 0; d < K; ++d)
        for (int64_t j = 0; j < K; ++j)
          Sh[d * K + j] += k[d] * beta * (in.v[row + j] - p[j]);
      for (int64_t j = 0; j < K; ++j)
        for (int64_t d = 0; d < K; ++d) o[row + j] += q[d] * Sh[d * K + j];
    }
  }
}

struct KdaRun {
  std::vector<float> state, o;
};

KdaRun RunRecurrent(const KdaInputs& in) {
  KdaRun r{in.state0, std::vector<float>(in.q.size())};
  KdaRecurrent(in.Args(), r.state.data(), r.o.data());
  return r;
}
KdaRun RunChunked(const KdaInputs& in, int64_t chunk) {
  KdaRun r{in.state0, std::vector<float>(in.q.size())};
  KdaChunked(in.Args(), r.state.data(), r.o.data(), chunk);
  return r;
}

void ExpectRecurrentMatchesReference(Gate gate, int64_t T, int64_t H, int64_t K) {
  const KdaInputs in(T, H, K, gate, 1234 + static_cast<uint64_t>(gate));
  std::vector<double> S_ref, o_ref;
  ReferenceKda(in, S_ref, o_ref);
  const KdaRun got = RunRecurrent(in);
  const double err_o = MaxRelErr(got.o, o_ref), err_s = MaxRelErr(got.state, S_ref);
  EXPECT_LT(err_o, 1e-5) << "T=" << T << " K=" << K;
  EXPECT_LT(err_s, 1e-5) << "T=" << T << " K=" << K;
  RecordErr("max_rel_err_o_K" + std::to_string(K), err_o);
  RecordErr("max_rel_err_S_K" + std::to_string(K), err_s);
}

TEST(KdaRecurrent, MatchesDoubleReferenceLowerBoundGate) {
  ExpectRecurrentMatchesReference(Gate::kLowerBound, 200, 3, 16);
  ExpectRecurrentMatchesReference(Gate::kLowerBound, 40, 2, 128);
}

TEST(KdaRecurrent, MatchesDoubleReferenceSoftplusGate) {
  ExpectRecurrentMatchesReference(Gate::kSoftplus, 200, 3, 16);
  ExpectRecurrentMatchesReference(Gate::kSoftplus, 40, 2, 128);
}

TEST(KdaRecurrent, MatchesDoubleReferenceStrongDecay) {
  ExpectRecurrentMatchesReference(Gate::kStrong, 100, 3, 16);
}

// Chunked == recurrent for one (T, H, K, chunk); returns the larger of the two errors.
double ChunkedVsRecurrentErr(Gate gate, int64_t T, int64_t H, int64_t K, int64_t chunk) {
  const KdaInputs in(T, H, K, gate, 99 * static_cast<uint64_t>(T) + static_cast<uint64_t>(gate));
  const KdaRun rec = RunRecurrent(in);
  const KdaRun chk = RunChunked(in, chunk);
  EXPECT_TRUE(AllFinite(chk.o) && AllFinite(chk.state)) << "T=" << T << " chunk=" << chunk;
  const double err_o = MaxRelErr(chk.o, rec.o), err_s = MaxRelErr(chk.state, rec.state);
  EXPECT_LT(err_o, 1e-5) << "T=" << T << " K=" << K << " chunk=" << chunk;
  EXPECT_LT(err_s, 1e-5) << "T=" << T << " K=" << K << " chunk=" << chunk;
  return std::max(err_o, err_s);
}

void ExpectChunkedMatchesRecurrent(Gate gate) {
  double worst = 0.0;
  for (int64_t T : {1, 5, 63, 64, 65, 130, 200})
    for (int64_t chunk : {64, 16, 7})
      worst = std::max(worst, ChunkedVsRecurrentErr(gate, T, 3, 16, chunk));
  for (int64_t chunk : {64, 16, 7})  // the real head dim
    worst = std::max(worst, ChunkedVsRecurrentErr(gate, 70, 2, 128, chunk));
  RecordErr("max_rel_err", worst);
}

TEST(KdaChunked, MatchesRecurrentLowerBoundGate) {
  ExpectChunkedMatchesRecurrent(Gate::kLowerBound);
}
TEST(KdaChunked, MatchesRecurrentSoftplusGate) {
  ExpectChunkedMatchesRecurrent(Gate::kSoftplus);
}
// α = −5 on every token: Γ reaches −320 within a 64-token chunk, where exp(−Γ) would overflow.
TEST(KdaChunked, MatchesRecurrentStrongDecayWithoutNaN) {
  ExpectChunkedMatchesRecurrent(Gate::kStrong);
}

// Strong decay for the first half of each chunk, then almost none: the late in-chunk factors
// exp(Γ_r − Γ_c) are near 1 while |Γ| is ~160, which is where differences of cumulative sums
// would lose accuracy.
TEST(KdaChunked, MatchesRecurrentStrongThenWeakDecay) {
  KdaInputs in(128, 2, 16, Gate::kSoftplus, 7);
  for (int64_t t = 0; t < in.T; ++t)
    for (int64_t i = 0; i < in.H * in.K; ++i)
      in.alpha[t * in.H * in.K + i] = (t % 64) < 32 ? -5.0f : -0.01f;
  const KdaRun rec = RunRecurrent(in);
  const KdaRun chk = RunChunked(in, 64);
  const double err = std::max(MaxRelErr(chk.o, rec.o), MaxRelErr(chk.state, rec.state));
  EXPECT_LT(err, 1e-5);
  RecordErr("max_rel_err", err);
}

TEST(KdaChunked, ZeroTokensLeaveStateAlone) {
  const KdaInputs in(0, 2, 16, Gate::kLowerBound, 3);
  std::vector<float> s1 = in.state0, s2 = in.state0;
  KdaChunked(in.Args(), s1.data(), nullptr);
  KdaRecurrent(in.Args(), s2.data(), nullptr);
  EXPECT_TRUE(BitwiseEqual(s1, in.state0));
  EXPECT_TRUE(BitwiseEqual(s2, in.state0));
}

// One call over T tokens vs calls over 1, 5 and T − 6 tokens with the state carried (§5.7).
template <typename Kernel>
void ExpectSplitMatchesWhole(Gate gate, Kernel kernel) {
  const KdaInputs in(100, 3, 16, gate, 42);
  KdaRun whole{in.state0, std::vector<float>(in.q.size())};
  kernel(in.Args(), whole.state.data(), whole.o.data());
  KdaRun split{in.state0, std::vector<float>(in.q.size())};
  int64_t t0 = 0;
  for (int64_t n : {int64_t{1}, int64_t{5}, in.T - 6}) {
    kernel(in.Args(t0, n), split.state.data(), split.o.data() + t0 * in.H * in.K);
    t0 += n;
  }
  const double err = std::max(MaxRelErr(split.o, whole.o), MaxRelErr(split.state, whole.state));
  EXPECT_LT(err, 1e-6);
  RecordErr("max_rel_err", err);
}

void Recurrent(const KdaCoreArgs& a, float* s, float* o) { KdaRecurrent(a, s, o); }
void Chunked(const KdaCoreArgs& a, float* s, float* o) { KdaChunked(a, s, o, 16); }

TEST(KdaSplit, RecurrentCarriesStateLowerBoundGate) {
  ExpectSplitMatchesWhole(Gate::kLowerBound, Recurrent);
}
TEST(KdaSplit, RecurrentCarriesStateSoftplusGate) {
  ExpectSplitMatchesWhole(Gate::kSoftplus, Recurrent);
}
TEST(KdaSplit, ChunkedCarriesStateLowerBoundGate) {
  ExpectSplitMatchesWhole(Gate::kLowerBound, Chunked);
}
TEST(KdaSplit, ChunkedCarriesStateSoftplusGate) {
  ExpectSplitMatchesWhole(Gate::kSoftplus, Chunked);
}

// ---- CausalConvSilu (§3.5) ----

std::vector<double> ReferenceConv(const std::vector<float>& x, int64_t T, int64_t C,
                                  const std::vector<float>& w, int64_t W) {
  std::vector<double> y(static_cast<size_t>(T * C));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t c = 0; c < C; ++c) {
      double acc = 0.0;
      for (int64_t j = 0; j < W; ++j) {
        const int64_t src = t - (W - 1) + j;
        if (src >= 0) acc += double(w[c * W + j]) * x[src * C + c];
      }
      y[t * C + c] = acc / (1.0 + std::exp(-acc));
    }
  return y;
}

void ExpectConvCorrectAndSplittable(int64_t W) {
  const int64_t T = 23, C = 10;
  SplitMix64 rng(W);
  const std::vector<float> x = Normal(rng, T * C), w = Normal(rng, C * W, 0.5);
  // One call from a zero window vs the naive reference.
  std::vector<float> window(static_cast<size_t>((W - 1) * C), 0.0f), y(T * C);
  CausalConvSilu(x.data(), T, C, w.data(), W, window.data(), y.data());
  EXPECT_LT(MaxRelErr(y, ReferenceConv(x, T, C, w, W)), 1e-6);
  // The final window holds the last W − 1 inputs.
  EXPECT_TRUE(std::equal(window.begin(), window.end(), x.end() - (W - 1) * C));
  // Pieces of 1 (shorter than the window for W = 4), 0, 2, 5 and the rest: bitwise the same.
  std::vector<float> win2(static_cast<size_t>((W - 1) * C), 0.0f), y2(T * C);
  int64_t t0 = 0;
  for (int64_t n : {int64_t{1}, int64_t{0}, int64_t{2}, int64_t{5}, T - 8}) {
    CausalConvSilu(x.data() + t0 * C, n, C, w.data(), W, win2.data(), y2.data() + t0 * C);
    t0 += n;
  }
  EXPECT_TRUE(BitwiseEqual(y2, y));
  EXPECT_TRUE(BitwiseEqual(win2, window));
}

TEST(CausalConvSilu, MatchesReferenceAndSplitsBitwiseW4) { ExpectConvCorrectAndSplittable(4); }
TEST(CausalConvSilu, MatchesReferenceAndSplitsBitwiseW2) { ExpectConvCorrectAndSplittable(2); }

// ---- KdaLogDecay (§5.3) ----

TEST(KdaLogDecay, LowerBoundFormStaysInsideTheBound) {
  const int64_t T = 50, H = 4, K = 32;
  SplitMix64 rng(5);
  std::vector<float> a_log(H);
  for (float& a : a_log) a = static_cast<float>(std::log(1.0 + 3.0 * rng.Uniform()));
  const std::vector<float> dt_bias = Normal(rng, H * K, 0.1), f = Normal(rng, T * H * K);
  KdaGateParams p{H, K, a_log.data(), dt_bias.data(), -5.0f};
  std::vector<float> alpha(T * H * K);
  KdaLogDecay(f.data(), T, p, alpha.data());
  for (float a : alpha) {
    EXPECT_GT(a, -5.0f);
    EXPECT_LT(a, 0.0f);
  }
  // Saturated inputs reach the bound through the sigmoid without leaving [lb, 0].
  const std::vector<float> f_big(T * H * K, 1e4f), f_small(T * H * K, -1e4f);
  for (const auto* fx : {&f_big, &f_small}) {
    KdaLogDecay(fx->data(), T, p, alpha.data());
    for (float a : alpha) EXPECT_TRUE(a >= -5.0f && a <= 0.0f) << a;
  }
}

TEST(KdaLogDecay, LowerBoundFormHandValues) {
  // H = 2, K = 2. Head 0: A_log = 0 (a = 1); head 1: A_log = log 2 (a = 2).
  const float a_log[2] = {0.0f, std::log(2.0f)};
  const float dt_bias[4] = {0.0f, 1.0f, 0.25f, 0.0f};
  const float f[4] = {0.0f, -1.0f, 0.5f * std::log(3.0f) - 0.25f, 0.0f};
  KdaGateParams p{2, 2, a_log, dt_bias, -5.0f};
  float alpha[4];
  KdaLogDecay(f, 1, p, alpha);
  EXPECT_FLOAT_EQ(alpha[0], -2.5f);   // −5 σ(0)
  EXPECT_FLOAT_EQ(alpha[1], -2.5f);   // −5 σ(1·(−1 + 1))
  EXPECT_FLOAT_EQ(alpha[2], -3.75f);  // −5 σ(2 · ½ ln 3) = −5 · 3/4
  EXPECT_FLOAT_EQ(alpha[3], -2.5f);
}

TEST(KdaLogDecay, SoftplusFormMatchesFormulaAndLargeInputs) {
  const int64_t T = 9, H = 2, K = 3;
  const float a_log[2] = {std::log(0.5f), std::log(1.5f)};
  const float dt_bias[6] = {-1.0f, -0.5f, 0.0f, 0.3f, -1.2f, 0.7f};
  std::vector<float> f(T * H * K);
  for (size_t i = 0; i < f.size(); ++i) f[i] = -12.0f + 3.0f * static_cast<float>(i % 10);
  f[7] = 50.0f;  // softplus(49.5): exp would be 3e21 in float, fine, but x = 50 takes the x branch
  f[8] = 100.0f; // exp(100) overflows FP32: the threshold must keep it finite
  KdaGateParams p{H, K, a_log, dt_bias, std::nullopt};
  std::vector<float> alpha(T * H * K);
  KdaLogDecay(f.data(), T, p, alpha.data());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t d = 0; d < K; ++d) {
        const int64_t i = (t * H + h) * K + d;
        const double x = double(f[i]) + dt_bias[h * K + d];
        const double want = -std::exp(double(a_log[h])) * std::log1p(std::exp(x));
        ASSERT_TRUE(std::isfinite(alpha[i])) << i;
        EXPECT_NEAR(alpha[i], want, 2e-6 * std::max(1.0, std::fabs(want))) << "x=" << x;
        EXPECT_LE(alpha[i], 0.0f);
      }
}

// ---- GatedRmsNorm (§3.2) ----

TEST(GatedRmsNorm, MatchesNaiveLoop) {
  const int64_t T = 5, H = 3, K = 32;
  const float eps = 1e-5f;
  SplitMix64 rng(11);
  const std::vector<float> x = Normal(rng, T * H * K), g = Normal(rng, T * H * K, 2.0);
  const std::vector<float> w = Normal(rng, K, 0.2, 1.0);
  std::vector<float> y(T * H * K);
  GatedRmsNorm(x.data(), g.data(), w.data(), T, H, K, eps, y.data());
  std::vector<double> want(y.size());
  for (int64_t r = 0; r < T * H; ++r) {
    double ms = 0.0;
    for (int64_t d = 0; d < K; ++d) ms += double(x[r * K + d]) * x[r * K + d];
    ms /= double(K);
    for (int64_t d = 0; d < K; ++d) {
      const double sig = 1.0 / (1.0 + std::exp(-double(g[r * K + d])));
      want[r * K + d] = x[r * K + d] / std::sqrt(ms + eps) * w[d] * sig;
    }
  }
  EXPECT_LT(MaxRelErr(y, want), 1e-6);
}

// The fused decode reference (KdaDecode) against the prefill path: two sequences decoded token
// by token in one call per step, on slots 2 and 0 of a 4-slot pool, give what running each
// sequence's T tokens at once through the multi-token conv, the chunked core (spec §5.5, a
// different algorithm from the recurrent form KdaDecode uses) and the gated RMSNorm gives; the
// windows end bit-identical (both are copies of the last W-1 inputs), slots 1 and 3 untouched.
void ExpectDecodeEqualsPrefill(bool lower_bound) {
  const int64_t H = 2, K = 16, P = H * K, W = 4, T = 5, slots = 4;
  const std::vector<int32_t> slot_of = {2, 0};
  const int64_t B = static_cast<int64_t>(slot_of.size());
  SplitMix64 rng(lower_bound ? 21 : 22);
  const std::vector<float> conv_q = Normal(rng, P * W, 0.5), conv_k = Normal(rng, P * W, 0.5),
                           conv_v = Normal(rng, P * W, 0.5);
  const std::vector<float> a_log = Normal(rng, H, 0.5), dt_bias = Normal(rng, P, 0.5), o_norm = Normal(rng, K, 0.2, 1.0);
  // Inputs of sequence b at token t: [b][t * P ...] (beta [b][t * H ...]).
  std::vector<std::vector<float>> q, k, v, f, gate, beta;
  for (int64_t b = 0; b < B; ++b) {
    q.push_back(Normal(rng, T * P)), k.push_back(Normal(rng, T * P)), v.push_back(Normal(rng, T * P));
    f.push_back(Normal(rng, T * P, 2.0)), gate.push_back(Normal(rng, T * P)), beta.push_back(Normal(rng, T * H));
  }
  const std::vector<float> rec0 = Normal(rng, slots * H * K * K, 0.1);
  const std::vector<float> wq0 = Normal(rng, slots * (W - 1) * P), wk0 = Normal(rng, slots * (W - 1) * P),
                           wv0 = Normal(rng, slots * (W - 1) * P);
  std::vector<float> rec = rec0, wq = wq0, wk = wk0, wv = wv0;
  std::vector<std::vector<float>> got(B, std::vector<float>(T * P));
  for (int64_t t = 0; t < T; ++t) {
    // This step's rows, gathered from the sequences.
    std::vector<float> sq, sk, sv, sf, sg, sb, out(B * P);
    auto take = [t](std::vector<float>& dst, const std::vector<float>& src, int64_t n) {
      dst.insert(dst.end(), src.begin() + t * n, src.begin() + (t + 1) * n);
    };
    for (int64_t b = 0; b < B; ++b) {
      take(sq, q[b], P), take(sk, k[b], P), take(sv, v[b], P), take(sf, f[b], P), take(sg, gate[b], P);
      take(sb, beta[b], H);
    }
    KdaDecodeArgs a;
    a.rows = B, a.heads = H, a.head_dim = K, a.conv_taps = W;
    a.q = sq.data(), a.k = sk.data(), a.v = sv.data(), a.f = sf.data(), a.gate = sg.data(), a.beta_logits = sb.data();
    a.conv_q = conv_q.data(), a.conv_k = conv_k.data(), a.conv_v = conv_v.data();
    a.a_log = a_log.data(), a.dt_bias = dt_bias.data(), a.o_norm = o_norm.data(), a.norm_eps = 1e-5f;
    a.has_lower_bound = lower_bound, a.lower_bound = -5.0f;
    a.slots = slot_of.data(), a.slot_count = slots;
    a.recurrent = rec.data(), a.window_q = wq.data(), a.window_k = wk.data(), a.window_v = wv.data();
    a.out = out.data();
    KdaDecode(a);
    for (int64_t b = 0; b < B; ++b) std::copy_n(out.begin() + b * P, P, got[b].begin() + t * P);
  }
  const int64_t per_slot = H * K * K, per_win = (W - 1) * P;
  for (int64_t b = 0; b < B; ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b));
    const int64_t s = slot_of[b];
    std::vector<float> state(rec0.begin() + s * per_slot, rec0.begin() + (s + 1) * per_slot);
    std::vector<float> xq(T * P), xk(T * P), xv(T * P), alpha(T * P), o(T * P), want(T * P);
    auto conv = [&](const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& win0,
                    const std::vector<float>& win_after, std::vector<float>* y) {
      std::vector<float> win(win0.begin() + s * per_win, win0.begin() + (s + 1) * per_win);
      CausalConvSilu(x.data(), T, P, w.data(), W, win.data(), y->data());
      EXPECT_TRUE(BitwiseEqual(win, std::vector<float>(win_after.begin() + s * per_win,
                                                       win_after.begin() + (s + 1) * per_win)));
    };
    conv(q[b], conv_q, wq0, wq, &xq);
    conv(k[b], conv_k, wk0, wk, &xk);
    conv(v[b], conv_v, wv0, wv, &xv);
    KdaGateParams gp{H, K, a_log.data(), dt_bias.data(), std::nullopt};
    if (lower_bound) gp.lower_bound = -5.0f;
    KdaLogDecay(f[b].data(), T, gp, alpha.data());
    KdaChunked({T, H, K, xq.data(), xk.data(), xv.data(), beta[b].data(), alpha.data()}, state.data(), o.data(), 2);
    GatedRmsNorm(o.data(), gate[b].data(), o_norm.data(), T, H, K, 1e-5f, want.data());
    EXPECT_LT(MaxRelErr(got[b], want), 1e-5);
    EXPECT_LT(MaxRelErr(std::vector<float>(rec.begin() + s * per_slot, rec.begin() + (s + 1) * per_slot), state),
              1e-5);
  }
  for (int64_t s : {1, 3}) {
    EXPECT_TRUE(BitwiseEqual(std::vector<float>(rec.begin() + s * per_slot, rec.begin() + (s + 1) * per_slot),
                             std::vector<float>(rec0.begin() + s * per_slot, rec0.begin() + (s + 1) * per_slot)));
    EXPECT_TRUE(BitwiseEqual(std::vector<float>(wq.begin() + s * per_win, wq.begin() + (s + 1) * per_win),
                             std::vector<float>(wq0.begin() + s * per_win, wq0.begin() + (s + 1) * per_win)));
  }
}

TEST(KdaDecode, StepsBySlotEqualThePrefillPathLowerBoundGate) { ExpectDecodeEqualsPrefill(true); }
TEST(KdaDecode, StepsBySlotEqualThePrefillPathSoftplusGate) { ExpectDecodeEqualsPrefill(false); }

}  // namespace
}  // namespace kimirt::cpu
