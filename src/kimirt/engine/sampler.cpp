#include "kimirt/engine/sampler.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>

#include "kimirt/core/argmax.h"
#include "kimirt/core/check.h"

namespace kimirt {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();
constexpr float kPosInf = std::numeric_limits<float>::infinity();
// vLLM's _SAMPLING_EPS: temperatures below it mean greedy.
constexpr float kGreedyBelow = 1e-5f;

// Vocabulary-wide loops run in blocks of kLanes with one accumulator per lane. GCC's -O2
// vectoriser (the "very cheap" cost model) only takes loops that need no scalar epilogue, which
// a fixed inner trip count gives it; and per-lane accumulators fix the order of additions, so
// sums are the same bits whether or not (and however wide) the compiler vectorises.
constexpr size_t kLanes = 16;

inline float NanToNegInf(float v) { return v == v ? v : kNegInf; }

// e^x for x <= 0 (or -inf), within ~2 ulp: Cephes expf's range reduction and polynomial. Results
// below e^-87 (about FLT_MIN) become 0, so every result is 0 or a normal float in (0, 1], and
// e^0 is exactly 1. Plain float and integer arithmetic, so it vectorises (glibc's expf does not,
// and costs ~0.5 ms over a 163,840-token vocabulary) and gives the same bits on every IEEE
// machine. Written without selecting between computed floats on purpose: GCC turns a clamp such
// as `x < -87 ? -87 : x` into a branch, and a loop with a branch does not vectorise.
inline float ExpNonPositive(float x) {
  // round(x / ln 2) by the 1.5 · 2^23 trick; the integer also sits in the low mantissa bits of
  // `shifted`, so 2^n is built without a float-to-int conversion (undefined for -inf).
  const float shifted = x * 1.44269504088896341f + 12582912.0f;
  const float kf = shifted - 12582912.0f;
  const float r = (x - kf * 0.693359375f) - kf * -2.12194440e-4f;  // Cody-Waite: ln 2 in 2 parts
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = p * (r * r) + r + 1.0f;
  const uint32_t biased_exponent = std::bit_cast<uint32_t>(shifted) - 0x4B400000u + 127u;
  const float scale = std::bit_cast<float>(biased_exponent << 23);  // 2^n, valid for n >= -126
  // Below -87, n < -126 and y · scale is garbage (NaN for -inf): mask it to +0.
  const uint32_t keep = x >= -87.0f ? ~0u : 0u;
  return std::bit_cast<float>(std::bit_cast<uint32_t>(y * scale) & keep);
}

void CopyNanToNegInf(const float* __restrict in, float* __restrict out, size_t n) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) out[i + j] = NanToNegInf(in[i + j]);
  }
  for (; i < n; ++i) out[i] = NanToNegInf(in[i]);
}

// w[i] = e^(x[i] · inv_t - m), where m = max(x) · inv_t is finite: the softmax numerators, max
// exactly 1. (Scaling by inv_t > 0 is monotone, so max(x · inv_t) = max(x) · inv_t bit for bit.)
void ExpPass(const float* __restrict x, float* __restrict w, size_t n, float inv_t, float m) {
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t j = 0; j < kLanes; ++j) w[i + j] = ExpNonPositive(NanToNegInf(x[i + j]) * inv_t - m);
  }
  for (; i < n; ++i) w[i] = ExpNonPositive(NanToNegInf(x[i]) * inv_t - m);
}

// log_softmax of the raw logits, NaN as -inf.
struct RawLogSoftmax {
  float max = kNegInf;
  double log_z = 0.0;     // log Σ e^(x - max), when max is finite
  int64_t inf_count = 0;  // number of +inf logits, when max is +inf

  float Of(float raw) const {
    const float v = NanToNegInf(raw);
    if (max == kPosInf) return v == kPosInf ? static_cast<float>(-std::log(static_cast<double>(inf_count))) : kNegInf;
    if (max == kNegInf) return kNegInf;  // no distribution at all
    return static_cast<float>(static_cast<double>(v) - static_cast<double>(max) - log_z);
  }
};

RawLogSoftmax ComputeRawLogSoftmax(const float* __restrict x, size_t n) {
  RawLogSoftmax ls;
  ls.max = MaxOf(x, n);
  if (ls.max == kPosInf) {
    for (size_t i = 0; i < n; ++i) ls.inf_count += x[i] == kPosInf;
    return ls;
  }
  if (ls.max == kNegInf) return ls;
  const float m = ls.max;
  // Float lanes over chunks of 16 blocks (each lane adds 16 terms <= 1: relative error ~1e-7),
  // flushed into double lanes: half the work of accumulating in double throughout.
  constexpr size_t kChunk = 16 * kLanes;
  double lane[kLanes] = {};
  size_t i = 0;
  for (; i + kChunk <= n; i += kChunk) {
    float part[kLanes] = {};
    for (size_t b = 0; b < kChunk; b += kLanes) {
      for (size_t j = 0; j < kLanes; ++j) part[j] += ExpNonPositive(NanToNegInf(x[i + b + j]) - m);
    }
    for (size_t j = 0; j < kLanes; ++j) lane[j] += part[j];
  }
  double z = 0.0;
  for (size_t j = 0; j < kLanes; ++j) z += lane[j];
  for (; i < n; ++i) z += ExpNonPositive(NanToNegInf(x[i]) - m);
  ls.log_z = std::log(z);  // z >= 1: the max contributes exactly 1
  return ls;
}

// The k largest raw logits (NaN as -inf), descending, ties to the lower id; k <= n.
void TopRaw(const float* x, size_t n, size_t k, const RawLogSoftmax& ls, std::vector<TokenLogprob>* out) {
  struct Entry {
    float v;
    int32_t id;
  };
  std::vector<Entry> top;
  top.reserve(k + 1);
  auto offer = [&](size_t i) {
    const float v = NanToNegInf(x[i]);
    // Ids arrive ascending, so an equal value never displaces an earlier (lower) id.
    if (top.size() == k && !(v > top.back().v)) return;
    if (top.size() == k) top.pop_back();
    size_t pos = top.size();
    top.push_back({v, static_cast<int32_t>(i)});
    for (; pos > 0 && top[pos - 1].v < v; --pos) top[pos] = top[pos - 1];
    top[pos] = {v, static_cast<int32_t>(i)};
  };
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    if (top.size() == k) {
      // Skip blocks with nothing above the current k-th value: a vectorised test, and once the
      // list has filled, nearly every block.
      const float floor = top.back().v;
      uint32_t any = 0;
      for (size_t j = 0; j < kLanes; ++j) any |= x[i + j] > floor ? 1u : 0u;
      if (any == 0) continue;
    }
    for (size_t j = 0; j < kLanes; ++j) offer(i + j);
  }
  for (; i < n; ++i) offer(i);
  out->clear();
  for (const Entry& e : top) out->push_back({e.id, ls.Of(e.v)});
}

struct Candidate {
  float w;
  int32_t id;
};
// The sampling order: probability descending, then id ascending.
inline bool Before(const Candidate& a, const Candidate& b) {
  return a.w > b.w || (a.w == b.w && a.id < b.id);
}

// Probabilities are bucketed by their top 12 bits (sign, exponent and 3 mantissa bits: 8
// buckets per octave). For w in [0, 1] the key is at most 0x3F8; key 0 holds exactly the zeros
// (ExpNonPositive never returns a subnormal), which are never sampled.
constexpr uint32_t kNumKeys = 1024;
inline uint32_t KeyOf(float w) { return std::bit_cast<uint32_t>(w) >> 20; }

struct SortedBucket {
  uint32_t key = 0;
  std::vector<Candidate> items;
};

// Per-thread working memory, reused across calls and Samplers.
struct Scratch {
  std::vector<float> processed;  // logits after bias and penalties
  std::vector<float> w;          // unnormalised probabilities
  std::vector<uint8_t> mark;     // all zero between uses
  uint32_t count[kNumKeys];
  double sum[kNumKeys];
  std::deque<SortedBucket> sorted;  // deque: references stay valid as buckets are added
  size_t sorted_used = 0;
};

Scratch& ThreadScratch() {
  thread_local Scratch s;
  return s;
}

// A prefix of the sampling order: every bucket above `key` whole, plus the first `rank` tokens
// (in sampling order) of bucket `key`. Top-k, top-p and min-p each keep such a prefix, so the
// kept set is always one.
struct Cut {
  uint32_t key;
  uint32_t rank;
};

// Chooses a token from w (in scratch; max exactly 1) by top-k → top-p → min-p → inverse CDF
// at u. Buckets in key order are the sampling order at a coarse grain, so whole-bucket sums
// stand in for walking them, and only a bucket where a threshold lands is gathered and sorted.
class Picker {
 public:
  Picker(Scratch& s, size_t n) : s_(s), n_(n) {
    std::fill(s.count, s.count + kNumKeys, 0u);
    std::fill(s.sum, s.sum + kNumKeys, 0.0);
    s.sorted_used = 0;
    // Scalar: a histogram does not vectorise. Runs of one key chain through memory, but real
    // logits spread the tail over dozens of buckets.
    const float* w = s.w.data();
    for (size_t i = 0; i < n; ++i) {
      const uint32_t k = KeyOf(w[i]);
      ++s.count[k];
      s.sum[k] += w[i];
    }
    top_ = kNumKeys - 1;
    while (s.count[top_] == 0) --top_;  // the max (w = 1) is in some bucket >= 1
    uint32_t low = 1;
    while (s.count[low] == 0) ++low;
    positive_ = n - s.count[0];
    cut_ = {low, s.count[low]};
  }

  int32_t Pick(const SamplingParams& p, double u) {
    if (p.top_k > 0 && static_cast<size_t>(p.top_k) < positive_) {
      size_t before = 0;
      for (uint32_t k = top_;; --k) {
        if (before + s_.count[k] >= static_cast<size_t>(p.top_k)) {
          cut_ = {k, static_cast<uint32_t>(static_cast<size_t>(p.top_k) - before)};
          break;
        }
        before += s_.count[k];
      }
    }
    if (p.top_p < 1.0f) {
      const double target = static_cast<double>(p.top_p) * Total();
      if (auto c = Find([target](double cum) { return cum >= target; })) cut_ = *c;
    }
    if (p.min_p > 0.0f) ApplyMinP(p.min_p);
    const double target = u * Total();
    const Cut c = Find([target](double cum) { return cum > target; }).value_or(cut_);
    // Without a crossing (u · total rounded up to the total) the last kept token is taken.
    return Sorted(c.key)[c.rank - 1].id;
  }

 private:
  uint32_t KeptRank(uint32_t k) const { return k == cut_.key ? cut_.rank : s_.count[k]; }

  double KeptSum(uint32_t k) {
    const uint32_t rank = KeptRank(k);
    if (rank == s_.count[k]) return s_.sum[k];
    const std::vector<Candidate>& b = Sorted(k);
    double a = 0.0;
    for (uint32_t r = 0; r < rank; ++r) a += b[r].w;
    return a;
  }

  // Σ w over the kept prefix, bucket by bucket from the top (the order Find adds in, so Find
  // reaches exactly this value at the last bucket).
  double Total() {
    double z = 0.0;
    for (uint32_t k = top_; k >= cut_.key; --k) {
      if (s_.count[k] != 0) z += KeptSum(k);
    }
    return z;
  }

  // The first position of the kept prefix at which the running sum satisfies `crossed`.
  template <typename Pred>
  std::optional<Cut> Find(Pred crossed) {
    double cum = 0.0;
    for (uint32_t k = top_; k >= cut_.key; --k) {
      if (s_.count[k] == 0) continue;
      const double ks = KeptSum(k);
      if (crossed(cum + ks)) {
        const std::vector<Candidate>& b = Sorted(k);
        const uint32_t rank = KeptRank(k);
        double c = cum;
        for (uint32_t r = 0; r < rank; ++r) {
          c += b[r].w;
          if (crossed(c)) return Cut{k, r + 1};
        }
        // The id-order bucket sum crossed but the sorted-order walk fell short by a rounding
        // error: go on to the next bucket.
      }
      cum += ks;
    }
    return std::nullopt;
  }

  // Keeps w >= min_p (p >= min_p · p_max, as p_max ↔ w = 1).
  void ApplyMinP(float min_p) {
    const uint32_t kf = KeyOf(min_p);
    if (kf < cut_.key) return;  // every kept token lies in a higher bucket, so w > min_p
    uint32_t r = 0;
    if (s_.count[kf] != 0) {
      const std::vector<Candidate>& b = Sorted(kf);
      const uint32_t rank = KeptRank(kf);
      while (r < rank && b[r].w >= min_p) ++r;
    }
    if (r > 0) {
      cut_ = {kf, r};
      return;
    }
    // Nothing of bucket kf survives: end at the next non-empty bucket above. One exists, as
    // w = 1 >= min_p and bucket kf would hold it otherwise.
    uint32_t k = kf + 1;
    while (s_.count[k] == 0) ++k;
    cut_ = {k, s_.count[k]};
  }

  // Bucket k's tokens in sampling order, gathered (one pass over the vocabulary) on first use.
  const std::vector<Candidate>& Sorted(uint32_t k) {
    for (size_t i = 0; i < s_.sorted_used; ++i) {
      if (s_.sorted[i].key == k) return s_.sorted[i].items;
    }
    if (s_.sorted_used == s_.sorted.size()) s_.sorted.emplace_back();
    SortedBucket& b = s_.sorted[s_.sorted_used++];
    b.key = k;
    const uint32_t count = s_.count[k];
    b.items.resize(count + 1);  // +1: the branch-free loop always writes one slot past the last hit
    Candidate* out = b.items.data();
    const float* w = s_.w.data();
    size_t c = 0;
    auto take = [&](size_t i) {
      out[c] = {w[i], static_cast<int32_t>(i)};
      c += KeyOf(w[i]) == k;
    };
    size_t i = 0;
    for (; i + kLanes <= n_; i += kLanes) {
      // A vectorised test skips the blocks without a hit: most of them for a head bucket.
      uint32_t any = 0;
      for (size_t j = 0; j < kLanes; ++j) any |= KeyOf(w[i + j]) == k ? 1u : 0u;
      if (any == 0) continue;
      for (size_t j = 0; j < kLanes; ++j) take(i + j);
    }
    for (; i < n_; ++i) take(i);
    b.items.resize(count);
    std::sort(b.items.begin(), b.items.end(), Before);
    return b.items;
  }

  Scratch& s_;
  size_t n_;
  uint32_t top_ = 0;
  size_t positive_ = 0;
  Cut cut_{};
};

}  // namespace

Sampler::Sampler(const SamplingParams& params, uint64_t default_seed, int32_t sequence_index)
    : params_(params),
      rng_(params.seed.value_or(default_seed) + static_cast<uint64_t>(static_cast<int64_t>(sequence_index))),
      greedy_(!(params.temperature >= kGreedyBelow)),  // NaN (Validate skipped) → greedy too
      repetition_(params.repetition_penalty != 1.0f),
      count_penalties_(params.frequency_penalty != 0.0f || params.presence_penalty != 0.0f) {}

bool Sampler::HasLogitChanges() const {
  return !params_.logit_bias.empty() || repetition_ || count_penalties_;
}

void Sampler::UpdatePenaltyState(std::span<const int32_t> prompt_tokens,
                                 std::span<const int32_t> output_tokens, int32_t vocab) {
  Scratch& s = ThreadScratch();
  s.mark.resize(static_cast<size_t>(vocab), 0);
  if (repetition_ && (!prompt_cached_ || prompt_tokens.size() != prompt_size_)) {
    // Distinct prompt tokens, once per request: a long prompt would otherwise cost O(prompt)
    // every step.
    prompt_distinct_.clear();
    for (const int32_t t : prompt_tokens) {
      KIMIRT_CHECK_MSG(t >= 0 && t < vocab, "Sampler: prompt token id out of range");
      if (s.mark[t] == 0) {
        s.mark[t] = 1;
        prompt_distinct_.push_back(t);
      }
    }
    for (const int32_t t : prompt_distinct_) s.mark[t] = 0;
    prompt_cached_ = true;
    prompt_size_ = prompt_tokens.size();
  }
  // Output counts grow with the sequence; anything but an append (a rollback, a different
  // sequence) is recounted from scratch. The prefix comparison is a memcmp, far cheaper than
  // recounting.
  const bool appended = output_tokens.size() >= counted_.size() &&
                        std::equal(counted_.begin(), counted_.end(), output_tokens.begin());
  if (!appended) {
    counted_.clear();
    output_counts_.clear();
  }
  for (size_t i = counted_.size(); i < output_tokens.size(); ++i) {
    const int32_t t = output_tokens[i];
    KIMIRT_CHECK_MSG(t >= 0 && t < vocab, "Sampler: output token id out of range");
    ++output_counts_[t];
    counted_.push_back(t);
  }
}

void Sampler::Process(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens, float* out) {
  const size_t n = logits.size();
  const int32_t vocab = static_cast<int32_t>(n);
  CopyNanToNegInf(logits.data(), out, n);
  for (const auto& [id, bias] : params_.logit_bias) {
    KIMIRT_CHECK_MSG(id >= 0 && id < vocab, "Sampler: logit_bias token id out of range (Validate skipped?)");
    out[id] += bias;
  }
  if (!repetition_ && !count_penalties_) return;
  UpdatePenaltyState(prompt_tokens, output_tokens, vocab);
  if (repetition_) {
    // vLLM/HF: a token seen in the prompt or the output has a positive logit divided by the
    // penalty and a non-positive one multiplied, once however often it occurred.
    const float rp = params_.repetition_penalty;
    auto apply = [out, rp](int32_t t) { out[t] = out[t] > 0.0f ? out[t] / rp : out[t] * rp; };
    std::vector<uint8_t>& mark = ThreadScratch().mark;
    for (const int32_t t : prompt_distinct_) {
      mark[t] = 1;
      apply(t);
    }
    for (const auto& [t, count] : output_counts_) {
      if (mark[t] == 0) apply(t);
    }
    for (const int32_t t : prompt_distinct_) mark[t] = 0;
  }
  if (count_penalties_) {
    // OpenAI: logit -= frequency · count + presence · [count > 0]; two steps as in vLLM.
    for (const auto& [t, count] : output_counts_) {
      out[t] -= params_.frequency_penalty * static_cast<float>(count);
      out[t] -= params_.presence_penalty;
    }
  }
}

std::vector<float> Sampler::ProcessedLogits(std::span<const float> logits,
                                            std::span<const int32_t> prompt_tokens,
                                            std::span<const int32_t> output_tokens) {
  std::vector<float> out(logits.size());
  Process(logits, prompt_tokens, output_tokens, out.data());
  return out;
}

int32_t Sampler::SampleRandom(const float* processed, std::span<const float> raw) {
  // Exactly one draw per non-greedy step, whatever happens below, so the stream position is the
  // step number.
  const double u = rng_.Uniform();
  const size_t n = raw.size();
  const float max_processed = MaxOf(processed, n);
  if (max_processed == kNegInf) {
    const int32_t t = ArgmaxOf(raw.data(), n);
    return t < 0 ? 0 : t;
  }
  Scratch& s = ThreadScratch();
  s.w.resize(n);
  // Multiplying by 1/T rather than dividing (vLLM divides) differs by at most an ulp and avoids
  // the divider, the slowest step of the pass.
  const float inv_t = 1.0f / params_.temperature;
  const float m = max_processed * inv_t;
  if (m == kNegInf) {
    // Finite logits so negative that scaling sends all of them to -inf: the limit of the
    // distribution is the argmax.
    return ArgmaxOf(processed, n);
  }
  if (m == kPosInf) {
    // +inf logits (or a finite one overflowing under a small temperature): they share the mass.
    for (size_t i = 0; i < n; ++i) s.w[i] = NanToNegInf(processed[i]) * inv_t == kPosInf ? 1.0f : 0.0f;
  } else {
    ExpPass(processed, s.w.data(), n, inv_t, m);
  }
  return Picker(s, n).Pick(params_, u);
}

SampleResult Sampler::Sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens) {
  KIMIRT_CHECK_MSG(!logits.empty(), "Sampler: empty logits");
  KIMIRT_CHECK_MSG(logits.size() <= static_cast<size_t>(std::numeric_limits<int32_t>::max()),
                   "Sampler: vocabulary too large");
  const size_t n = logits.size();
  const float* processed = logits.data();
  if (HasLogitChanges()) {
    Scratch& s = ThreadScratch();
    s.processed.resize(n);
    Process(logits, prompt_tokens, output_tokens, s.processed.data());
    processed = s.processed.data();
  }
  SampleResult result;
  if (greedy_) {
    int32_t t = ArgmaxOf(processed, n);
    if (t < 0) t = ArgmaxOf(logits.data(), n);  // everything masked: the model's own choice
    result.token = t < 0 ? 0 : t;
  } else {
    result.token = SampleRandom(processed, logits);
  }
  if (params_.logprobs >= 0) {
    SampleResult scored = ScoreToken(logits, result.token, params_.logprobs);
    result.logprob = scored.logprob;
    result.top = std::move(scored.top);
  }
  return result;
}

SampleResult ScoreToken(std::span<const float> logits, int32_t token, int32_t top) {
  KIMIRT_CHECK_MSG(token >= 0 && static_cast<size_t>(token) < logits.size(), "ScoreToken: token outside the logits");
  const size_t n = logits.size();
  const RawLogSoftmax ls = ComputeRawLogSoftmax(logits.data(), n);
  SampleResult result;
  result.token = token;
  result.logprob = ls.Of(logits[static_cast<size_t>(token)]);
  if (top > 0) TopRaw(logits.data(), n, std::min(static_cast<size_t>(top), n), ls, &result.top);
  return result;
}

}  // namespace kimirt
