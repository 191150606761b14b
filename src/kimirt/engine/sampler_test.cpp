#include "kimirt/engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kimirt/core/argmax.h"
#include "kimirt/core/random.h"
#include "kimirt/testing/argmax_rows_case.h"

namespace kimirt {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
const std::vector<int32_t> kNoTokens;

SamplingParams GreedyParams() {
  SamplingParams p;
  p.temperature = 0.0f;
  return p;
}

SamplingParams RandomParams(float temperature = 1.0f, uint64_t seed = 1234) {
  SamplingParams p;
  p.temperature = temperature;
  p.seed = seed;
  return p;
}

int32_t SampleOnce(Sampler& s, const std::vector<float>& logits) {
  return s.Sample(logits, kNoTokens, kNoTokens).token;
}

std::vector<int> Counts(Sampler& s, const std::vector<float>& logits, int draws) {
  std::vector<int> counts(logits.size(), 0);
  for (int i = 0; i < draws; ++i) ++counts[SampleOnce(s, logits)];
  return counts;
}

// Pearson's statistic of observed counts against probabilities; a token with probability 0
// must never be seen.
double ChiSquare(const std::vector<int>& counts, const std::vector<double>& probs) {
  const double n = std::accumulate(counts.begin(), counts.end(), 0.0);
  double chi2 = 0.0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (probs[i] == 0.0) {
      EXPECT_EQ(counts[i], 0) << "token " << i << " has probability 0";
      continue;
    }
    const double expected = n * probs[i];
    chi2 += (counts[i] - expected) * (counts[i] - expected) / expected;
  }
  return chi2;
}

// 0.1% critical values of χ² by degrees of freedom (1..4).
double ChiSquareCritical(int dof) {
  static const double kCritical[] = {0.0, 10.83, 13.82, 16.27, 18.47};
  return kCritical[dof];
}

std::vector<double> Softmax(const std::vector<float>& logits, double t) {
  double m = -INFINITY;
  for (float v : logits) m = std::max(m, v / t);
  std::vector<double> p(logits.size());
  double z = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) z += p[i] = std::exp(logits[i] / t - m);
  for (double& v : p) v /= z;
  return p;
}

// Renormalises probs over `keep` (others 0).
std::vector<double> Restrict(std::vector<double> probs, const std::vector<int>& keep) {
  std::vector<double> out(probs.size(), 0.0);
  double z = 0.0;
  for (int i : keep) z += probs[i];
  for (int i : keep) out[i] = probs[i] / z;
  return out;
}

std::vector<float> LogitsOf(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(static_cast<float>(std::log(p)));
  return l;
}

std::vector<float> RandomLogits(size_t n, float scale, uint64_t seed) {
  SplitMix64 r(seed);
  std::vector<float> l(n);
  for (float& v : l) v = scale * r.FastNormal();
  return l;
}

TEST(Sampler, GreedyPicksArgmaxWithTiesToLowerId) {
  Sampler s(GreedyParams(), 1);
  EXPECT_EQ(SampleOnce(s, {0.1f, 3.0f, -2.0f, 2.9f}), 1);
  EXPECT_EQ(SampleOnce(s, {1.0f, 5.0f, 5.0f, 5.0f}), 1);
  EXPECT_EQ(SampleOnce(s, {7.0f, 7.0f}), 0);
  // Below vLLM's 1e-5 the temperature means greedy too.
  SamplingParams p = RandomParams(5e-6f);
  Sampler tiny(p, 1);
  std::vector<float> big = RandomLogits(163840, 3.0f, 5);
  big[100000] = 50.0f;
  big[150000] = 50.0f;
  for (int i = 0; i < 3; ++i) EXPECT_EQ(SampleOnce(tiny, big), 100000);
  EXPECT_EQ(SampleOnce(s, big), 100000);
}

// The engine hands ArgmaxOnly() rows to the device's ArgmaxRows instead of Sample: the token
// must be the one Sample picks, on every probe of greedy's rules.
TEST(Sampler, ArgmaxOnlyMeansTheTokenIsTheRowsArgmax) {
  Sampler greedy(GreedyParams(), 1);
  ASSERT_TRUE(greedy.ArgmaxOnly());
  for (int64_t V : {37, 163840}) {
    for (const std::vector<float>& row : testing::ArgmaxProbeRows(V)) {
      EXPECT_EQ(SampleOnce(greedy, row), Sampler::FromArgmax(ArgmaxOf(row.data(), row.size())));
    }
  }
  // Anything that changes the logits, reads them whole or draws at random needs the row.
  auto with = [](auto change) {
    SamplingParams p = GreedyParams();
    change(p);
    return Sampler(p, 1).ArgmaxOnly();
  };
  EXPECT_FALSE(with([](SamplingParams& p) { p.logprobs = 0; }));
  EXPECT_FALSE(with([](SamplingParams& p) { p.repetition_penalty = 1.1f; }));
  EXPECT_FALSE(with([](SamplingParams& p) { p.frequency_penalty = 0.5f; }));
  EXPECT_FALSE(with([](SamplingParams& p) { p.presence_penalty = 0.5f; }));
  EXPECT_FALSE(with([](SamplingParams& p) { p.logit_bias = {{3, 1.0f}}; }));
  EXPECT_FALSE(with([](SamplingParams& p) { p.temperature = 0.7f; }));
}

TEST(Sampler, TemperatureSamplingMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  for (const auto& [t, draws] : {std::pair{0.7f, 20000}, std::pair{1.0f, 5000}, std::pair{2.0f, 5000}}) {
    Sampler s(RandomParams(t, 99), 0);
    const std::vector<int> counts = Counts(s, logits, draws);
    EXPECT_LT(ChiSquare(counts, Softmax(logits, t)), ChiSquareCritical(4)) << "temperature " << t;
  }
}

TEST(Sampler, TopKNeverLeavesTheKBest) {
  const std::vector<float> logits = {1.0f, 3.0f, 2.5f, 0.0f, 2.9f};
  SamplingParams p = RandomParams(1.0f, 7);
  p.top_k = 2;
  Sampler s(p, 0);
  const std::vector<int> counts = Counts(s, logits, 5000);
  EXPECT_LT(ChiSquare(counts, Restrict(Softmax(logits, 1.0), {1, 4})), ChiSquareCritical(1));
  // Ties at the k-th place go to the lower ids: exactly k tokens survive.
  Sampler tied(p, 0);
  const std::vector<float> flat = {2.0f, 2.0f, 2.0f, 1.0f};
  const std::vector<int> c2 = Counts(tied, flat, 5000);
  EXPECT_LT(ChiSquare(c2, {0.5, 0.5, 0.0, 0.0}), ChiSquareCritical(1));
  // k >= vocab is no restriction.
  p.top_k = 5;
  Sampler all(p, 0);
  EXPECT_LT(ChiSquare(Counts(all, logits, 5000), Softmax(logits, 1.0)), ChiSquareCritical(4));
}

TEST(Sampler, TopPKeepsExactlyTheNucleus) {
  // Sorted: id1 0.4, id3 0.25, id4 0.2, id0 0.1, id2 0.05; cumulative 0.4 0.65 0.85 0.95 1.
  const std::vector<double> probs = {0.1, 0.4, 0.05, 0.25, 0.2};
  const std::vector<float> logits = LogitsOf(probs);
  const struct {
    float top_p;
    std::vector<int> nucleus;
  } cases[] = {{0.3f, {1}}, {0.6f, {1, 3}}, {0.8f, {1, 3, 4}}, {0.9f, {1, 3, 4, 0}}, {1.0f, {0, 1, 2, 3, 4}}};
  for (const auto& c : cases) {
    SamplingParams p = RandomParams(1.0f, 11);
    p.top_p = c.top_p;
    Sampler s(p, 0);
    const std::vector<int> counts = Counts(s, logits, 5000);
    const int dof = std::max<int>(1, static_cast<int>(c.nucleus.size()) - 1);
    EXPECT_LT(ChiSquare(counts, Restrict(probs, c.nucleus)), ChiSquareCritical(dof)) << "top_p " << c.top_p;
    for (int i : c.nucleus) EXPECT_GT(counts[i], 0) << "top_p " << c.top_p << " token " << i;
  }
  // Equal probabilities: the nucleus is a prefix by id. 0.25 + 0.25 reaches 0.5 exactly.
  SamplingParams p = RandomParams(1.0f, 12);
  p.top_p = 0.5f;
  Sampler s(p, 0);
  EXPECT_LT(ChiSquare(Counts(s, {0.0f, 0.0f, 0.0f, 0.0f}, 5000), {0.5, 0.5, 0.0, 0.0}), ChiSquareCritical(1));
}

TEST(Sampler, MinPDropsTokensBelowAFractionOfTheMax) {
  const std::vector<double> probs = {0.5, 0.3, 0.12, 0.08};
  const std::vector<float> logits = LogitsOf(probs);
  SamplingParams p = RandomParams(1.0f, 13);
  p.min_p = 0.2f;  // threshold 0.1: 0.08 goes
  Sampler s(p, 0);
  EXPECT_LT(ChiSquare(Counts(s, logits, 5000), Restrict(probs, {0, 1, 2})), ChiSquareCritical(2));
  p.min_p = 0.25f;  // threshold 0.125: 0.12 goes too
  Sampler s2(p, 0);
  EXPECT_LT(ChiSquare(Counts(s2, logits, 5000), Restrict(probs, {0, 1})), ChiSquareCritical(1));
  p.min_p = 1.0f;  // only the most likely token
  Sampler s3(p, 0);
  EXPECT_EQ(Counts(s3, logits, 1000)[0], 1000);
}

TEST(Sampler, BiasAndPenaltiesChangeTheRightLogits) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, -0.5f, 1.0f};
  SamplingParams p = GreedyParams();
  p.logit_bias = {{5, 1.5f}, {2, -1.0f}};
  p.repetition_penalty = 2.0f;
  p.frequency_penalty = 0.5f;
  p.presence_penalty = 0.25f;
  Sampler s(p, 0);
  const std::vector<int32_t> prompt = {0, 1};
  std::vector<int32_t> output = {3, 3, 4, 1};
  // bias: 5 → 2.5, 2 → -0.5. repetition over {0, 1, 3, 4} (1 is in both, penalised once):
  // 0 → 1, 1 → -2, 3 → 1.5, 4 → -1. output counts 3:2, 4:1, 1:1 → -0.5·count - 0.25.
  EXPECT_EQ(s.ProcessedLogits(logits, prompt, output),
            (std::vector<float>{1.0f, -2.75f, -0.5f, 0.25f, -1.75f, 2.5f}));
  EXPECT_EQ(s.Sample(logits, prompt, output).token, 5);
  // One more output token (the incremental path): 5 is now penalised.
  output.push_back(5);
  EXPECT_EQ(s.ProcessedLogits(logits, prompt, output),
            (std::vector<float>{1.0f, -2.75f, -0.5f, 0.25f, -1.75f, 0.5f}));
  EXPECT_EQ(s.Sample(logits, prompt, output).token, 0);
  // A rewritten output (rollback) is recounted.
  const std::vector<int32_t> rewritten = {3};
  EXPECT_EQ(s.ProcessedLogits(logits, prompt, rewritten),
            (std::vector<float>{1.0f, -2.0f, -0.5f, 0.75f, -0.5f, 2.5f}));
  // Penalties off: only NaN → -inf and the bias.
  SamplingParams plain = GreedyParams();
  plain.logit_bias = {{1, 0.5f}, {1, 0.25f}};  // duplicates add up
  Sampler s2(plain, 0);
  EXPECT_EQ(s2.ProcessedLogits(std::vector<float>{kNaN, 1.0f}, prompt, output), (std::vector<float>{-kInf, 1.75f}));
  // Negative penalties reward repetition.
  SamplingParams reward = GreedyParams();
  reward.presence_penalty = -2.0f;
  Sampler s3(reward, 0);
  EXPECT_EQ(s3.Sample(std::vector<float>{1.0f, 0.0f}, kNoTokens, std::vector<int32_t>{1}).token, 1);
}

TEST(Sampler, LogitBiasMinus100BansAToken) {
  const std::vector<float> logits = {5.0f, 4.9f, 0.0f};
  SamplingParams p = GreedyParams();
  p.logit_bias = {{0, -100.0f}};
  Sampler g(p, 0);
  EXPECT_EQ(SampleOnce(g, logits), 1);
  p.temperature = 1.0f;
  Sampler s(p, 0);
  EXPECT_EQ(Counts(s, logits, 5000)[0], 0);
  p.logit_bias = {{2, 100.0f}};
  Sampler forced(p, 0);
  EXPECT_EQ(Counts(forced, logits, 1000)[2], 1000);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  const std::vector<float> logits = RandomLogits(1000, 1.0f, 3);
  auto run = [&](SamplingParams p, uint64_t default_seed, int32_t index) {
    Sampler s(p, default_seed, index);
    std::vector<int32_t> tokens;
    for (int i = 0; i < 100; ++i) tokens.push_back(SampleOnce(s, logits));
    return tokens;
  };
  SamplingParams p = RandomParams(1.0f, 42);
  p.top_p = 0.95f;
  const std::vector<int32_t> a = run(p, 0, 0);
  EXPECT_EQ(a, run(p, 999, 0));  // the request's seed wins over the default
  SamplingParams other = p;
  other.seed = 43;
  EXPECT_NE(a, run(other, 0, 0));
  SamplingParams unseeded = p;
  unseeded.seed.reset();
  EXPECT_EQ(run(unseeded, 42, 0), a);  // the default seed stands in
  EXPECT_NE(run(p, 0, 1), a);         // sequence 1 of an n > 1 request: seed + 1
  EXPECT_EQ(run(p, 0, 1), run(other, 0, 0));
}

TEST(Sampler, LogprobsAreRawLogSoftmaxWithSortedTop) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.0f};
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0) + std::exp(0.0));  // 3.4401897
  // Bias, penalties and temperature change the choice, not the reported (raw) logprobs.
  SamplingParams p = GreedyParams();
  p.logprobs = 3;
  p.logit_bias = {{3, 10.0f}};
  p.repetition_penalty = 1.5f;
  Sampler s(p, 0);
  const SampleResult r = s.Sample(logits, std::vector<int32_t>{2}, kNoTokens);
  EXPECT_EQ(r.token, 3);
  EXPECT_NEAR(r.logprob, 0.0 - lse, 1e-6);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].token, 2);
  EXPECT_NEAR(r.top[0].logprob, 3.0 - lse, 1e-6);
  EXPECT_EQ(r.top[1].token, 1);
  EXPECT_NEAR(r.top[1].logprob, 2.0 - lse, 1e-6);
  EXPECT_EQ(r.top[2].token, 0);
  EXPECT_NEAR(r.top[2].logprob, 1.0 - lse, 1e-6);
  // Sampling at a temperature: still raw.
  SamplingParams t = RandomParams(0.3f);
  t.logprobs = 0;
  Sampler st(t, 0);
  for (int i = 0; i < 20; ++i) {
    const SampleResult x = st.Sample(logits, kNoTokens, kNoTokens);
    EXPECT_NEAR(x.logprob, logits[x.token] - lse, 1e-6);
    EXPECT_TRUE(x.top.empty());
  }
  // Ties in the top list go to the lower id; more requested than the vocabulary holds.
  SamplingParams tie = GreedyParams();
  tie.logprobs = 20;
  Sampler sti(tie, 0);
  const SampleResult y = sti.Sample(std::vector<float>{1.0f, 1.0f, 0.0f, 1.0f}, kNoTokens, kNoTokens);
  ASSERT_EQ(y.top.size(), 4u);
  EXPECT_EQ(y.top[0].token, 0);
  EXPECT_EQ(y.top[1].token, 1);
  EXPECT_EQ(y.top[2].token, 3);
  EXPECT_EQ(y.top[3].token, 2);
  // Off by default.
  Sampler off(GreedyParams(), 0);
  EXPECT_EQ(off.Sample(logits, kNoTokens, kNoTokens).logprob, 0.0f);
}

TEST(Sampler, LogprobsAtFullVocabularyAreNormalised) {
  const std::vector<float> logits = RandomLogits(163840, 3.0f, 8);
  SamplingParams p = RandomParams(1.0f);
  p.logprobs = 5;
  Sampler s(p, 0);
  const SampleResult r = s.Sample(logits, kNoTokens, kNoTokens);
  double m = -INFINITY;
  for (float v : logits) m = std::max<double>(m, v);
  double z = 0.0;
  for (float v : logits) z += std::exp(v - m);
  EXPECT_NEAR(r.logprob, logits[r.token] - m - std::log(z), 1e-5);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::partial_sort(ids.begin(), ids.begin() + 5, ids.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); });
  ASSERT_EQ(r.top.size(), 5u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(r.top[i].token, ids[i]);
    EXPECT_NEAR(r.top[i].logprob, logits[ids[i]] - m - std::log(z), 1e-5);
  }
}

TEST(Sampler, NanAndInfinityAreHandled) {
  // NaN counts as -inf: never chosen, logprob -inf.
  SamplingParams p = RandomParams(1.0f);
  p.logprobs = 4;
  Sampler s(p, 0);
  const std::vector<float> with_nan = {kNaN, 1.0f, kNaN, 0.5f};
  for (int i = 0; i < 200; ++i) {
    const SampleResult r = s.Sample(with_nan, kNoTokens, kNoTokens);
    EXPECT_TRUE(r.token == 1 || r.token == 3);
    ASSERT_EQ(r.top.size(), 4u);
    EXPECT_EQ(r.top[0].token, 1);
    EXPECT_EQ(r.top[1].token, 3);
    EXPECT_EQ(r.top[2].token, 0);  // -inf ties, lower id first
    EXPECT_EQ(r.top[2].logprob, -kInf);
    EXPECT_NEAR(r.top[0].logprob, 1.0 - std::log(std::exp(1.0) + std::exp(0.5)), 1e-6);
  }
  Sampler g(GreedyParams(), 0);
  EXPECT_EQ(SampleOnce(g, {kNaN, 1.0f, kNaN, 2.0f}), 3);
  // -inf entries are never sampled.
  const std::vector<float> masked = {-kInf, 0.0f, -kInf};
  EXPECT_EQ(Counts(s, masked, 500)[1], 500);
  EXPECT_EQ(s.Sample(masked, kNoTokens, kNoTokens).logprob, 0.0f);
  // Nothing left at all: token 0, logprob -inf, for greedy and sampling alike.
  for (const std::vector<float>& dead : {std::vector<float>{-kInf, -kInf, -kInf}, std::vector<float>{kNaN, kNaN, -kInf}}) {
    const SampleResult r = s.Sample(dead, kNoTokens, kNoTokens);
    EXPECT_EQ(r.token, 0);
    EXPECT_EQ(r.logprob, -kInf);
    EXPECT_EQ(SampleOnce(g, dead), 0);
  }
  // Processed logits all -inf (the repetition penalty overflows them) but raw ones finite: the
  // raw argmax.
  SamplingParams over = RandomParams(1.0f);
  over.repetition_penalty = 2.0f;
  Sampler so(over, 0);
  EXPECT_EQ(so.Sample(std::vector<float>{-3e38f, -2e38f}, std::vector<int32_t>{0, 1}, kNoTokens).token, 1);
  // Finite logits that a small temperature scales to -inf all at once: the argmax.
  Sampler cold(RandomParams(1e-4f), 0);
  EXPECT_EQ(SampleOnce(cold, {-3e38f, -2.9e38f, -3.1e38f}), 1);
  // +inf tokens share the probability; others get none.
  const std::vector<float> inf = {0.0f, kInf, 1.0f, kInf};
  const std::vector<int> counts = Counts(s, inf, 5000);
  EXPECT_LT(ChiSquare(counts, {0.0, 0.5, 0.0, 0.5}), ChiSquareCritical(1));
  EXPECT_EQ(SampleOnce(g, inf), 1);
  const SampleResult ri = s.Sample(inf, kNoTokens, kNoTokens);
  EXPECT_NEAR(ri.logprob, -std::log(2.0), 1e-6);
  EXPECT_EQ(ri.top[2].logprob, -kInf);
}

// A direct transcription of the documented semantics, in double precision, with a full sort.
int32_t ReferenceSample(const std::vector<float>& logits, const SamplingParams& p, double u) {
  const size_t n = logits.size();
  std::vector<double> x(n);
  double m = -INFINITY;
  for (size_t i = 0; i < n; ++i) m = std::max(m, x[i] = logits[i] / p.temperature);
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = std::exp(x[i] - m);
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return w[a] > w[b] || (w[a] == w[b] && a < b); });
  size_t keep = n;
  if (p.top_k > 0) keep = std::min<size_t>(keep, p.top_k);
  if (p.top_p < 1.0f) {
    double z = 0.0;
    for (size_t i = 0; i < keep; ++i) z += w[order[i]];
    double cum = 0.0;
    for (size_t i = 0; i < keep; ++i) {
      cum += w[order[i]];
      if (cum >= p.top_p * z) {
        keep = i + 1;
        break;
      }
    }
  }
  size_t above_min = 0;
  while (above_min < keep && w[order[above_min]] >= p.min_p) ++above_min;
  keep = above_min;
  double s = 0.0;
  for (size_t i = 0; i < keep; ++i) s += w[order[i]];
  double cum = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    cum += w[order[i]];
    if (cum > u * s) return order[i];
  }
  return order[keep - 1];
}

TEST(Sampler, MatchesAReferenceImplementationDrawForDraw) {
  struct Config {
    float temperature;
    int32_t top_k;
    float top_p;
    float min_p;
  };
  const Config configs[] = {
      {1.0f, 0, 1.0f, 0.0f},   {0.7f, 50, 1.0f, 0.0f},   {1.0f, 0, 0.9f, 0.0f},   {1.0f, 0, 1.0f, 0.05f},
      {1.3f, 200, 0.8f, 0.01f}, {0.5f, 1, 1.0f, 0.0f},   {2.0f, 0, 0.5f, 0.0f},   {1.0f, 3000, 0.99f, 1e-4f},
      {1.0f, 0, 1.0f, 1e-6f},
  };
  int compared = 0;
  for (const Config& c : configs) {
    SamplingParams p = RandomParams(c.temperature, 2024);
    p.top_k = c.top_k;
    p.top_p = c.top_p;
    p.min_p = c.min_p;
    Sampler s(p, 0);
    SplitMix64 rng(2024);
    for (int step = 0; step < 30; ++step) {
      // Spread logits cover many probability buckets; a few steps use a narrow spread, where
      // whole buckets hold hundreds of tokens.
      const float scale = step % 5 == 0 ? 0.2f : 4.0f;
      const std::vector<float> logits = RandomLogits(2048, scale, 1000 + step);
      const int32_t want = ReferenceSample(logits, p, rng.Uniform());
      ASSERT_EQ(s.Sample(logits, kNoTokens, kNoTokens).token, want)
          << "config T=" << c.temperature << " k=" << c.top_k << " p=" << c.top_p << " min_p=" << c.min_p
          << " step " << step;
      ++compared;
    }
  }
  EXPECT_EQ(compared, 9 * 30);
}

// Not a pass/fail check: prints the cost of one step at Kimi's vocabulary for the report.
TEST(Sampler, TimingAtKimiVocabulary) {
  constexpr size_t kVocab = 163840;
  // "peaked": a head of 16 likely tokens over a N(0, 2.5²) tail holding ~2% of the mass, like a
  // confident LM step; "flat": the tail alone, a worst case for top-p (the nucleus spans most of
  // the vocabulary).
  std::vector<float> peaked = RandomLogits(kVocab, 2.5f, 77);
  for (int i = 0; i < 16; ++i) peaked[static_cast<size_t>(i) * 9973] = 18.0f - 0.5f * i;
  const std::vector<float> flat = RandomLogits(kVocab, 2.5f, 78);
  std::vector<int32_t> prompt(2000), output(500);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int32_t>((i * 7919) % kVocab);
  for (size_t i = 0; i < output.size(); ++i) output[i] = static_cast<int32_t>((i * 104729) % kVocab);
  struct Mode {
    const char* name;
    SamplingParams params;
  };
  std::vector<Mode> modes;
  modes.push_back({"greedy", GreedyParams()});
  SamplingParams g5 = GreedyParams();
  g5.logprobs = 5;
  modes.push_back({"greedy+logprobs5", g5});
  modes.push_back({"T=1", RandomParams(1.0f)});
  SamplingParams tp = RandomParams(1.0f);
  tp.top_p = 0.9f;
  modes.push_back({"top_p=0.9", tp});
  SamplingParams tk = RandomParams(1.0f);
  tk.top_k = 50;
  modes.push_back({"top_k=50", tk});
  SamplingParams all = RandomParams(0.8f);
  all.top_k = 50;
  all.top_p = 0.9f;
  all.min_p = 0.02f;
  all.repetition_penalty = 1.1f;
  all.frequency_penalty = 0.3f;
  all.presence_penalty = 0.3f;
  all.logprobs = 5;
  modes.push_back({"k50+p0.9+min_p+penalties+logprobs5", all});
  for (const auto& [dist, logits] : {std::pair<const char*, const std::vector<float>&>{"peaked", peaked},
                                     std::pair<const char*, const std::vector<float>&>{"flat", flat}}) {
    for (const Mode& mode : modes) {
      Sampler s(mode.params, 0);
      s.Sample(logits, prompt, output);  // warm the per-thread scratch
      constexpr int kIters = 15;
      std::vector<double> us(kIters);
      for (int i = 0; i < kIters; ++i) {
        const auto t0 = std::chrono::steady_clock::now();
        const SampleResult r = s.Sample(logits, prompt, output);
        us[i] = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
        ASSERT_GE(r.token, 0);
      }
      // The minimum is the uncontended cost; the median shows what sharing the CPU adds.
      std::sort(us.begin(), us.end());
      std::printf("[ timing ] vocab %zu %-6s %-36s min %7.1f us  median %7.1f us\n", kVocab, dist, mode.name,
                  us.front(), us[kIters / 2]);
    }
  }
}

// ---- SamplingParams::Validate ----

TEST(SamplingParams, DefaultsAndBoundariesAreValid) {
  EXPECT_TRUE(SamplingParams().Validate(100).ok());
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_p = 1.0f;
  p.top_k = -1;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 0.01f;
  p.logprobs = 20;
  p.max_tokens = 1;
  p.n = 128;
  p.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  p.stop_token_ids = {0, 99};
  p.stop.assign(16, std::string(256, 'x'));
  const Status st = p.Validate(100);
  EXPECT_TRUE(st.ok()) << st.ToString();
}

TEST(SamplingParams, EachBadFieldIsNamed) {
  struct Case {
    void (*mutate)(SamplingParams&);
    const char* message;
  };
  const Case cases[] = {
      {[](SamplingParams& p) { p.temperature = -0.5f; }, "temperature must be finite and >= 0, got -0.5"},
      {[](SamplingParams& p) { p.temperature = kNaN; }, "temperature must be finite and >= 0, got nan"},
      {[](SamplingParams& p) { p.temperature = kInf; }, "temperature must be finite and >= 0, got inf"},
      {[](SamplingParams& p) { p.top_p = 1.5f; }, "top_p must be in (0, 1], got 1.5"},
      {[](SamplingParams& p) { p.top_p = 0.0f; }, "top_p must be in (0, 1], got 0"},
      {[](SamplingParams& p) { p.top_k = -2; }, "top_k must be >= -1 (-1 or 0: off), got -2"},
      {[](SamplingParams& p) { p.min_p = 1.5f; }, "min_p must be in [0, 1], got 1.5"},
      {[](SamplingParams& p) { p.min_p = -0.1f; }, "min_p must be in [0, 1], got -0.1"},
      {[](SamplingParams& p) { p.presence_penalty = 2.5f; }, "presence_penalty must be in [-2, 2], got 2.5"},
      {[](SamplingParams& p) { p.frequency_penalty = -3.0f; }, "frequency_penalty must be in [-2, 2], got -3"},
      {[](SamplingParams& p) { p.repetition_penalty = 0.0f; }, "repetition_penalty must be finite and > 0, got 0"},
      {[](SamplingParams& p) { p.repetition_penalty = kInf; }, "repetition_penalty must be finite and > 0, got inf"},
      {[](SamplingParams& p) { p.logprobs = 21; }, "logprobs must be in [-1, 20], got 21"},
      {[](SamplingParams& p) { p.logprobs = -2; }, "logprobs must be in [-1, 20], got -2"},
      {[](SamplingParams& p) { p.max_tokens = 0; }, "max_tokens must be >= 1, got 0"},
      {[](SamplingParams& p) { p.n = 0; }, "n must be in [1, 128], got 0"},
      {[](SamplingParams& p) { p.n = 129; }, "n must be in [1, 128], got 129"},
      {[](SamplingParams& p) { p.logit_bias = {{200, 1.0f}}; }, "logit_bias token id 200 is out of range [0, 100)"},
      {[](SamplingParams& p) { p.logit_bias = {{-1, 1.0f}}; }, "logit_bias token id -1 is out of range [0, 100)"},
      {[](SamplingParams& p) { p.logit_bias = {{5, 150.0f}}; },
       "logit_bias value for token 5 must be in [-100, 100], got 150"},
      {[](SamplingParams& p) { p.logit_bias = {{5, kNaN}}; },
       "logit_bias value for token 5 must be in [-100, 100], got nan"},
      {[](SamplingParams& p) { p.stop_token_ids = {1, 100}; }, "stop_token_ids[1] = 100 is out of range [0, 100)"},
      {[](SamplingParams& p) { p.stop.assign(17, "x"); }, "stop has 17 strings; at most 16 are allowed"},
      {[](SamplingParams& p) { p.stop = {"a", ""}; }, "stop[1] is empty"},
      {[](SamplingParams& p) { p.stop = {std::string(257, 'x')}; }, "stop[0] is 257 bytes; at most 256 are allowed"},
  };
  for (const Case& c : cases) {
    SamplingParams p;
    c.mutate(p);
    const Status st = p.Validate(100);
    EXPECT_EQ(st.code(), ErrorCode::kInvalidArgument) << c.message;
    EXPECT_EQ(st.message(), c.message);
  }
  EXPECT_EQ(SamplingParams().Validate(0).message(), "vocab_size must be > 0, got 0");
}

}  // namespace
}  // namespace kimirt
