// JsonScanner: a strict RFC 8259 pull scanner that walks JSON text without building a DOM, plus
// the JSON string helpers the safetensors code needs (escaping for the writer, UTF-8 checks).
//
// Why not nlohmann-json: a full Kimi-K3 checkpoint has ~80 MB of header and index JSON with
// ~1M objects; a DOM allocates a node per value and costs seconds. The scanner hands out string
// views into the input (decoding into a scratch buffer only when a string has escapes) and
// lets the caller read exactly the structure it expects, so validation and extraction happen
// in one pass.
//
// Strictness: objects, arrays, strings (all escapes, \uXXXX with surrogate pairs decoded to
// UTF-8; lone surrogates, raw control characters and invalid UTF-8 are rejected), numbers in
// the RFC grammar, true/false/null, whitespace = space, tab, LF, CR. Nesting is limited to
// kMaxDepth so hostile input cannot exhaust the stack. Syntax errors are kCorrupt Statuses
// "invalid JSON at byte N: ..."; N counts from the start of the scanned text.
//
// Usage (every opened object/array must be iterated to its end):
//   JsonScanner s(text);
//   KIMIRT_RETURN_IF_ERROR(s.BeginObject());
//   std::string_view key;
//   for (;;) {
//     KIMIRT_ASSIGN_OR_RETURN(bool more, s.NextMember(&key));
//     if (!more) break;
//     ... read or SkipValue() the member's value ...
//   }
//   KIMIRT_RETURN_IF_ERROR(s.Finish());
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kimirt/core/status.h"

namespace kimirt {

class JsonScanner {
 public:
  static constexpr int kMaxDepth = 64;

  enum class Kind : uint8_t { kObject, kArray, kString, kNumber, kTrue, kFalse, kNull };

  explicit JsonScanner(std::string_view text) : text_(text) {}

  // The kind of the next value (after whitespace), without consuming it. An error at the end
  // of input or at a byte that cannot start a value.
  Result<Kind> Peek();

  // Consumes '{' / '['. Errors if the next value is something else or nesting is too deep.
  Status BeginObject();
  Status BeginArray();
  // Consumes '{' of a value the format requires to be an object; any other kind is the kCorrupt
  // error "<expectation>, got <kind>", e.g. "\"metadata\" must be an object, got array".
  Status BeginObject(std::string_view expectation);
  // Moves to the next member of the innermost open object: returns true with *key set and the
  // ':' consumed (the caller must then consume the value), or false after consuming '}'.
  // *key views the input, or a scratch buffer valid until the next NextMember() call.
  Result<bool> NextMember(std::string_view* key);
  // Moves to the next element of the innermost open array: true (the caller consumes the value)
  // or false after consuming ']'.
  Result<bool> NextElement();

  // Consumes a string value. *out views the input, or a scratch buffer valid until the next
  // ReadString() call. Errors (naming the kind found) if the next value is not a string.
  Status ReadString(std::string_view* out);
  // Consumes a number that must be a non-negative integer literal (no sign, fraction or
  // exponent) fitting in uint64_t: "12" yes; "-1", "1.5", "1e3", "18446744073709551616" no.
  Status ReadUint64(uint64_t* out);
  // Consumes and validates any value, including nested ones.
  Status SkipValue();
  // Succeeds iff only whitespace remains (call after the top-level value).
  Status Finish();

  // Byte offset of the next unread byte.
  size_t offset() const { return pos_; }
  // "invalid JSON at byte <offset()>: <what>" (kCorrupt).
  Status SyntaxError(std::string_view what) const;

  // "object", "array", "string", ...
  static std::string_view KindName(Kind kind);

 private:
  void SkipWhitespace();
  // Scans the string whose opening quote is at pos_. With `decode`, *out receives the decoded
  // text (a view of the input when there are no escapes, else of *scratch).
  Status ScanString(std::string_view* out, std::string* scratch);
  // Scans a number at pos_ in RFC grammar; *is_uint is set when it is a plain digit string.
  Status ScanNumber(std::string_view* literal, bool* is_uint);
  Status ExpectLiteral(std::string_view word);
  Status ErrorExpected(std::string_view what);
  Status Open(char c);
  Result<bool> NextItem(char close, std::string_view container);

  std::string_view text_;
  size_t pos_ = 0;
  int depth_ = 0;
  // Bit d-1 is set while the container at depth d has not yet produced a member/element, so
  // NextMember/NextElement know whether a ',' must come first.
  uint64_t first_bits_ = 0;
  std::string key_scratch_;
  std::string value_scratch_;
};

// Checks that `text` is exactly one JSON value (with optional surrounding whitespace).
Status ValidateJson(std::string_view text);

// True iff `s` is well-formed UTF-8 (no overlong forms, no surrogates, at most U+10FFFF).
bool IsValidUtf8(std::string_view s);

// Appends `s` as a JSON string literal (quotes included): '"' and '\' escaped, control
// characters as \b \f \n \r \t or \u00XX, everything else (UTF-8 included) verbatim.
void AppendJsonString(std::string* out, std::string_view s);

}  // namespace kimirt
