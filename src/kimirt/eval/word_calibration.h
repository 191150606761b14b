// Fitting `kimirt bench serve`'s random prompts to the server's tokenizer, which the client does
// not have, from the server's usage.prompt_tokens on short probes (max_tokens 1):
//   1. the overhead: " the"×8 and " the"×16; if " the" is one token, overhead = P8 − 8;
//   2. screening: each candidate word repeated 16 times; it is kept if it is one token
//      (P = overhead + 16). With at least 8 kept, prompts use only those: exactly
//      overhead + n tokens for n words, whatever words a request draws;
//   3. otherwise (a tokenizer that splits common words) all words stay and a line
//      prompt_tokens = a + b·words is fitted on random prompts of I and I/2 words;
//   4. either way, a probe of the computed word count for the target I is checked, and the
//      word count walked (at most 4 steps) until it lands on I.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/core/status.h"
#include "kimirt/eval/bench_dataset.h"
#include "kimirt/eval/openai_client.h"

namespace kimirt::eval {

struct WordCalibrationReport {
  bool performed = false;
  WordCalibration fit;
  size_t words_kept = 0;                             // single-token words (0: screening not used)
  std::vector<std::pair<int64_t, int64_t>> probes;   // (words, prompt_tokens) of the fit and the walk
  std::string note;
};

// Sends the probes as `body_for(prompt_text)` to `endpoint` and fits prompts of `target` tokens.
Result<WordCalibrationReport> CalibrateWords(OpenAiClient& client, const std::string& endpoint,
                                             const std::function<nlohmann::json(const std::string&)>& body_for,
                                             int64_t target);

}  // namespace kimirt::eval
