// Pretokenizer: splits text into the pieces that Kimi's tiktoken BPE encodes one at a time
// (spec §10.1), exactly where the PyPI `tiktoken` library (Rust fancy-regex, Unicode 16 tables)
// splits them with the K3 pattern. The only file that talks to PCRE2.
//
// Two things stand between the K3 pattern and PCRE2 10.42 (landscape.md "Tokenizer regex note"):
// - `[X&&[^\p{Han}]]` (class intersection) does not exist in PCRE2; it becomes
//   `(?:(?!\p{sc:Han})[X])`, a per-character negative lookahead.
// - Property names do not mean the same thing in both engines:
//   * PCRE2 10.40+ reads a bare `\p{Han}` as Script_Extensions (so "、" and "。" would join a Han
//     run); Rust's `\p{Han}` is the Script property, spelled `\p{sc:Han}` in PCRE2.
//   * Rust's `\s` is the Unicode White_Space property; PCRE2's `\s` (UCP) also matches U+180E.
//     We spell White_Space out as a class.
//   * PCRE2 10.42 has Unicode 14 tables; tiktoken 0.14 has Unicode 16. The characters assigned
//     in 15.0–16.0 that are letters, digits or Han are added to the classes by code point, as
//     tiktoken classifies them (found by probing tiktoken with every code point of planes 0–3
//     and 14; tests/python/tokenizer_vs_tiktoken.py re-checks this on every run).
//
// ASCII fast path: most text is ASCII, and a PCRE2 match per piece (with a lookahead per
// letter) is the bottleneck. ForEachPiece() decides pieces that only involve ASCII bytes with a
// hand-written scanner that implements the same pattern semantics (the comments at each branch
// name the alternative it stands for), and hands the piece to PCRE2 as soon as the decision
// needs to look at a non-ASCII byte. Tests compare the two paths on random and real text.
//
// Invalid UTF-8 (tiktoken never sees it: it encodes Python str): PCRE2_MATCH_INVALID_UTF makes
// an ill-formed sequence a barrier no match crosses, as if the text ended there (so `\s+(?!\S)`
// before it keeps all its whitespace); each byte of an ill-formed sequence becomes a piece of
// its own. Pieces always tile the input, so decode(encode(x)) == x for any bytes.
//
// Thread safety: immutable after Create(); ForEachPiece may run concurrently (each call
// creates its own PCRE2 match data).
#pragma once

#include <cstddef>
#include <memory>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

// The K3 pattern rewritten for PCRE2 (compiled with UTF, UCP and MATCH_INVALID_UTF).
std::string_view KimiPatternPcre2();

class Pretokenizer {
 public:
  using PieceFn = void (*)(void* ctx, std::string_view piece);

  // Compiles (and JIT-compiles) the K3 pattern. Fails only if PCRE2 lacks Unicode support.
  static Result<std::unique_ptr<Pretokenizer>> Create();
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;

  // Calls fn(ctx, piece) for each piece of `text` in order; the pieces are views into `text`
  // and concatenate to it. `use_fast_path = false` matches every piece with PCRE2 (tests).
  void ForEachPiece(std::string_view text, PieceFn fn, void* ctx, bool use_fast_path = true) const;

  template <typename F>
  void ForEach(std::string_view text, F&& f, bool use_fast_path = true) const {
    ForEachPiece(
        text,
        [](void* c, std::string_view p) { (*static_cast<std::remove_reference_t<F>*>(c))(p); }, &f,
        use_fast_path);
  }

  std::vector<std::string_view> Split(std::string_view text, bool use_fast_path = true) const {
    std::vector<std::string_view> out;
    ForEach(
        text, [&out](std::string_view p) { out.push_back(p); }, use_fast_path);
    return out;
  }

 private:
  struct Impl;
  explicit Pretokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimirt
