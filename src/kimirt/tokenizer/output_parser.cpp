// K3 completion parser (output_parser.h). Two layers: a lexer that cuts the text stream into
// text, open tags (<|open|>TAG ATTRS<|sep|>), close tags (<|close|>NAME<|sep|>) and end of
// message, holding back only what could still become a marker; and a context stack that routes
// text to reasoning, content or the tool call being read. The grammar is the one RenderK3Chat
// writes (encoding_k3.py) and ATOM's kimi_k3_tool_parser.py reads.
#include "kimirt/tokenizer/output_parser.h"

#include <array>
#include <utility>

#include "kimirt/tokenizer/chat_renderer.h"

namespace kimirt {
namespace {

// A tag longer than this is not a tag (bounds what the lexer holds back on garbage).
constexpr size_t kMaxTagBytes = 4096;

enum class MarkerMatch : uint8_t { kNone, kPrefix, kFull };
enum class Marker : uint8_t { kOpen, kClose, kSep, kEndOfMsg };

constexpr std::array<std::pair<std::string_view, Marker>, 4> kMarkers = {{
    {kK3Open, Marker::kOpen},
    {kK3Close, Marker::kClose},
    {kK3Sep, Marker::kSep},
    {kK3EndOfMsg, Marker::kEndOfMsg},
}};

// Does `s` (starting at a '<') begin with a marker, or could it still (s is a proper prefix)?
MarkerMatch MatchMarker(std::string_view s, Marker* which, size_t* length) {
  MarkerMatch result = MarkerMatch::kNone;
  for (const auto& [name, marker] : kMarkers) {
    if (s.starts_with(name)) {
      *which = marker;
      *length = name.size();
      return MarkerMatch::kFull;
    }
    if (s.size() < name.size() && name.starts_with(s)) result = MarkerMatch::kPrefix;
  }
  return result;
}

bool IsNameChar(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-';
}

bool IsSpace(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

// Inverse of the renderer's attribute escaping (& → &amp;, " → &quot;), left to right.
std::string UnescapeAttr(std::string_view v) {
  std::string out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == '&' && v.substr(i).starts_with("&quot;")) {
      out += '"';
      i += 5;
    } else if (v[i] == '&' && v.substr(i).starts_with("&amp;")) {
      out += '&';
      i += 4;
    } else {
      out += v[i];
    }
  }
  return out;
}

struct Tag {
  std::string name;
  std::vector<std::pair<std::string, std::string>> attrs;

  std::string Attr(std::string_view key) const {
    for (const auto& [k, v] : attrs) {
      if (k == key) return v;
    }
    return {};
  }
};

// `name key="value" key2="value2"`, leniently: stops at the first malformed attribute.
Tag ParseTag(std::string_view text) {
  Tag tag;
  size_t i = 0;
  while (i < text.size() && !IsSpace(text[i])) ++i;
  tag.name = std::string(text.substr(0, i));
  while (true) {
    while (i < text.size() && IsSpace(text[i])) ++i;
    const size_t key_start = i;
    while (i < text.size() && text[i] != '=' && !IsSpace(text[i])) ++i;
    if (i + 1 >= text.size() || text[i] != '=' || text[i + 1] != '"' || i == key_start) break;
    const std::string key(text.substr(key_start, i - key_start));
    const size_t value_start = i + 2;
    const size_t value_end = text.find('"', value_start);
    if (value_end == std::string_view::npos) break;
    tag.attrs.push_back({key, UnescapeAttr(text.substr(value_start, value_end - value_start))});
    i = value_end + 1;
  }
  return tag;
}

std::string_view StripSpace(std::string_view s) {
  while (!s.empty() && IsSpace(s.front())) s.remove_prefix(1);
  while (!s.empty() && IsSpace(s.back())) s.remove_suffix(1);
  return s;
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// An argument's VALUE as JSON text, by its type attribute (ATOM _k3_coerce, except that a value
// that does not fit its type stays a string rather than becoming false/0).
std::string CoerceArgument(std::string_view value, std::string_view type) {
  const std::string t = Lower(type);
  if (t.starts_with("str")) return PythonJsonQuote(value);  // verbatim: whitespace may matter
  const std::string_view v = StripSpace(value);
  if (t.starts_with("bool")) {
    const std::string l = Lower(v);
    if (l == "true" || l == "false") return l;
    return PythonJsonQuote(v);
  }
  Result<std::string> json = PythonJsonRedump(v, /*compact=*/false, /*sort_keys=*/false);
  if (!json.ok()) return PythonJsonQuote(v);
  if (t.starts_with("num") || t.starts_with("int") || t.starts_with("float")) {
    // A JSON text that starts like a number and parses is a number.
    const bool numeric = !v.empty() && (v[0] == '-' || (v[0] >= '0' && v[0] <= '9'));
    return numeric ? *json : PythonJsonQuote(v);
  }
  return *json;  // object, array, null, or no/unknown type
}

}  // namespace

K3ParseStart K3ParseStartFor(const ChatOptions& options) {
  if (!options.add_generation_prompt) return K3ParseStart::kMessage;
  return options.thinking ? K3ParseStart::kThink : K3ParseStart::kResponse;
}

K3CompletionParser::K3CompletionParser(K3ParseStart start, std::string tool_call_id_prefix)
    : id_prefix_(std::move(tool_call_id_prefix)) {
  stack_.push_back(Ctx::kMessage);
  if (start == K3ParseStart::kThink) stack_.push_back(Ctx::kThink);
  if (start == K3ParseStart::kResponse) stack_.push_back(Ctx::kResponse);
}

K3ParseDelta K3CompletionParser::Feed(std::string_view text) {
  pending_ += text;
  Run(/*at_end=*/false);
  return std::exchange(delta_, {});
}

K3ParseDelta K3CompletionParser::Finish() {
  Run(/*at_end=*/true);
  if (lex_ == Lex::kOpenTag) {
    AbandonOpener();  // an opener cut off before <|sep|>
  } else if (lex_ == Lex::kCloseTag) {
    if (tag_.empty()) {
      OnText(kK3Close);
    } else {
      OnClose(tag_, /*had_sep=*/false);
    }
  }
  lex_ = Lex::kText;
  tag_.clear();
  tag_lex_ = TagLex::kName;
  if (in_call_) FinishCall(/*complete=*/false);
  stack_.clear();
  return std::exchange(delta_, {});
}

void K3CompletionParser::Run(bool at_end) {
  std::string_view s = pending_;
  size_t pos = 0;
  while (pos < s.size()) {
    if (lex_ == Lex::kText) {
      const size_t lt = s.find('<', pos);
      if (lt == std::string_view::npos) {
        OnText(s.substr(pos));
        pos = s.size();
        break;
      }
      if (lt > pos) OnText(s.substr(pos, lt - pos));
      pos = lt;
      Marker marker;
      size_t length = 0;
      const MarkerMatch m = MatchMarker(s.substr(pos), &marker, &length);
      if (m == MarkerMatch::kNone) {
        OnText("<");
        ++pos;
      } else if (m == MarkerMatch::kPrefix) {
        if (!at_end) break;  // wait for the rest of the marker
        OnText(s.substr(pos));
        pos = s.size();
      } else {
        pos += length;
        if (marker == Marker::kOpen) {
          lex_ = Lex::kOpenTag;
          tag_lex_ = TagLex::kName;
        } else if (marker == Marker::kClose) {
          lex_ = Lex::kCloseTag;
        } else if (marker == Marker::kEndOfMsg) {
          OnEndOfMessage();
        } else if (!stack_.empty() && (top() == Ctx::kArgument || top() == Ctx::kJson)) {
          OnText(kK3Sep);  // inside a value everything but its close tag is literal
        }  // elsewhere a stray <|sep|> is framing noise: dropped
      }
    } else if (lex_ == Lex::kOpenTag) {
      const size_t lt = s.find('<', pos);
      const size_t stop = lt == std::string_view::npos ? s.size() : lt;
      AdvanceTagLex(s.substr(pos, stop - pos));
      tag_.append(s.substr(pos, stop - pos));
      pos = stop;
      if (tag_lex_ == TagLex::kBad || tag_.size() > kMaxTagBytes) {  // not a tag: give the text back
        AbandonOpener();
        continue;
      }
      if (pos == s.size()) break;
      Marker marker;
      size_t length = 0;
      const MarkerMatch m = MatchMarker(s.substr(pos), &marker, &length);
      if (m == MarkerMatch::kNone) {
        AdvanceTagLex("<");
        tag_ += '<';
        ++pos;
      } else if (m == MarkerMatch::kPrefix) {
        if (!at_end) break;
        AdvanceTagLex(s.substr(pos));
        tag_.append(s.substr(pos));
        pos = s.size();
      } else if (marker == Marker::kSep) {
        pos += length;
        lex_ = Lex::kText;
        const std::string tag = std::exchange(tag_, {});
        OnOpen(tag);
      } else {  // another marker before <|sep|>: the opener was text; re-lex the marker
        AbandonOpener();
      }
    } else {  // kCloseTag: <|close|> NAME [<|sep|>]
      while (pos < s.size() && IsNameChar(s[pos]) && tag_.size() <= kMaxTagBytes) tag_ += s[pos++];
      if (pos == s.size() && tag_.size() <= kMaxTagBytes) break;  // the name may go on
      if (tag_.empty()) {  // no name: the marker was text; re-lex what follows
        OnText(kK3Close);
        lex_ = Lex::kText;
        continue;
      }
      bool had_sep = false;
      if (pos < s.size() && s[pos] == '<') {
        Marker marker;
        size_t length = 0;
        const MarkerMatch m = MatchMarker(s.substr(pos), &marker, &length);
        if (m == MarkerMatch::kPrefix && !at_end) break;
        if (m == MarkerMatch::kFull && marker == Marker::kSep) {
          pos += length;
          had_sep = true;
        }
      }
      lex_ = Lex::kText;
      const std::string name = std::exchange(tag_, {});
      OnClose(name, had_sep);
    }
  }
  pending_.erase(0, pos);
}

void K3CompletionParser::AdvanceTagLex(std::string_view more) {
  size_t name_bytes = tag_.size();  // meaningful while in kName
  for (const char c : more) {
    switch (tag_lex_) {
      case TagLex::kName:
        if (IsSpace(c) && name_bytes > 0) {
          tag_lex_ = TagLex::kSpace;
        } else if (!IsNameChar(c)) {
          tag_lex_ = TagLex::kBad;
        }
        ++name_bytes;
        break;
      case TagLex::kSpace:
        if (IsNameChar(c)) {
          tag_lex_ = TagLex::kKey;
        } else if (!IsSpace(c)) {
          tag_lex_ = TagLex::kBad;
        }
        break;
      case TagLex::kKey:
        if (c == '=') {
          tag_lex_ = TagLex::kValueQuote;
        } else if (!IsNameChar(c)) {
          tag_lex_ = TagLex::kBad;
        }
        break;
      case TagLex::kValueQuote: tag_lex_ = c == '"' ? TagLex::kValue : TagLex::kBad; break;
      case TagLex::kValue:
        if (c == '"') tag_lex_ = TagLex::kAfterValue;
        break;
      case TagLex::kAfterValue: tag_lex_ = IsSpace(c) ? TagLex::kSpace : TagLex::kBad; break;
      case TagLex::kBad: return;
    }
  }
}

void K3CompletionParser::AbandonOpener() {
  // In a value the opener is literal text; elsewhere the bare marker is stray framing (output_parser.h).
  const bool in_value = !stack_.empty() && (top() == Ctx::kArgument || top() == Ctx::kJson);
  OnText(in_value ? std::string(kK3Open) + tag_ : tag_);
  tag_.clear();
  tag_lex_ = TagLex::kName;
  lex_ = Lex::kText;
}

void K3CompletionParser::OnText(std::string_view text) {
  if (stack_.empty() || text.empty()) return;
  switch (top()) {
    case Ctx::kThink:
      delta_.reasoning += text;
      reasoning_ += text;
      break;
    case Ctx::kMessage:  // text outside the channels: keep it as the answer
    case Ctx::kResponse:
      delta_.content += text;
      content_ += text;
      break;
    case Ctx::kArgument: arg_value_ += text; break;
    case Ctx::kJson: call_json_ += text; break;
    case Ctx::kTools:
    case Ctx::kCall: break;  // whitespace between elements
  }
}

void K3CompletionParser::OnOpen(std::string_view tag_text) {
  if (stack_.empty()) return;
  const Tag tag = ParseTag(tag_text);
  auto literal = [&] { OnText(std::string(kK3Open) + std::string(tag_text) + std::string(kK3Sep)); };
  switch (top()) {
    case Ctx::kThink:
      // A response or tools element also ends reasoning whose close tag went missing.
      if (tag.name == "response" || tag.name == "tools") {
        stack_.back() = tag.name == "response" ? Ctx::kResponse : Ctx::kTools;
      } else if (tag.name != "think") {  // think re-opened while thinking: framing, dropped
        literal();
      }
      break;
    case Ctx::kResponse:
      if (tag.name == "tools") {
        stack_.back() = Ctx::kTools;
      } else if (tag.name != "response") {
        literal();
      }
      break;
    case Ctx::kMessage:
      if (tag.name == "think") {
        stack_.push_back(Ctx::kThink);
      } else if (tag.name == "response") {
        stack_.push_back(Ctx::kResponse);
      } else if (tag.name == "tools") {
        stack_.push_back(Ctx::kTools);
      } else {
        literal();
      }
      break;
    case Ctx::kTools:
      if (tag.name == "call") {
        in_call_ = true;
        call_name_ = tag.Attr("tool");
        call_args_.clear();
        call_json_.clear();
        call_has_json_ = false;
        stack_.push_back(Ctx::kCall);
      }
      break;
    case Ctx::kCall:
      if (tag.name == "argument") {
        arg_key_ = tag.Attr("key");
        arg_type_ = tag.Attr("type");
        arg_value_.clear();
        stack_.push_back(Ctx::kArgument);
      } else if (tag.name == "json") {
        call_has_json_ = true;
        stack_.push_back(Ctx::kJson);
      }
      break;
    case Ctx::kArgument:
    case Ctx::kJson: literal(); break;
  }
}

void K3CompletionParser::OnClose(std::string_view name, bool had_sep) {
  if (stack_.empty()) return;
  auto literal = [&] {
    OnText(std::string(kK3Close) + std::string(name) + (had_sep ? std::string(kK3Sep) : ""));
  };
  switch (top()) {
    case Ctx::kThink:
    case Ctx::kResponse:
      if (name == (top() == Ctx::kThink ? "think" : "response")) {
        stack_.pop_back();
      } else if (name == "message") {
        stack_.clear();
      } else {
        literal();
      }
      break;
    case Ctx::kMessage:
      if (name == "message") {
        stack_.clear();
      } else if (name != "think" && name != "response" && name != "tools") {
        literal();
      }  // a stray channel close between channels is framing noise
      break;
    case Ctx::kTools:
      if (name == "tools") {
        stack_.pop_back();
      } else if (name == "message") {
        stack_.clear();
      }
      break;
    case Ctx::kCall:
      if (name == "call" || name == "tools" || name == "message") {
        FinishCall(/*complete=*/true);
        stack_.pop_back();
        if (name == "tools") stack_.pop_back();
        if (name == "message") stack_.clear();
      }
      break;
    case Ctx::kArgument:
      if (name == "argument") {
        FinishArgument();
        stack_.pop_back();
      } else {
        literal();  // ATOM reads a value up to the first <|close|>argument
      }
      break;
    case Ctx::kJson:
      if (name == "json") {
        stack_.pop_back();
      } else {
        literal();
      }
      break;
  }
}

void K3CompletionParser::OnEndOfMessage() {
  // The stop token: whatever is open ends here. A call still open was cut off.
  if (in_call_) FinishCall(/*complete=*/false);
  stack_.clear();
}

void K3CompletionParser::FinishArgument() {
  std::string value = CoerceArgument(arg_value_, arg_type_);
  // A repeated key keeps its first position and takes the last value (a Python dict).
  for (Argument& a : call_args_) {
    if (a.key == arg_key_) {
      a.value_json = std::move(value);
      return;
    }
  }
  call_args_.push_back({arg_key_, std::move(value)});
}

void K3CompletionParser::FinishCall(bool complete) {
  K3ParsedToolCall call;
  call.id = id_prefix_ + std::to_string(tool_calls_.size());
  call.name = call_name_;
  call.complete = complete;
  if (call_args_.empty() && call_has_json_) {
    call.arguments = call_json_;
  } else {
    // json.dumps(args, ensure_ascii=False) spelling, like ATOM's parser.
    call.arguments = "{";
    for (size_t i = 0; i < call_args_.size(); ++i) {
      if (i > 0) call.arguments += ", ";
      call.arguments += PythonJsonQuote(call_args_[i].key);
      call.arguments += ": ";
      call.arguments += call_args_[i].value_json;
    }
    call.arguments += "}";
  }
  delta_.tool_calls.push_back(call);
  tool_calls_.push_back(std::move(call));
  in_call_ = false;
  call_args_.clear();
  call_json_.clear();
  call_has_json_ = false;
}

std::string K3CompletionParser::ToolCallsJson() const {
  std::string out = "[";
  for (size_t i = 0; i < tool_calls_.size(); ++i) {
    const K3ParsedToolCall& c = tool_calls_[i];
    if (i > 0) out += ",";
    out += "{\"id\":" + PythonJsonQuote(c.id) + ",\"type\":\"function\",\"function\":{\"name\":" +
           PythonJsonQuote(c.name) + ",\"arguments\":" + PythonJsonQuote(c.arguments) + "}}";
  }
  out += "]";
  return out;
}

}  // namespace kimirt
