// Tokenizer: Kimi's tiktoken-format byte-level BPE (spec §10.1) with its special tokens
// (spec §10.2). Loaded from a model directory's `tiktoken.model` (base64 token + rank per line)
// and `tokenizer_config.json` (added_tokens_decoder names the ids after the base vocabulary;
// unnamed ones are `<|reserved_token_N|>`).
//
// Encode() is byte-identical to the PyPI `tiktoken` Encoding built from the same ranks and the
// K3 pattern string. Thread safety: a loaded Tokenizer is immutable; Encode/Decode may run
// concurrently.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // DIR/tiktoken.model + DIR/tokenizer_config.json (the latter optional: reserved names only).
  static Result<std::unique_ptr<Tokenizer>> Load(const std::string& dir);
  // From tiktoken.model text and tokenizer_config.json text ("" for none). `num_reserved`
  // special ids follow the base vocabulary (256 for Kimi).
  static Result<std::unique_ptr<Tokenizer>> FromStrings(std::string_view tiktoken_model,
                                                        std::string_view tokenizer_config_json,
                                                        int num_reserved = 256);

  // Ordinary text → ids. With allow_special = false, special-token strings ("<|open|>") are
  // encoded as the plain text they are; with true, they become their special ids.
  virtual std::vector<int32_t> Encode(std::string_view text, bool allow_special = false) const = 0;
  // ids → bytes (special tokens as their names). The bytes may end inside a UTF-8 sequence.
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;

  virtual int32_t vocab_size() const = 0;  // base ranks + reserved specials
  virtual int32_t num_base_tokens() const = 0;
  // The bytes of one token (special tokens: their name). Empty for ids out of range.
  virtual std::string_view TokenBytes(int32_t id) const = 0;
  virtual std::optional<int32_t> SpecialTokenId(std::string_view name) const = 0;
  virtual bool IsSpecial(int32_t id) const = 0;
};

// The Kimi-K3 pre-tokenizer pattern as tiktoken spells it (spec §10.1, with `&&` class
// intersections), for comparison with the PyPI tiktoken library.
std::string_view KimiPatternString();

}  // namespace kimirt
