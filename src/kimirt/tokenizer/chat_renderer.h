// Kimi-K3 chat rendering ("XTML", spec §10.3): messages → a list of segments → token ids.
//
// K3 ships no Jinja template; Moonshot's encoding_k3.py builds the prompt as segments, each either
// a structural marker (encoded as its special token) or ordinary text (encoded with every special
// token disallowed, so a user typing "<|open|>" gets plain BPE). Each segment is BPE-encoded on its
// own: merges never cross a segment boundary, which is why the renderer returns segments rather
// than a string. This file reproduces encoding_k3.py's build_chat_segments() segment for segment,
// including its fixed English system-message bodies (docs/chat-format.md lists them).
//
// Not here: images (the multimodal processor replaces placeholders; image parts are refused), and
// parsing model output (output_parser.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/tokenizer/chat_message.h"

namespace kimirt {

class Tokenizer;

struct ChatSegment {
  bool marker = false;  // true: `text` names a special token; false: ordinary text
  std::string text;

  bool operator==(const ChatSegment&) const = default;
};

// K3 XTML marker names (spec §10.2).
inline constexpr std::string_view kK3Open = "<|open|>";
inline constexpr std::string_view kK3Close = "<|close|>";
inline constexpr std::string_view kK3Sep = "<|sep|>";
inline constexpr std::string_view kK3EndOfMsg = "<|end_of_msg|>";

// encoding_k3.py build_chat_segments(messages, tools, thinking=..., thinking_effort=...,
// tool_choice=..., response_format=..., add_generation_prompt=...). Errors (InvalidArgument, or
// Unsupported for image parts) name the offending field, e.g. "messages[3].tool_calls[0].arguments".
Result<std::vector<ChatSegment>> RenderK3Chat(std::span<const ChatMessage> messages,
                                              std::span<const ToolSpec> tools,
                                              const ChatOptions& options);

// Concatenated segment texts: the prompt as Hugging Face's apply_chat_template(tokenize=False)
// returns it. For logs and tests; never re-encode this string (the segment split is lost).
std::string JoinSegments(std::span<const ChatSegment> segments);

// Segments → ids: a marker is tokenizer.SpecialTokenId(text), text is
// tokenizer.Encode(text, /*allow_special=*/false), each segment on its own. A marker the tokenizer
// does not name is an error (NotFound): a K3 chat encoded with the Kimi-Linear-48B
// tokenizer_config would otherwise silently become marker-free BPE (spec §10.2).
Result<std::vector<int32_t>> EncodeSegments(const Tokenizer& tokenizer,
                                            std::span<const ChatSegment> segments);

// JSON text re-spelled the way Python's json.dumps(value, ensure_ascii=False) spells it, shared by
// the renderers and the output parser. compact: separators (",", ":") instead of Python's default
// (", ", ": "); sort_keys: every object's keys sorted (encoding_k3.py deep_sort_dict), else kept in
// document order. Floats use Python's repr (shortest round-trip; exponent form below 1e-4 and from
// 1e16). Invalid JSON is InvalidArgument.
Result<std::string> PythonJsonRedump(std::string_view json_text, bool compact, bool sort_keys);
// A JSON string literal for `s` as json.dumps(s, ensure_ascii=False) writes it; bytes that are not
// valid UTF-8 become U+FFFD.
std::string PythonJsonQuote(std::string_view s);

}  // namespace kimirt
