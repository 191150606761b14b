// Splitting a Kimi-K3 completion into reasoning, content and tool calls (spec §10.3–10.4).
//
// K3 answers in XTML, continuing the generation prompt (chat_renderer.h):
//   [reasoning]<|close|>think<|sep|><|open|>response<|sep|>CONTENT<|close|>response<|sep|>
//   [<|open|>tools<|sep|>
//      <|open|>call tool="NAME" index="1"<|sep|>
//        <|open|>argument key="K" type="T"<|sep|>VALUE<|close|>argument<|sep|> …
//      <|close|>call<|sep|> …
//    <|close|>tools<|sep|>]
//   <|close|>message<|sep|><|end_of_msg|>
// The parser reads the detokenized text, in which the markers appear as their names (they are
// "special": false, so skip_special keeps them). It is incremental: Feed() takes text deltas in
// any split and returns what became final; feeding byte by byte gives the same result as feeding
// everything at once. Reasoning and content stream as they arrive (text that could be the start
// of a marker is held back); a tool call is returned whole when its call element closes.
//
// Robustness: the prompt may already have opened think or response (K3ParseStart says which);
// unterminated elements at Finish() keep what arrived (a cut-off call is returned with
// complete = false and only its finished arguments); markers that make no sense where they appear
// are kept as literal text in the reasoning/content channel rather than dropped, except stray
// framing: a <|sep|> or channel close between channels, a channel re-opened inside itself
// (<|open|>think<|sep|> while thinking), and a bare <|open|> whose text cannot be a tag
// (`<|open|>The user asks…`): that marker is dropped and its text kept. Such an opener is given
// back as soon as its text stops looking like NAME KEY="VALUE"…, so the channel keeps streaming
// (waiting for a <|sep|> that never comes held the whole reasoning back until the end). Inside
// argument and json values every marker but the value's close is literal. Text is never stripped
// of whitespace.
//
// Thread safety: one parser per sequence.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/tokenizer/chat_message.h"

namespace kimirt {

// Where the prompt left the model (the last open tag of the generation prompt).
enum class K3ParseStart : uint8_t {
  kThink,     // ended with <|open|>think<|sep|> (thinking mode)
  kResponse,  // ended with <|open|>response<|sep|> (thinking off)
  kMessage,   // ended with <|open|>message role="assistant"<|sep|> only
};
// The start matching RenderK3Chat's generation prompt for these options.
K3ParseStart K3ParseStartFor(const ChatOptions& options);

struct K3ParsedToolCall {
  std::string id;         // tool_call_id_prefix + n, n counting this completion's calls from 0
  std::string name;       // the call's tool="…" attribute
  // A JSON object in Python json.dumps spelling, built from the typed argument elements:
  // type="string" values stay strings; number/boolean/null/object/array values are parsed as
  // JSON (a value that does not parse stays a string). A call rendered from unparseable
  // arguments (<|open|>json type="object"<|sep|>RAW…) gives RAW back verbatim.
  std::string arguments;
  bool complete = true;   // false: the text ended before <|close|>call
};

struct K3ParseDelta {
  std::string reasoning;
  std::string content;
  std::vector<K3ParsedToolCall> tool_calls;

  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

class K3CompletionParser {
 public:
  explicit K3CompletionParser(K3ParseStart start = K3ParseStart::kThink,
                              std::string tool_call_id_prefix = "call_");

  K3ParseDelta Feed(std::string_view text);
  // End of the completion: releases held text, closes what is open.
  K3ParseDelta Finish();

  // Everything returned so far.
  const std::string& reasoning() const { return reasoning_; }
  const std::string& content() const { return content_; }
  const std::vector<K3ParsedToolCall>& tool_calls() const { return tool_calls_; }
  // The assistant message was closed (<|close|>message or <|end_of_msg|>); later text is ignored.
  bool message_ended() const { return stack_.empty(); }

  // tool_calls() as the OpenAI `tool_calls` array:
  // [{"id":…,"type":"function","function":{"name":…,"arguments":"<JSON text>"}}, …]
  std::string ToolCallsJson() const;

 private:
  enum class Ctx : uint8_t { kMessage, kThink, kResponse, kTools, kCall, kArgument, kJson };
  enum class Lex : uint8_t { kText, kOpenTag, kCloseTag };
  // Where the open-tag text read so far stands in `NAME( KEY="VALUE")*`; kBad: it cannot become
  // a tag any more, so the lexer gives it back as text at once instead of waiting for <|sep|>.
  enum class TagLex : uint8_t { kName, kSpace, kKey, kValueQuote, kValue, kAfterValue, kBad };
  struct Argument {
    std::string key;
    std::string value_json;  // the coerced value as JSON text
  };

  void Run(bool at_end);
  void AdvanceTagLex(std::string_view more);
  void AbandonOpener();
  void OnText(std::string_view text);
  void OnOpen(std::string_view tag_text);
  void OnClose(std::string_view name, bool had_sep);
  void OnEndOfMessage();
  void FinishArgument();
  void FinishCall(bool complete);
  Ctx top() const { return stack_.back(); }

  std::string id_prefix_;
  std::vector<Ctx> stack_;  // empty once the message ended
  Lex lex_ = Lex::kText;
  std::string pending_;  // text not yet lexed (a possible marker prefix)
  std::string tag_;      // open-tag text or close-tag name being read
  TagLex tag_lex_ = TagLex::kName;

  // The call being read.
  bool in_call_ = false;
  std::string call_name_;
  std::vector<Argument> call_args_;
  std::string call_json_;  // raw <json> block
  bool call_has_json_ = false;
  std::string arg_key_;
  std::string arg_type_;
  std::string arg_value_;

  K3ParseDelta delta_;  // being built by the current Feed()/Finish()
  std::string reasoning_;
  std::string content_;
  std::vector<K3ParsedToolCall> tool_calls_;
};

}  // namespace kimirt
