// The prompts `kimirt bench serve` sends.
//
// random (vLLM's --dataset-name random, vllm-project/vllm:vllm/benchmarks/datasets/random.py):
// per request an input length uniform in [floor(I(1−r)), ceil(I(1+r))] and an output length in
// [max(1, floor(O(1−r))), ceil(O(1+r))] (r = --random-range-ratio, default 0: exactly I and O).
// vLLM sends token ids it decoded with the model's tokenizer; a client that must work against
// any server has no tokenizer, so we send text whose token count the server reports:
//   - input: " w1 w2 ... wn", frequent English words each with its leading space, drawn by a
//     per-request seeded stream so no two prompts share more than a chance word or two of prefix
//     (prefix caching must not flatter prefill). Word calibration (word_calibration.h) keeps
//     the words that are one token for the server's tokenizer and measures the fixed overhead,
//     so a prompt of n words is exactly overhead + n tokens; the report carries each request's
//     prompt_tokens from the server's usage.
//   - output: max_tokens = the output length with ignore_eos (vLLM's --ignore-eos), so every
//     request generates exactly that many tokens on servers that honour ignore_eos.
// prefix_repetition (vLLM's --dataset-name prefix_repetition): --prefix-repetition-num-prefixes
// shared prefixes of --prefix-repetition-prefix-len tokens; request i is prefix i mod that count
// followed by a suffix of its own of --prefix-repetition-suffix-len tokens (random words, as
// above), generating --prefix-repetition-output-len tokens. Measures prefix caching
// (docs/prefix-caching.md); the report adds the server's prefix-cache hit rate.
// gsm8k: the 5-shot prompts of `kimirt eval gsm8k` (test documents in order, repeated if more
// prompts are asked for), with max_tokens = --output-len and the task's stop sequences.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/eval/gsm8k.h"

namespace kimirt::eval {

struct BenchPrompt {
  std::string text;
  int64_t words = 0;             // random: the words in `text`
  int64_t target_input_len = 0;  // random: the requested input tokens; gsm8k: 0 (unknown)
  int64_t max_tokens = 0;
  std::vector<std::string> stop;
};

// The candidate words (without their leading space): one BPE token each, with the space, in the
// large vocabularies of today's models.
const std::vector<std::string>& BenchWordList();

// `words` words of `vocab`, each preceded by a space, drawn by a stream seeded with `stream`.
std::string RandomWordsPrompt(int64_t words, uint64_t stream, const std::vector<std::string>& vocab);
// " word" repeated `n` times.
std::string RepeatedWordPrompt(const std::string& word, int64_t n);

struct RandomLengths {
  std::vector<int64_t> input;
  std::vector<int64_t> output;
  std::vector<uint64_t> streams;  // per-request word-stream seeds
};
// Deterministic in `seed`.
Result<RandomLengths> SampleRandomLengths(int64_t n, int64_t input_len, int64_t output_len, double range_ratio,
                                          uint64_t seed);

// How prompts of words map to the server's tokens: prompt_tokens ≈ intercept + slope · words,
// for prompts drawn from `vocab`.
struct WordCalibration {
  std::vector<std::string> vocab = BenchWordList();
  double intercept = 0;
  double slope = 1;
  int64_t WordsFor(int64_t tokens) const;
};

// Random prompts with word counts from `cal`.
std::vector<BenchPrompt> RandomPrompts(const RandomLengths& lengths, const WordCalibration& cal);
struct PrefixRepetition {
  int64_t prefix_len = 256;  // vLLM's defaults
  int64_t suffix_len = 256;
  int64_t num_prefixes = 10;
};
// `n` prompts of `r`, each with max_tokens = `output_len`; deterministic in `seed`.
Result<std::vector<BenchPrompt>> PrefixRepetitionPrompts(int64_t n, const PrefixRepetition& r, int64_t output_len,
                                                         const WordCalibration& cal, uint64_t seed);
// GSM8K 5-shot prompts; `n` of them.
Result<std::vector<BenchPrompt>> Gsm8kBenchPrompts(const Gsm8kData& data, int64_t n, int64_t max_tokens);

}  // namespace kimirt::eval
