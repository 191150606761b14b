// Streaming text out of generated token ids: the incremental detokenizer (UTF-8 safe deltas) and
// the stop-string matcher (OpenAI `stop`), plus the UTF-8 decoding step both rest on.
//
// Text rules, chosen to match what a client of vLLM or the OpenAI API sees:
// - Deltas end on UTF-8 character boundaries. A token may end inside a multi-byte character
//   (byte-level BPE); those bytes wait for the next token. Nothing is emitted twice or dropped:
//   the concatenated deltas equal a one-shot decode of all ids.
// - Bytes that can never become valid UTF-8 are replaced by U+FFFD, one per maximal ill-formed
//   subpart (Unicode §3.9), exactly as Python's bytes.decode("utf-8", "replace") does in
//   tiktoken's decode. A byte is replaced only once it is known to be invalid, so the streamed
//   text equals the one-shot text for every way of splitting the ids.
// - Stop strings are matched on the decoded text; the matched stop string and everything after it
//   are never emitted (OpenAI semantics), and text that could still become a stop string is held.
//
// Thread safety: one instance per sequence; not shared across threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kimirt {

class Tokenizer;

// One step of UTF-8 decoding at the front of `bytes` (which must be non-empty).
struct Utf8Step {
  enum class Kind : uint8_t {
    kValid,       // a well-formed character of `length` bytes
    kInvalid,     // a maximal ill-formed subpart of `length` bytes: one U+FFFD
    kIncomplete,  // all of `bytes` is a proper prefix of a well-formed character
  };
  Kind kind;
  size_t length;
  char32_t code_point;  // kValid only
};
Utf8Step Utf8Next(std::string_view bytes);

// bytes.decode("utf-8", "replace"): valid UTF-8 passes through unchanged.
std::string ReplaceInvalidUtf8(std::string_view bytes);

class IncrementalDetokenizer {
 public:
  // skip_special: drop ids for which tokenizer.IsSpecial(id) (OpenAI skip_special_tokens). K3's
  // XTML markers <|open|>/<|close|>/<|sep|> are "special": false in tokenizer_config.json and must
  // stay in the text for the output parser (spec §10.4); that relies on IsSpecial following the
  // config's "special" flag. The tokenizer must outlive this object.
  explicit IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special = false);

  // The text that became final with this id (often empty mid-character).
  std::string Push(int32_t id);
  // End of stream: the held bytes of an incomplete trailing character, as U+FFFD.
  std::string Flush();

  size_t held_bytes() const { return pending_.size(); }

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  std::string pending_;  // < 4 bytes: a proper prefix of one UTF-8 character
};

class StopMatcher {
 public:
  struct Output {
    std::string text;        // safe to emit now
    bool stopped = false;    // a stop string matched; later Push() calls return nothing
    size_t stop_index = 0;   // which stop string (index into the constructor's list)
  };

  // Empty strings in `stops` are ignored (they would match everywhere).
  explicit StopMatcher(std::vector<std::string> stops);

  // Feeds decoded text. When several stop strings match, the one starting earliest wins (ties:
  // the earlier one in the list); the text before it is emitted and the rest discarded.
  Output Push(std::string_view text);
  // End of stream without a match: releases the held-back text.
  std::string Flush();

  bool stopped() const { return stopped_; }
  size_t held_bytes() const { return held_.size(); }

 private:
  std::vector<std::string> stops_;
  std::vector<size_t> original_index_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace kimirt
