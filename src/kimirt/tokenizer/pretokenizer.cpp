// K3 pre-tokenizer: PCRE2 translation of the tiktoken pattern plus an ASCII fast path
// (pretokenizer.h explains both). Spec §10.1 lists the pattern's eight alternatives; the
// comments below refer to them as alt 1..8.
#include "kimirt/tokenizer/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <limits>
#include <string>

namespace kimirt {

namespace {

// ---------------------------------------------------------------------------------------------
// The pattern

// clang-format off
// Rust's `\s`: the Unicode White_Space property (unchanged since Unicode 6.3).
#define KIMIRT_WS                                                                     \
  "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}" \
  "\\x{202F}\\x{205F}\\x{3000}"

// Code points unassigned in Unicode 14 (PCRE2 10.42) that tiktoken's Unicode 16 tables put in a
// class the pattern uses. Derived by probing tiktoken 0.14.0 with every code point of planes
// 0-3 and 14 in the contexts "你"+c, "a"+c, "A"+c, "1"+c, "!"+c, "!!"+c, "\t"+c and c+"a".
// Han (Script=Han): CJK extensions H and I, and U+2B739.
#define KIMIRT_NEW_HAN "\\x{2B739}\\x{2EBF0}-\\x{2EE5D}\\x{31350}-\\x{323AF}"
// \p{N}: new decimal digits (Garay, Myanmar ext., Sunuwar, Kawi, Kirat Rai, Gurung Khema,
// Outlined digits, Kaktovik numerals, Nag Mundari, Ol Onal).
#define KIMIRT_NEW_N                                                                       \
  "\\x{10D40}-\\x{10D49}\\x{116D0}-\\x{116E3}\\x{11BF0}-\\x{11BF9}\\x{11F50}-\\x{11F59}"   \
  "\\x{16130}-\\x{16139}\\x{16D70}-\\x{16D79}\\x{1CCF0}-\\x{1CCF9}\\x{1D2C0}-\\x{1D2D3}"   \
  "\\x{1E4F0}-\\x{1E4F9}\\x{1E5F1}-\\x{1E5FA}"
// Ll, Lm, Lo or M (not Han): the members of both letter classes of alts 2 and 3.
#define KIMIRT_NEW_LOWER_OR_MARK                                                           \
  "\\x{897}\\x{CF3}\\x{ECE}\\x{1C8A}\\x{A7CD}\\x{A7DB}\\x{105C0}-\\x{105F3}"                \
  "\\x{10D4A}-\\x{10D4F}\\x{10D69}-\\x{10D6D}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}"   \
  "\\x{10EFC}-\\x{10EFF}\\x{1123F}-\\x{11241}\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}"    \
  "\\x{11390}-\\x{113B5}\\x{113B7}-\\x{113C0}\\x{113C2}\\x{113C5}\\x{113C7}-\\x{113CA}"    \
  "\\x{113CC}-\\x{113D3}\\x{113E1}-\\x{113E2}\\x{11BC0}-\\x{11BE0}\\x{11F00}-\\x{11F10}"   \
  "\\x{11F12}-\\x{11F3A}\\x{11F3E}-\\x{11F42}\\x{11F5A}\\x{1342F}\\x{13440}-\\x{13455}"    \
  "\\x{13460}-\\x{143FA}\\x{16100}-\\x{1612F}\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}"    \
  "\\x{1B155}\\x{1DF25}-\\x{1DF2A}\\x{1E030}-\\x{1E06D}\\x{1E08F}\\x{1E4D0}-\\x{1E4EF}"    \
  "\\x{1E5D0}-\\x{1E5F0}"
// Lu or Lt: members of alt 3's upper class only.
#define KIMIRT_NEW_UPPER "\\x{1C89}\\x{A7CB}-\\x{A7CC}\\x{A7DA}\\x{A7DC}\\x{10D50}-\\x{10D65}"
// \p{L} (letters of any kind, Han included; marks excluded): for the negated classes.
#define KIMIRT_NEW_L                                                                       \
  "\\x{1C89}-\\x{1C8A}\\x{A7CB}-\\x{A7CD}\\x{A7DA}-\\x{A7DC}\\x{105C0}-\\x{105F3}"          \
  "\\x{10D4A}-\\x{10D65}\\x{10D6F}-\\x{10D85}\\x{10EC2}-\\x{10EC4}\\x{1123F}-\\x{11240}"   \
  "\\x{11380}-\\x{11389}\\x{1138B}\\x{1138E}\\x{11390}-\\x{113B5}\\x{113B7}\\x{113D1}"     \
  "\\x{113D3}\\x{11BC0}-\\x{11BE0}\\x{11F02}\\x{11F04}-\\x{11F10}\\x{11F12}-\\x{11F33}"    \
  "\\x{1342F}\\x{13441}-\\x{13446}\\x{13460}-\\x{143FA}\\x{16100}-\\x{1611D}"              \
  "\\x{16D40}-\\x{16D6C}\\x{18CFF}\\x{1B132}\\x{1B155}\\x{1DF25}-\\x{1DF2A}"               \
  "\\x{1E030}-\\x{1E06D}\\x{1E4D0}-\\x{1E4EB}\\x{1E5D0}-\\x{1E5ED}\\x{1E5F0}" KIMIRT_NEW_HAN

// `[X&&[^\p{Han}]]` → `(?:(?!\p{sc:Han})[X])`. The lookahead only needs PCRE2's own Han set:
// the added Han code points are in no letter class here (with a newer PCRE2 they are Lo and
// sc:Han at once, so the lookahead removes them again).
#define KIMIRT_UPPER_OR_MARK \
  "(?:(?!\\p{sc:Han})[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}" KIMIRT_NEW_LOWER_OR_MARK KIMIRT_NEW_UPPER "])"
#define KIMIRT_LOWER_OR_MARK \
  "(?:(?!\\p{sc:Han})[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}" KIMIRT_NEW_LOWER_OR_MARK "])"
#define KIMIRT_PREFIX "[^\\r\\n\\p{L}\\p{N}" KIMIRT_NEW_L KIMIRT_NEW_N "]?"
#define KIMIRT_CONTRACTION "(?i:'s|'t|'re|'ve|'m|'ll|'d)?"

constexpr char kPcre2Pattern[] =
    /* 1 */ "[\\p{sc:Han}" KIMIRT_NEW_HAN "]+"
    /* 2 */ "|" KIMIRT_PREFIX KIMIRT_UPPER_OR_MARK "*" KIMIRT_LOWER_OR_MARK "+" KIMIRT_CONTRACTION
    /* 3 */ "|" KIMIRT_PREFIX KIMIRT_UPPER_OR_MARK "+" KIMIRT_LOWER_OR_MARK "*" KIMIRT_CONTRACTION
    /* 4 */ "|[\\p{N}" KIMIRT_NEW_N "]{1,3}"
    /* 5 */ "| ?[^" KIMIRT_WS "\\p{L}\\p{N}" KIMIRT_NEW_L KIMIRT_NEW_N "]+[\\r\\n]*"
    /* 6 */ "|[" KIMIRT_WS "]*[\\r\\n]+"
    /* 7 */ "|[" KIMIRT_WS "]+(?![^" KIMIRT_WS "])"
    /* 8 */ "|[" KIMIRT_WS "]+";
// clang-format on

// ---------------------------------------------------------------------------------------------
// ASCII fast path

// What the pattern can tell apart among ASCII characters. Rust's `\s` has no other ASCII
// members than \t \n \v \f \r and space (0x1C-0x1F are not White_Space), so they are symbols.
enum Cls : uint8_t { kUpper, kLower, kDigit, kNewline, kSpace, kSymbol, kNonAscii, kEnd };

constexpr std::array<uint8_t, 128> MakeAsciiClasses() {
  std::array<uint8_t, 128> t{};
  for (int c = 0; c < 128; ++c) {
    uint8_t k = kSymbol;
    if (c >= 'A' && c <= 'Z')
      k = kUpper;
    else if (c >= 'a' && c <= 'z')
      k = kLower;
    else if (c >= '0' && c <= '9')
      k = kDigit;
    else if (c == '\r' || c == '\n')
      k = kNewline;
    else if (c == '\t' || c == '\v' || c == '\f' || c == ' ')
      k = kSpace;
    t[static_cast<size_t>(c)] = k;
  }
  return t;
}
constexpr std::array<uint8_t, 128> kAsciiClasses = MakeAsciiClasses();

constexpr size_t kFallback = std::numeric_limits<size_t>::max();  // ask PCRE2
constexpr size_t kNoMatch = kFallback - 1;

class FastScanner {
 public:
  explicit FastScanner(std::string_view t) : t_(t) {}

  Cls At(size_t i) const {
    if (i >= t_.size()) return kEnd;
    const auto b = static_cast<uint8_t>(t_[i]);
    return b >= 0x80 ? kNonAscii : static_cast<Cls>(kAsciiClasses[b]);
  }

  // The end of the piece starting at p, or kFallback when that depends on a non-ASCII byte.
  size_t Piece(size_t p) const {
    const Cls c = At(p);
    switch (c) {
      case kUpper:
      case kLower:
        return Letters(p);  // alt 2 or 3 without the optional prefix
      case kDigit: {        // alt 4: up to three digits
        size_t i = p + 1;
        for (int k = 1; k < 3; ++k, ++i) {
          const Cls d = At(i);
          if (d == kNonAscii) return kFallback;  // could be a non-ASCII \p{N}
          if (d != kDigit) break;
        }
        return i;
      }
      case kSymbol:
      case kSpace: {
        const Cls n = At(p + 1);
        if (n == kNonAscii) return kFallback;
        // Alts 2/3 with the prefix [^\r\n\p{L}\p{N}] (a symbol, space or tab) before letters.
        if (n == kUpper || n == kLower) return Letters(p + 1);
        // Alt 5: ` ?[^\s\p{L}\p{N}]+[\r\n]*`.
        if (c == kSymbol || (t_[p] == ' ' && n == kSymbol)) {
          size_t i = c == kSymbol ? p + 1 : p + 2;
          Cls d;
          while ((d = At(i)) == kSymbol) ++i;
          if (d == kNonAscii) return kFallback;  // could be a non-ASCII symbol
          while (At(i) == kNewline) ++i;
          return i;
        }
        return Whitespace(p);
      }
      case kNewline:
        return Whitespace(p);
      case kNonAscii:
      case kEnd:
        break;
    }
    return kFallback;
  }

 private:
  // Alts 2 and 3 from q (after any prefix). For ASCII, upper- and lowercase letters are disjoint
  // classes, so U* (alt 2) or U+ (alt 3) takes the whole uppercase run without backtracking.
  size_t Letters(size_t q) const {
    size_t i = q;
    Cls c;
    while ((c = At(i)) == kUpper) ++i;
    // Non-ASCII here might be a mark or Lm/Lo letter (in both classes), which changes how the
    // uppercase run splits between U* and L+.
    if (c == kNonAscii) return kFallback;
    if (c == kLower) {  // alt 2: U* L+
      while ((c = At(i)) == kLower) ++i;
      if (c == kNonAscii) return kFallback;
      return Contraction(i);
    }
    if (i == q) return kNoMatch;  // unreachable: callers start at a letter
    return Contraction(i);        // alt 3: U+ and an empty L*
  }

  // `(?i:'s|'t|'re|'ve|'m|'ll|'d)?` at i.
  size_t Contraction(size_t i) const {
    if (At(i) != kSymbol || t_[i] != '\'') return i;
    const Cls c1 = At(i + 1);
    if (c1 == kNonAscii) return kFallback;  // "'ſ" (U+017F folds to s) is a contraction
    if (c1 != kUpper && c1 != kLower) return i;
    const char l1 = static_cast<char>(t_[i + 1] | 0x20);
    if (l1 == 's' || l1 == 't' || l1 == 'm' || l1 == 'd') return i + 2;
    char want;
    if (l1 == 'r' || l1 == 'v')
      want = 'e';
    else if (l1 == 'l')
      want = 'l';
    else
      return i;
    const Cls c2 = At(i + 2);
    if (c2 == kNonAscii) return kFallback;
    if ((c2 == kUpper || c2 == kLower) && static_cast<char>(t_[i + 2] | 0x20) == want) {
      return i + 3;
    }
    return i;
  }

  // Alts 6-8 on a whitespace run starting at p (alts 2/3/5 did not match).
  size_t Whitespace(size_t p) const {
    size_t i = p;
    size_t last_newline = kFallback;
    for (;; ++i) {
      const Cls d = At(i);
      if (d == kNewline)
        last_newline = i;
      else if (d != kSpace)
        break;
    }
    if (At(i) == kNonAscii) return kFallback;  // NBSP, U+3000, ... continue the run
    // Alt 6 `\s*[\r\n]+`: \s* backs off to the last newline of the run.
    if (last_newline != kFallback) return last_newline + 1;
    // Alt 7 `\s+(?!\S)`: all of a run that ends the text, else all but its last character
    // (which then prefixes the next piece).
    if (i == t_.size()) return i;
    if (i - p >= 2) return i - 1;
    return i;  // alt 8: a single whitespace character before non-whitespace
  }

  std::string_view t_;
};

}  // namespace

std::string_view KimiPatternPcre2() { return kPcre2Pattern; }

// ---------------------------------------------------------------------------------------------
// PCRE2

struct Pretokenizer::Impl {
  pcre2_code* code = nullptr;
  bool jit = false;
  ~Impl() {
    if (code != nullptr) pcre2_code_free(code);
  }
};

Pretokenizer::Pretokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Pretokenizer::~Pretokenizer() = default;

Result<std::unique_ptr<Pretokenizer>> Pretokenizer::Create() {
  auto impl = std::make_unique<Impl>();
  int error = 0;
  PCRE2_SIZE offset = 0;
  impl->code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPcre2Pattern), sizeof(kPcre2Pattern) - 1,
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (impl->code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof(message));
    return Internal("compiling the K3 pre-tokenizer pattern with PCRE2 failed at offset " +
                    std::to_string(offset) + ": " + reinterpret_cast<const char*>(message));
  }
  // Without JIT (a PCRE2 built without it) the interpreter gives the same pieces, slower.
  impl->jit = pcre2_jit_compile(impl->code, PCRE2_JIT_COMPLETE) == 0;
  return std::unique_ptr<Pretokenizer>(new Pretokenizer(std::move(impl)));
}

namespace {

// One PCRE2 search per call; owns the match data of one ForEachPiece call.
class Matcher {
 public:
  Matcher(const pcre2_code* code, bool jit) : code_(code), jit_(jit) {}
  ~Matcher() {
    if (data_ != nullptr) pcre2_match_data_free(data_);
  }
  Matcher(const Matcher&) = delete;
  Matcher& operator=(const Matcher&) = delete;

  // The first match at or after `from`: true with [*start, *end), or false if none.
  bool Find(std::string_view text, size_t from, size_t* start, size_t* end) {
    if (data_ == nullptr) data_ = pcre2_match_data_create_from_pattern(code_, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    int rc = PCRE2_ERROR_JIT_STACKLIMIT;
    if (jit_) rc = pcre2_jit_match(code_, subject, text.size(), from, 0, data_, nullptr);
    // The JIT's default 32 KiB stack can run out on very long pieces (alts 2/3 keep a frame
    // per repetition of the lookahead group); the interpreter keeps its frames on the heap.
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT) {
      rc = pcre2_match(code_, subject, text.size(), from, PCRE2_NO_JIT, data_, nullptr);
    }
    if (rc <= 0) return false;  // NOMATCH; other errors cannot occur with this pattern
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(data_);
    *start = ov[0];
    *end = ov[1];
    return true;
  }

 private:
  const pcre2_code* code_;
  bool jit_;
  pcre2_match_data* data_ = nullptr;
};

}  // namespace

void Pretokenizer::ForEachPiece(std::string_view text, PieceFn fn, void* ctx,
                                bool use_fast_path) const {
  const FastScanner fast(text);
  Matcher matcher(impl_->code, impl_->jit);
  size_t p = 0;
  while (p < text.size()) {
    size_t end = use_fast_path ? fast.Piece(p) : kFallback;
    if (end == kFallback || end == kNoMatch) {
      size_t start = 0;
      // Every valid character starts a match (and no match is empty), so bytes the search
      // skips are ill-formed UTF-8: one piece per byte.
      if (!matcher.Find(text, p, &start, &end) || end <= start) start = end = text.size();
      for (; p < start; ++p) fn(ctx, text.substr(p, 1));
      if (p == text.size()) break;
    }
    fn(ctx, text.substr(p, end - p));
    p = end;
  }
}

}  // namespace kimirt
