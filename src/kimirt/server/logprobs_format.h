// Logprobs as the two OpenAI endpoints spell them, built from the engine's SampleResults.
//
// Legacy completions (`logprobs: k`):
//   {"tokens": [...], "token_logprobs": [...], "top_logprobs": [{token: logprob, ...}, ...],
//    "text_offset": [...]}
//   top_logprobs holds the k most likely tokens plus the sampled one (OpenAI and vLLM). With
//   echo, the prompt's tokens come first: the first with null logprob and top_logprobs (nothing
//   precedes it), the others scored by the engine's prompt logprobs (same k).
//   text_offset counts Unicode code points from the start of the prompt text, so echo starts at
//   0 and a plain completion at the prompt's length. Generated special tokens take no room: the
//   engine leaves them out of the text (skip_special_tokens, vLLM's default).
// Chat (`logprobs: true, top_logprobs: k`):
//   {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token","logprob","bytes"}]}]}
//
// Token strings: a token whose bytes are not valid UTF-8 on their own (byte-level BPE splits
// characters) is shown as "bytes:\xe4\xbd" as OpenAI does; chat's `bytes` has the raw bytes.
// A -inf logprob (JSON has no infinities) is reported as -9999.0, OpenAI's floor.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kimirt/engine/sampler.h"
#include "kimirt/server/openai_schema.h"

namespace kimirt {

class Tokenizer;

std::string TokenDisplayText(const Tokenizer& tokenizer, int32_t id);
double JsonLogprob(float logprob);
// Unicode code points in UTF-8 text: OpenAI's text_offset counts characters, not bytes.
int64_t CodePoints(std::string_view utf8);

// Accumulates one completion choice's legacy logprobs; TakeJson() returns what was added since
// the previous call (a streamed chunk's share) while text offsets keep counting.
class LegacyLogprobs {
 public:
  LegacyLogprobs(const Tokenizer& tokenizer, int64_t initial_text_offset);
  void AddPromptToken(int32_t id);                  // echo's first token: logprob and top null
  void AddPromptToken(const SampleResult& scored);  // echo's later tokens (prompt logprobs)
  void AddSampled(const SampleResult& sample);
  Json TakeJson();
  bool empty() const { return pending_.empty(); }

 private:
  struct Entry {
    std::string token;
    int64_t text_offset = 0;
    bool is_prompt = false;  // part of the prompt's text (special tokens included)
    bool scored = true;      // false: logprob and top null
    double logprob = 0.0;
    std::vector<std::pair<std::string, double>> top;
  };
  void AddToken(int32_t id, Entry entry);
  Entry Scored(const SampleResult& sample) const;

  const Tokenizer& tokenizer_;
  int64_t offset_;
  std::vector<Entry> pending_;
};

// The `content` array entries for these samples (chat).
Json ChatLogprobsContent(const Tokenizer& tokenizer, std::span<const SampleResult> samples, int32_t top_logprobs);

}  // namespace kimirt
