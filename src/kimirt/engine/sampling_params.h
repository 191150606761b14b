// SamplingParams: what a request asks of the sampler and the stop logic (OpenAI / vLLM
// semantics). Validation of user-facing ranges happens at the server's edge; the engine checks
// them again (Validate) so a library caller cannot crash it either.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

struct SamplingParams {
  float temperature = 1.0f;   // 0: greedy
  float top_p = 1.0f;         // (0, 1]
  int32_t top_k = 0;          // 0 or -1: off
  float min_p = 0.0f;         // [0, 1]: drop tokens with p < min_p * p_max
  std::optional<uint64_t> seed;  // per-request reproducible sampling
  float presence_penalty = 0.0f;   // [-2, 2], OpenAI: subtract once if the token occurred
  float frequency_penalty = 0.0f;  // [-2, 2], OpenAI: subtract count × penalty
  float repetition_penalty = 1.0f; // > 0, vLLM/HF: divide positive / multiply negative logits
  std::vector<std::pair<int32_t, float>> logit_bias;  // added to the logits before sampling
  int32_t logprobs = -1;       // -1: none; 0: the sampled token's; k > 0: plus the top k
  // Prompt logprobs (vLLM's `prompt_logprobs`; the completions endpoint's echo + logprobs):
  // -1: none; k >= 0: each prompt token after the first, scored by the logits of the position
  // before it, plus the top k there. Raw log_softmax, as for `logprobs`.
  int32_t prompt_logprobs = -1;
  int32_t max_tokens = 16;
  // vLLM's min_tokens: until this many tokens were generated, EOS and stop_token_ids cannot be
  // sampled (their logits are -inf). Stop strings still apply.
  int32_t min_tokens = 0;
  bool ignore_eos = false;
  // OpenAI/vLLM skip_special_tokens: drop special tokens from the text. K3's XTML markers are
  // not special (spec §10.4) and stay either way.
  bool skip_special_tokens = true;
  std::vector<int32_t> stop_token_ids;  // besides the model's EOS set
  std::vector<std::string> stop;        // stop strings (matched on text, not emitted)
  static constexpr size_t kMaxStopStrings = 16;
  static constexpr size_t kMaxStopBytes = 256;
  int32_t n = 1;

  Status Validate(int32_t vocab_size) const;
};

}  // namespace kimirt
