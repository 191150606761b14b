#include "kimirt/eval/bench_dataset.h"

#include <algorithm>
#include <cmath>

#include "kimirt/core/random.h"

namespace kimirt::eval {

const std::vector<std::string>& BenchWordList() {
  // Frequent English words, lowercase so no word merges with its neighbour.
  static const std::vector<std::string> kWords = {
      "the",   "of",    "and",   "to",    "in",    "is",     "was",   "for",   "on",    "that",  "with",
      "as",    "by",    "at",    "from",  "his",   "it",     "an",    "were",  "are",   "which", "this",
      "be",    "or",    "has",   "had",   "first", "one",    "their", "its",   "new",   "after", "who",
      "they",  "have",  "her",   "she",   "two",   "been",   "other", "when",  "there", "all",   "during",
      "into",  "school", "time", "may",   "years", "more",   "most",  "only",  "over",  "city",  "some",
      "world", "would", "where", "later", "up",    "such",   "used",  "many",  "can"};
  return kWords;
}

std::string RandomWordsPrompt(int64_t words, uint64_t stream, const std::vector<std::string>& vocab) {
  SplitMix64 rng(stream);
  std::string s;
  s.reserve(static_cast<size_t>(std::max<int64_t>(words, 0)) * 7);
  for (int64_t i = 0; i < words && !vocab.empty(); ++i) {
    s.push_back(' ');
    s.append(vocab[rng.Next() % vocab.size()]);
  }
  return s;
}

std::string RepeatedWordPrompt(const std::string& word, int64_t n) {
  std::string s;
  for (int64_t i = 0; i < n; ++i) s += " " + word;
  return s;
}

Result<RandomLengths> SampleRandomLengths(int64_t n, int64_t input_len, int64_t output_len, double range_ratio,
                                          uint64_t seed) {
  if (!(range_ratio >= 0.0 && range_ratio < 1.0)) return InvalidArgument("--random-range-ratio must be in [0, 1)");
  if (input_len < 1) return InvalidArgument("--input-len must be >= 1");
  if (output_len < 1) return InvalidArgument("--output-len must be >= 1");
  const auto in_lo = static_cast<int64_t>(std::floor(static_cast<double>(input_len) * (1 - range_ratio)));
  const auto in_hi = static_cast<int64_t>(std::ceil(static_cast<double>(input_len) * (1 + range_ratio)));
  const int64_t out_lo = std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(output_len) * (1 - range_ratio))));
  const int64_t out_hi = std::max<int64_t>(1, static_cast<int64_t>(std::ceil(static_cast<double>(output_len) * (1 + range_ratio))));
  SplitMix64 rng(seed ^ 0x6b696d6972742d62ull);  // "kimirt-b": decouple from other seeded streams
  auto uniform = [&](int64_t lo, int64_t hi) {
    return lo + static_cast<int64_t>(rng.Next() % static_cast<uint64_t>(hi - lo + 1));
  };
  RandomLengths r;
  for (int64_t i = 0; i < n; ++i) r.input.push_back(std::max<int64_t>(1, uniform(in_lo, in_hi)));
  for (int64_t i = 0; i < n; ++i) r.output.push_back(uniform(out_lo, out_hi));
  for (int64_t i = 0; i < n; ++i) r.streams.push_back(rng.Next());
  return r;
}

int64_t WordCalibration::WordsFor(int64_t tokens) const {
  const double w = std::round((static_cast<double>(tokens) - intercept) / (slope > 0 ? slope : 1.0));
  return std::max<int64_t>(1, static_cast<int64_t>(w));
}

std::vector<BenchPrompt> RandomPrompts(const RandomLengths& lengths, const WordCalibration& cal) {
  std::vector<BenchPrompt> out;
  for (size_t i = 0; i < lengths.input.size(); ++i) {
    BenchPrompt p;
    p.words = cal.WordsFor(lengths.input[i]);
    p.text = RandomWordsPrompt(p.words, lengths.streams[i], cal.vocab);
    p.target_input_len = lengths.input[i];
    p.max_tokens = lengths.output[i];
    out.push_back(std::move(p));
  }
  return out;
}

Result<std::vector<BenchPrompt>> PrefixRepetitionPrompts(int64_t n, const PrefixRepetition& r, int64_t output_len,
                                                         const WordCalibration& cal, uint64_t seed) {
  if (r.prefix_len < 1 || r.suffix_len < 0 || r.num_prefixes < 1) {
    return InvalidArgument("--prefix-repetition-prefix-len and -num-prefixes must be >= 1, -suffix-len >= 0");
  }
  if (output_len < 1) return InvalidArgument("--prefix-repetition-output-len must be >= 1");
  // The prefix carries the prompt's fixed overhead (WordsFor's intercept); the suffix is words only.
  const int64_t prefix_words = cal.WordsFor(r.prefix_len);
  const auto suffix_words = static_cast<int64_t>(std::llround(static_cast<double>(r.suffix_len) / (cal.slope > 0 ? cal.slope : 1.0)));
  std::vector<std::string> prefixes;
  for (int64_t k = 0; k < r.num_prefixes; ++k) {
    prefixes.push_back(RandomWordsPrompt(prefix_words, HashName("prefix/" + std::to_string(seed) + "/" + std::to_string(k)), cal.vocab));
  }
  std::vector<BenchPrompt> out;
  for (int64_t i = 0; i < n; ++i) {
    BenchPrompt p;
    p.words = prefix_words + suffix_words;
    p.text = prefixes[static_cast<size_t>(i % r.num_prefixes)] +
             RandomWordsPrompt(suffix_words, HashName("suffix/" + std::to_string(seed) + "/" + std::to_string(i)), cal.vocab);
    p.target_input_len = r.prefix_len + r.suffix_len;
    p.max_tokens = output_len;
    out.push_back(std::move(p));
  }
  return out;
}

Result<std::vector<BenchPrompt>> Gsm8kBenchPrompts(const Gsm8kData& data, int64_t n, int64_t max_tokens) {
  if (max_tokens < 1) return InvalidArgument("--output-len must be >= 1");
  KIMIRT_ASSIGN_OR_RETURN(std::vector<Gsm8kPrompt> prompts,
                          BuildGsm8kPrompts(data.train, data.test, std::min<int64_t>(n, static_cast<int64_t>(data.test.size())),
                                            kGsm8kNumFewshot, kGsm8kFewshotSeed, true));
  std::vector<BenchPrompt> out;
  for (int64_t i = 0; i < n; ++i) {
    BenchPrompt p;
    p.text = prompts[static_cast<size_t>(i) % prompts.size()].text;
    p.max_tokens = max_tokens;
    p.stop = Gsm8kStopSequences();
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace kimirt::eval
