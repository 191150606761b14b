// Tokenizer: Kimi's tiktoken-format byte-level BPE (spec §10.1) with its special tokens
// (spec §10.2). Loaded from a model directory's `tiktoken.model` (base64 token + rank per line)
// and `tokenizer_config.json` (added_tokens_decoder names the ids after the base vocabulary;
// unnamed ones are `<|reserved_token_N|>`).
//
// Encode() is byte-identical to the PyPI `tiktoken` Encoding built from the same ranks and the
// K3 pattern string, driven as NeMo's tokenization_kimi.py drives it: texts are first cut into
// <= 400,000-character chunks and at runs of more than 25,000 whitespace / non-whitespace
// characters (spec §10.1), each slice encoded on its own (TokenizerVsTiktoken checks this on a
// multi-megabyte corpus and every code point of planes 0-3 and 14). Input is bytes: each byte
// of ill-formed UTF-8 (which tiktoken never sees) becomes its own piece, so
// Decode(Encode(x)) == x for any x. Implementation: tiktoken_bpe.{h,cpp}, pretokenizer.{h,cpp}.
//
// Special tokens: all `num_reserved` ids are special *tokens* for Encode (allow_special) and
// Decode, whatever their "special" flag; IsSpecial() is the flag (unnamed reserved ids: true),
// i.e. what skip_special_tokens drops.
//
// Thread safety: a loaded Tokenizer is immutable; Encode/Decode may run concurrently.
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
  // encoded as the plain text they are; with true, they become their special ids (leftmost
  // occurrence first; the longest name where names overlap) and the text between them is
  // encoded piece by piece as if it stood alone. No BOS is added (spec §10.1).
  virtual std::vector<int32_t> Encode(std::string_view text, bool allow_special = false) const = 0;
  // ids → bytes (special tokens as their names; ids outside [0, vocab_size()) add nothing).
  // The bytes may end inside a UTF-8 sequence.
  virtual std::string Decode(std::span<const int32_t> ids) const = 0;

  virtual int32_t vocab_size() const = 0;  // base ranks + reserved specials
  virtual int32_t num_base_tokens() const = 0;
  // The bytes of one token (special tokens: their name). Empty for ids out of range.
  virtual std::string_view TokenBytes(int32_t id) const = 0;
  virtual std::optional<int32_t> SpecialTokenId(std::string_view name) const = 0;
  // The tokenizer_config.json "special" flag of a reserved id (false for K3's XTML markers
  // <|open|>/<|close|>/<|sep|>; true for unnamed ids and where the flag is absent); false for
  // base tokens and ids out of range.
  virtual bool IsSpecial(int32_t id) const = 0;
};

// The Kimi-K3 pre-tokenizer pattern as tiktoken spells it (spec §10.1, with `&&` class
// intersections), for comparison with the PyPI tiktoken library.
std::string_view KimiPatternString();

}  // namespace kimirt
