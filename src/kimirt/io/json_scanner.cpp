// JsonScanner implementation: byte-at-a-time scanning with a lookup table for the string fast
// path (plain printable ASCII), which is where header and index JSON spends its bytes.
#include "kimirt/io/json_scanner.h"

#include <array>
#include <cstdio>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "kimirt/core/check.h"

namespace kimirt {
namespace {

// kPlain[c]: c may appear unescaped in a string and needs no further checking (printable
// ASCII other than '"' and '\').
constexpr std::array<bool, 256> MakePlainTable() {
  std::array<bool, 256> t{};
  for (int c = 0x20; c < 0x80; ++c) t[c] = (c != '"' && c != '\\');
  return t;
}
constexpr std::array<bool, 256> kPlain = MakePlainTable();

// Index of the first byte at or after i that is not kPlain (or n). Tensor names are long runs
// of plain ASCII, so with SSE2 (every x86-64) 16 bytes are tested at a time: '"', '\', and,
// by one signed compare, both controls (< 0x20) and non-ASCII (>= 0x80, negative as int8).
size_t SkipPlain(const char* p, size_t i, size_t n) {
#if defined(__SSE2__)
  const __m128i quote = _mm_set1_epi8('"');
  const __m128i backslash = _mm_set1_epi8('\\');
  const __m128i space = _mm_set1_epi8(0x20);
  while (i + 16 <= n) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
    const __m128i special = _mm_or_si128(
        _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
        _mm_cmplt_epi8(v, space));
    const int mask = _mm_movemask_epi8(special);
    if (mask != 0) return i + static_cast<size_t>(__builtin_ctz(static_cast<unsigned>(mask)));
    i += 16;
  }
#endif
  while (i < n && kPlain[static_cast<unsigned char>(p[i])]) ++i;
  return i;
}

bool IsWhitespace(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool IsDigit(char c) { return c >= '0' && c <= '9'; }

// Length (2-4) of the well-formed UTF-8 sequence at p (p[0] >= 0x80), or 0 if it is not one.
// Follows the Unicode "well-formed byte sequences" table: no overlong forms, no surrogates
// (U+D800..DFFF), nothing above U+10FFFF.
size_t Utf8SequenceLength(const unsigned char* p, size_t avail) {
  const unsigned char c = p[0];
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    len = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    len = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    len = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (avail < len) return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t k = 2; k < len; ++k) {
    if (p[k] < 0x80 || p[k] > 0xBF) return 0;
  }
  return len;
}

void AppendUtf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Four hex digits at p (avail bytes left) -> *cp; false if malformed or short.
bool ParseHex4(const char* p, size_t avail, uint32_t* cp) {
  if (avail < 4) return false;
  uint32_t v = 0;
  for (int k = 0; k < 4; ++k) {
    const char c = p[k];
    uint32_t d;
    if (c >= '0' && c <= '9') {
      d = static_cast<uint32_t>(c - '0');
    } else if (c >= 'a' && c <= 'f') {
      d = static_cast<uint32_t>(c - 'a' + 10);
    } else if (c >= 'A' && c <= 'F') {
      d = static_cast<uint32_t>(c - 'A' + 10);
    } else {
      return false;
    }
    v = (v << 4) | d;
  }
  *cp = v;
  return true;
}

// A byte for an error message: 'x' if printable, else 0xNN.
std::string DescribeByte(char c) {
  const auto u = static_cast<unsigned char>(c);
  char buf[16];
  if (u >= 0x20 && u < 0x7F) {
    std::snprintf(buf, sizeof buf, "'%c'", c);
  } else {
    std::snprintf(buf, sizeof buf, "byte 0x%02X", u);
  }
  return buf;
}

Status SyntaxErrorAt(size_t pos, std::string_view what) {
  return Corrupt("invalid JSON at byte " + std::to_string(pos) + ": " + std::string(what));
}

}  // namespace

std::string_view JsonScanner::KindName(Kind kind) {
  switch (kind) {
    case Kind::kObject: return "object";
    case Kind::kArray: return "array";
    case Kind::kString: return "string";
    case Kind::kNumber: return "number";
    case Kind::kTrue: return "true";
    case Kind::kFalse: return "false";
    case Kind::kNull: return "null";
  }
  return "?";
}

Status JsonScanner::SyntaxError(std::string_view what) const { return SyntaxErrorAt(pos_, what); }

void JsonScanner::SkipWhitespace() {
  while (pos_ < text_.size() && IsWhitespace(text_[pos_])) ++pos_;
}

Result<JsonScanner::Kind> JsonScanner::Peek() {
  SkipWhitespace();
  if (pos_ >= text_.size()) return SyntaxError("unexpected end of input, expected a value");
  const char c = text_[pos_];
  switch (c) {
    case '{': return Kind::kObject;
    case '[': return Kind::kArray;
    case '"': return Kind::kString;
    case 't': return Kind::kTrue;
    case 'f': return Kind::kFalse;
    case 'n': return Kind::kNull;
    default:
      if (c == '-' || IsDigit(c)) return Kind::kNumber;
      return SyntaxError("unexpected " + DescribeByte(c) + ", expected a value");
  }
}

Status JsonScanner::Open(char c) {
  KIMIRT_ASSIGN_OR_RETURN(Kind kind, Peek());
  const Kind want = c == '{' ? Kind::kObject : Kind::kArray;
  if (kind != want) {
    return Corrupt("expected " + std::string(KindName(want)) + ", got " +
                   std::string(KindName(kind)));
  }
  if (depth_ >= kMaxDepth) {
    return SyntaxError("nesting deeper than " + std::to_string(kMaxDepth) + " levels");
  }
  ++pos_;
  first_bits_ |= uint64_t{1} << depth_;
  ++depth_;
  return Status::Ok();
}

Status JsonScanner::BeginObject() { return Open('{'); }
Status JsonScanner::BeginArray() { return Open('['); }

Status JsonScanner::BeginObject(std::string_view expectation) {
  KIMIRT_ASSIGN_OR_RETURN(Kind kind, Peek());
  if (kind != Kind::kObject) {
    return Corrupt(std::string(expectation) + ", got " + std::string(KindName(kind)));
  }
  return Open('{');
}

// The step NextMember and NextElement share: consumes `close` (returning false and leaving the
// container) or, unless this is the container's first item, the ',' before the next one.
Result<bool> JsonScanner::NextItem(char close, std::string_view container) {
  const uint64_t bit = uint64_t{1} << (depth_ - 1);
  SkipWhitespace();
  if (pos_ >= text_.size()) {
    return SyntaxError("unexpected end of input inside an " + std::string(container));
  }
  if (text_[pos_] == close) {
    // "[1,]" / "{"a":1,}": after a ',' the item that follows fails on the close, so reaching
    // here means the container is properly closed.
    ++pos_;
    first_bits_ &= ~bit;
    --depth_;
    return false;
  }
  if (first_bits_ & bit) {
    first_bits_ &= ~bit;
  } else {
    if (text_[pos_] != ',') {
      return SyntaxError("unexpected " + DescribeByte(text_[pos_]) + ", expected ',' or '" +
                         std::string(1, close) + "'");
    }
    ++pos_;
    SkipWhitespace();
  }
  return true;
}

Result<bool> JsonScanner::NextMember(std::string_view* key) {
  KIMIRT_CHECK_MSG(depth_ > 0, "NextMember outside an object");
  KIMIRT_ASSIGN_OR_RETURN(bool more, NextItem('}', "object"));
  if (!more) return false;
  if (pos_ >= text_.size()) return SyntaxError("unexpected end of input, expected a key");
  if (text_[pos_] != '"') {
    return SyntaxError("unexpected " + DescribeByte(text_[pos_]) + ", expected a string key");
  }
  KIMIRT_RETURN_IF_ERROR(ScanString(key, &key_scratch_));
  SkipWhitespace();
  if (pos_ >= text_.size() || text_[pos_] != ':') return ErrorExpected("':' after a key");
  ++pos_;
  return true;
}

Result<bool> JsonScanner::NextElement() {
  KIMIRT_CHECK_MSG(depth_ > 0, "NextElement outside an array");
  return NextItem(']', "array");
}

Status JsonScanner::ErrorExpected(std::string_view what) {
  if (pos_ >= text_.size()) return SyntaxError("unexpected end of input, expected " + std::string(what));
  return SyntaxError("unexpected " + DescribeByte(text_[pos_]) + ", expected " + std::string(what));
}

Status JsonScanner::ScanString(std::string_view* out, std::string* scratch) {
  const char* p = text_.data();
  const size_t n = text_.size();
  const size_t open = pos_;
  size_t i = pos_ + 1;
  size_t run = i;  // start of the input run not yet copied to *scratch (once escaped)
  bool escaped = false;
  for (;;) {
    i = SkipPlain(p, i, n);
    if (i >= n) return SyntaxErrorAt(open, "unterminated string");
    const auto c = static_cast<unsigned char>(p[i]);
    if (c == '"') {
      if (escaped) {
        scratch->append(p + run, i - run);
        *out = *scratch;
      } else {
        *out = text_.substr(open + 1, i - open - 1);
      }
      pos_ = i + 1;
      return Status::Ok();
    }
    if (c == '\\') {
      if (!escaped) {
        escaped = true;
        scratch->clear();
      }
      scratch->append(p + run, i - run);
      if (i + 1 >= n) return SyntaxErrorAt(open, "unterminated string");
      const char e = p[i + 1];
      switch (e) {
        case '"': scratch->push_back('"'); i += 2; break;
        case '\\': scratch->push_back('\\'); i += 2; break;
        case '/': scratch->push_back('/'); i += 2; break;
        case 'b': scratch->push_back('\b'); i += 2; break;
        case 'f': scratch->push_back('\f'); i += 2; break;
        case 'n': scratch->push_back('\n'); i += 2; break;
        case 'r': scratch->push_back('\r'); i += 2; break;
        case 't': scratch->push_back('\t'); i += 2; break;
        case 'u': {
          uint32_t cp;
          if (!ParseHex4(p + i + 2, n - i - 2, &cp)) {
            return SyntaxErrorAt(i, "\\u must be followed by 4 hex digits");
          }
          if (cp >= 0xDC00 && cp <= 0xDFFF) {
            return SyntaxErrorAt(i, "lone low surrogate in \\u escape");
          }
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low surrogate: the pair encodes
            // one code point above U+FFFF.
            uint32_t lo;
            if (i + 7 >= n || p[i + 6] != '\\' || p[i + 7] != 'u' ||
                !ParseHex4(p + i + 8, n - i - 8, &lo) || lo < 0xDC00 || lo > 0xDFFF) {
              return SyntaxErrorAt(i, "high surrogate not followed by a low surrogate escape");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            i += 6;
          }
          AppendUtf8(scratch, cp);
          i += 6;
          break;
        }
        default:
          return SyntaxErrorAt(i, "invalid escape: backslash followed by " + DescribeByte(e));
      }
      run = i;
      continue;
    }
    if (c < 0x20) {
      char buf[48];
      std::snprintf(buf, sizeof buf, "unescaped control character 0x%02X in a string", c);
      return SyntaxErrorAt(i, buf);
    }
    // c >= 0x80: the start of a multi-byte UTF-8 sequence.
    const size_t len =
        Utf8SequenceLength(reinterpret_cast<const unsigned char*>(p + i), n - i);
    if (len == 0) return SyntaxErrorAt(i, "invalid UTF-8 in a string");
    i += len;
  }
}

Status JsonScanner::ScanNumber(std::string_view* literal, bool* is_uint) {
  const size_t n = text_.size();
  const size_t start = pos_;
  size_t i = pos_;
  bool plain = true;
  if (text_[i] == '-') {
    plain = false;
    ++i;
  }
  if (i >= n || !IsDigit(text_[i])) {
    pos_ = i;
    return ErrorExpected("a digit");
  }
  if (text_[i] == '0') {
    ++i;
    if (i < n && IsDigit(text_[i])) {
      pos_ = i;
      return SyntaxError("leading zero in a number");
    }
  } else {
    while (i < n && IsDigit(text_[i])) ++i;
  }
  if (i < n && text_[i] == '.') {
    plain = false;
    ++i;
    if (i >= n || !IsDigit(text_[i])) {
      pos_ = i;
      return ErrorExpected("a digit after '.'");
    }
    while (i < n && IsDigit(text_[i])) ++i;
  }
  if (i < n && (text_[i] == 'e' || text_[i] == 'E')) {
    plain = false;
    ++i;
    if (i < n && (text_[i] == '+' || text_[i] == '-')) ++i;
    if (i >= n || !IsDigit(text_[i])) {
      pos_ = i;
      return ErrorExpected("a digit in the exponent");
    }
    while (i < n && IsDigit(text_[i])) ++i;
  }
  pos_ = i;
  *literal = text_.substr(start, i - start);
  *is_uint = plain;
  return Status::Ok();
}

Status JsonScanner::ExpectLiteral(std::string_view word) {
  if (text_.substr(pos_, word.size()) != word) {
    return SyntaxError("invalid literal, expected " + std::string(word));
  }
  pos_ += word.size();
  return Status::Ok();
}

Status JsonScanner::ReadString(std::string_view* out) {
  KIMIRT_ASSIGN_OR_RETURN(Kind kind, Peek());
  if (kind != Kind::kString) return Corrupt("expected a string, got " + std::string(KindName(kind)));
  return ScanString(out, &value_scratch_);
}

Status JsonScanner::ReadUint64(uint64_t* out) {
  // Fast path for what valid headers hold: a digit string without leading zero, fraction or
  // exponent, parsed in one pass. Anything else takes the general path below.
  SkipWhitespace();
  const size_t n = text_.size();
  size_t i = pos_;
  if (i < n && IsDigit(text_[i]) && !(text_[i] == '0' && i + 1 < n && IsDigit(text_[i + 1]))) {
    uint64_t v = 0;
    bool overflow = false;
    for (; i < n && IsDigit(text_[i]); ++i) {
      overflow |= __builtin_mul_overflow(v, uint64_t{10}, &v);
      overflow |= __builtin_add_overflow(v, static_cast<uint64_t>(text_[i] - '0'), &v);
    }
    if (!overflow && (i >= n || (text_[i] != '.' && text_[i] != 'e' && text_[i] != 'E'))) {
      pos_ = i;
      *out = v;
      return Status::Ok();
    }
  }
  KIMIRT_ASSIGN_OR_RETURN(Kind kind, Peek());
  if (kind != Kind::kNumber) {
    if (kind == Kind::kString) {
      // Name the string: "expected ... got string \"12\"" tells the reader what went wrong.
      std::string_view s;
      KIMIRT_RETURN_IF_ERROR(ScanString(&s, &value_scratch_));
      return Corrupt("expected a non-negative integer, got string \"" +
                     std::string(s.substr(0, 64)) + "\"");
    }
    return Corrupt("expected a non-negative integer, got " + std::string(KindName(kind)));
  }
  std::string_view literal;
  bool is_uint = false;
  KIMIRT_RETURN_IF_ERROR(ScanNumber(&literal, &is_uint));
  if (!is_uint) {
    return Corrupt("expected a non-negative integer, got " + std::string(literal.substr(0, 64)));
  }
  uint64_t v = 0;
  for (char c : literal) {
    const auto d = static_cast<uint64_t>(c - '0');
    if (v > (UINT64_MAX - d) / 10) {
      return Corrupt("integer " + std::string(literal.substr(0, 64)) + " does not fit in 64 bits");
    }
    v = v * 10 + d;
  }
  *out = v;
  return Status::Ok();
}

Status JsonScanner::SkipValue() {
  KIMIRT_ASSIGN_OR_RETURN(Kind kind, Peek());
  switch (kind) {
    case Kind::kObject: {
      KIMIRT_RETURN_IF_ERROR(BeginObject());
      std::string_view key;
      for (;;) {
        KIMIRT_ASSIGN_OR_RETURN(bool more, NextMember(&key));
        if (!more) return Status::Ok();
        KIMIRT_RETURN_IF_ERROR(SkipValue());
      }
    }
    case Kind::kArray: {
      KIMIRT_RETURN_IF_ERROR(BeginArray());
      for (;;) {
        KIMIRT_ASSIGN_OR_RETURN(bool more, NextElement());
        if (!more) return Status::Ok();
        KIMIRT_RETURN_IF_ERROR(SkipValue());
      }
    }
    case Kind::kString: {
      std::string_view s;
      return ScanString(&s, &value_scratch_);
    }
    case Kind::kNumber: {
      std::string_view literal;
      bool is_uint;
      return ScanNumber(&literal, &is_uint);
    }
    case Kind::kTrue: return ExpectLiteral("true");
    case Kind::kFalse: return ExpectLiteral("false");
    case Kind::kNull: return ExpectLiteral("null");
  }
  return Internal("unreachable JSON kind");
}

Status JsonScanner::Finish() {
  KIMIRT_CHECK_MSG(depth_ == 0, "Finish() inside an unfinished object or array");
  SkipWhitespace();
  if (pos_ != text_.size()) {
    return SyntaxError("unexpected " + DescribeByte(text_[pos_]) + " after the JSON value");
  }
  return Status::Ok();
}

Status ValidateJson(std::string_view text) {
  JsonScanner s(text);
  KIMIRT_RETURN_IF_ERROR(s.SkipValue());
  return s.Finish();
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    if (p[i] < 0x80) {
      ++i;
      continue;
    }
    const size_t len = Utf8SequenceLength(p + i, n - i);
    if (len == 0) return false;
    i += len;
  }
  return true;
}

void AppendJsonString(std::string* out, std::string_view s) {
  out->push_back('"');
  size_t run = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    out->append(s.data() + run, i - run);
    run = i + 1;
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default: {
        char buf[8];
        std::snprintf(buf, sizeof buf, "\\u%04x", c);
        out->append(buf);
      }
    }
  }
  out->append(s.data() + run, s.size() - run);
  out->push_back('"');
}

}  // namespace kimirt
