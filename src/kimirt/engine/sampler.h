// Sampler: turns one sequence's next-token logits (FP32, host memory) into a token, with
// vLLM v1's semantics. The engine makes one Sampler per sequence and calls Sample once per step.
//
// Pipeline of one step (the order vLLM v1's Sampler uses):
//   raw logits ── NaN → -inf
//     → logit_bias added (duplicate ids add up)
//     → repetition_penalty over prompt ∪ output tokens (logit > 0: divided, else multiplied)
//     → frequency_penalty × count, then presence_penalty, over output tokens only (OpenAI)
//     = processed logits
//   temperature < 1e-5 (vLLM's _SAMPLING_EPS): greedy argmax of the processed logits, ties to
//     the lower id; no random draw.
//   otherwise: processed / temperature → softmax → top-k → top-p → min-p → renormalise → one
//     uniform u per step → inverse CDF over the kept tokens in (probability desc, id asc)
//     order. The kept set is always a prefix of that order, so the result depends only on the
//     logits, the parameters and the step's u: reproducible per seed and independent of what
//     else is in the batch.
//   top-k keeps exactly k tokens (ties at the k-th probability go to the lower ids; vLLM keeps
//     all tied tokens). top-p keeps the shortest prefix whose probability reaches top_p (at least
//     one token). min-p drops p < min_p · p_max; it comes last, as in HF and vLLM v0 (vLLM v1
//     applies it before top-k/top-p; the two orders differ only when top_p < 1 as well).
//
// Logprobs (params.logprobs >= 0) are vLLM v1's default "raw_logprobs": log_softmax of the
// model's logits before bias, penalties, temperature and truncation, so a token banned by
// logit_bias still reports what the model thought of it. `top` holds the params.logprobs tokens
// with the highest raw logprob, descending, ties to the lower id; it may include the sampled
// token, which is also reported on its own in `logprob`. A logprob can be -inf (a -inf or NaN
// raw logit); JSON has no -inf, so the server must map it (OpenAI uses -9999.0).
//
// Degenerate logits, handled without failing:
//   NaN is treated as -inf everywhere (sampling and logprobs).
//   Every processed logit -inf (all masked, or overflow of extreme values under the penalties):
//     the argmax of the raw logits is returned; token 0 if those are all -inf too.
//     A non-greedy step still consumes its one random draw, so later steps stay aligned.
//   +inf logits: the +inf tokens share the probability equally; the rest get 0. Raw logprobs
//     are then -log(count of +inf) and -inf. If every raw logit is -inf, all logprobs are -inf.
//   Probabilities below e^-87 relative to the largest (float underflow) count as 0.
//
// Cost: O(vocab) passes with no full sort: a bucket histogram of the probabilities lets top-k,
// top-p and the final pick sort only the one or two buckets they land in.
//
// Threading: a Sampler is used by one thread at a time. Scratch buffers (O(vocab)) are per
// thread and shared by all Samplers on that thread, so thousands of live requests cost only
// their penalty state.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "kimirt/core/random.h"
#include "kimirt/engine/sampling_params.h"

namespace kimirt {

struct TokenLogprob {
  int32_t token = 0;
  float logprob = 0.0f;
};

struct SampleResult {
  int32_t token = 0;
  float logprob = 0.0f;            // raw logprob of `token`; 0 unless params.logprobs >= 0
  std::vector<TokenLogprob> top;   // params.logprobs entries, descending, ties to lower id
};

// The raw log_softmax of `logits` at `token`, and the `top` tokens with the highest raw
// logprob (descending, ties to the lower id): what a sampled token's logprobs report, and what
// prompt logprobs report for a prompt token given the logits of the position before it.
SampleResult ScoreToken(std::span<const float> logits, int32_t token, int32_t top);

class Sampler {
 public:
  // `params` should have passed Validate(vocab). The RNG seed is (params.seed, or
  // default_seed when unset) + sequence_index: the n sequences of one request each get their own
  // reproducible stream (vLLM gives child i of a seeded request seed + i).
  explicit Sampler(const SamplingParams& params, uint64_t default_seed, int32_t sequence_index = 0);

  // One step. `logits` spans the vocabulary. `prompt_tokens` must be the same on every call
  // (only its size is checked; its distinct tokens are cached for the repetition penalty).
  // `output_tokens` is everything sampled so far; normally it grows by one token per call,
  // and the penalty counts are then updated incrementally (any other change is recounted).
  // Token ids outside [0, vocab) are a programmer error (abort), as are logit_bias ids when
  // Validate was skipped.
  SampleResult Sample(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens);

  // The processed logits (after NaN → -inf, bias and penalties, before temperature) that Sample
  // would use for these inputs. For tests and debugging.
  std::vector<float> ProcessedLogits(std::span<const float> logits,
                                     std::span<const int32_t> prompt_tokens,
                                     std::span<const int32_t> output_tokens);

  const SamplingParams& params() const { return params_; }

  // Greedy with nothing that changes the logits and no logprobs: Sample's token is then
  // FromArgmax(ArgmaxOf(logits)), which a backend can take where the logits lie
  // (Backend::ArgmaxRows) without downloading the row. Such a Sample keeps no state.
  bool ArgmaxOnly() const { return greedy_ && !HasLogitChanges() && params_.logprobs < 0; }
  // The token an ArgmaxOnly() Sample gives for a row whose ArgmaxOf is `argmax` (-1: every
  // logit -inf or NaN, and the sampler answers 0).
  static int32_t FromArgmax(int32_t argmax) { return argmax < 0 ? 0 : argmax; }

 private:
  bool HasLogitChanges() const;
  // Writes the processed logits into `out` (size of logits).
  void Process(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
               std::span<const int32_t> output_tokens, float* out);
  void UpdatePenaltyState(std::span<const int32_t> prompt_tokens,
                          std::span<const int32_t> output_tokens, int32_t vocab);
  int32_t SampleRandom(const float* processed, std::span<const float> raw);

  SamplingParams params_;
  SplitMix64 rng_;
  bool greedy_;
  bool repetition_;       // repetition_penalty != 1
  bool count_penalties_;  // frequency or presence penalty != 0

  // Penalty state, kept only while a penalty is on.
  bool prompt_cached_ = false;
  size_t prompt_size_ = 0;
  std::vector<int32_t> prompt_distinct_;
  std::vector<int32_t> counted_;                     // output tokens already in output_counts_
  std::unordered_map<int32_t, int32_t> output_counts_;
};

}  // namespace kimirt
