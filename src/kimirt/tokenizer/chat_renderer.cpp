// Kimi-K3 XTML renderer (spec §10.3), a segment-for-segment port of the behaviour of Moonshot's
// encoding_k3.py (copy: NVIDIA-NeMo/Automodel nemo_automodel/components/models/kimi_k3/encoding.py),
// and the Python-json.dumps-compatible JSON spelling the prompt needs. docs/chat-format.md
// describes the format; the comments here say which part of encoding_k3.py each step mirrors.
#include "kimirt/tokenizer/chat_renderer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <optional>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "kimirt/tokenizer/detokenizer.h"
#include "kimirt/tokenizer/tokenizer.h"
#include "kimirt/core/json_depth.h"

namespace kimirt {

std::string_view ThinkingEffortName(ThinkingEffort effort) {
  switch (effort) {
    case ThinkingEffort::kLow: return "low";
    case ThinkingEffort::kMedium: return "medium";
    case ThinkingEffort::kHigh: return "high";
    case ThinkingEffort::kMax: return "max";
  }
  return "max";
}

Result<ThinkingEffort> ParseThinkingEffort(std::string_view name) {
  for (ThinkingEffort e : {ThinkingEffort::kLow, ThinkingEffort::kMedium, ThinkingEffort::kHigh,
                           ThinkingEffort::kMax}) {
    if (name == ThinkingEffortName(e)) return e;
  }
  return InvalidArgument("thinking_effort: unsupported value \"" + std::string(name) +
                         "\" (expected low, medium, high or max)");
}

namespace {

// ---------------------------------------------------------------------------------------------
// Python json.dumps spelling

// Python's json module has a recursion limit; we refuse deep nesting before nlohmann's recursive
// parser (and our recursive dumper) could exhaust the stack on hostile input.
constexpr int kMaxJsonDepth = 256;

bool NestingWithinLimit(std::string_view text) { return JsonNestingWithin(text, kMaxJsonDepth); }

template <typename Json>
std::optional<Json> ParseJson(std::string_view text) {
  if (!NestingWithinLimit(text)) return std::nullopt;
  Json j = Json::parse(text.begin(), text.end(), /*cb=*/nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return std::nullopt;
  return j;
}

// float.__repr__: the shortest digits that round-trip (std::to_chars gives the same digits as
// David Gay's mode 0, which CPython uses), fixed notation for a decimal-point position in
// (-4, 16], else d.ddde±XX with at least two exponent digits; integral values get ".0".
std::string PythonFloatRepr(double v) {
  if (v == 0) return std::signbit(v) ? "-0.0" : "0.0";
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "Infinity" : "-Infinity";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v, std::chars_format::scientific);
  std::string_view sci(buf, static_cast<size_t>(end - buf));  // "-d.ddde+XX"
  std::string out;
  if (!sci.empty() && sci[0] == '-') {
    out = "-";
    sci.remove_prefix(1);
  }
  const size_t e_pos = sci.find('e');
  std::string digits;
  for (char c : sci.substr(0, e_pos)) {
    if (c != '.') digits += c;
  }
  int exp10 = 0;
  std::string_view exp_text = sci.substr(e_pos + 1);
  if (!exp_text.empty() && exp_text[0] == '+') exp_text.remove_prefix(1);
  std::from_chars(exp_text.data(), exp_text.data() + exp_text.size(), exp10);
  const int decpt = exp10 + 1;  // value = 0.digits × 10^decpt
  const int n = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {
    out += digits[0];
    if (n > 1) {
      out += '.';
      out += digits.substr(1);
    }
    char e[16];
    std::snprintf(e, sizeof(e), "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    out += e;
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= n) {
    out += digits;
    out.append(static_cast<size_t>(decpt - n), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

template <typename Json>
void DumpPython(const Json& j, bool compact, std::string* out) {
  const char* item_sep = compact ? "," : ", ";
  const char* key_sep = compact ? ":" : ": ";
  switch (j.type()) {
    case nlohmann::json::value_t::null: *out += "null"; break;
    case nlohmann::json::value_t::boolean: *out += j.template get<bool>() ? "true" : "false"; break;
    case nlohmann::json::value_t::number_integer:
      *out += std::to_string(j.template get<int64_t>());
      break;
    case nlohmann::json::value_t::number_unsigned:
      *out += std::to_string(j.template get<uint64_t>());
      break;
    case nlohmann::json::value_t::number_float:
      *out += PythonFloatRepr(j.template get<double>());
      break;
    case nlohmann::json::value_t::string:
      *out += PythonJsonQuote(j.template get_ref<const std::string&>());
      break;
    case nlohmann::json::value_t::array: {
      *out += '[';
      bool first = true;
      for (const auto& item : j) {
        if (!first) *out += item_sep;
        first = false;
        DumpPython(item, compact, out);
      }
      *out += ']';
      break;
    }
    case nlohmann::json::value_t::object: {
      *out += '{';
      bool first = true;
      for (auto it = j.begin(); it != j.end(); ++it) {
        if (!first) *out += item_sep;
        first = false;
        *out += PythonJsonQuote(it.key());
        *out += key_sep;
        DumpPython(it.value(), compact, out);
      }
      *out += '}';
      break;
    }
    default: *out += "null"; break;  // binary/discarded cannot come from parsing text
  }
}

template <typename Json>
std::string DumpPython(const Json& j, bool compact) {
  std::string out;
  DumpPython(j, compact, &out);
  return out;
}

// Python's str.isspace(), for str.strip() emptiness tests.
bool IsPythonSpace(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

bool IsPythonBlank(std::string_view s) {
  while (!s.empty()) {
    Utf8Step step = Utf8Next(s);
    if (step.kind != Utf8Step::Kind::kValid || !IsPythonSpace(step.code_point)) return false;
    s.remove_prefix(step.length);
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// Segments (encoding_k3.py _open_tag / _close_tag / _attr / _end_of_msg)

using Attrs = std::vector<std::pair<std::string, std::string>>;

std::string EscapeAttr(std::string_view v) {
  std::string out;
  out.reserve(v.size());
  for (char c : v) {
    if (c == '&') {
      out += "&amp;";
    } else if (c == '"') {
      out += "&quot;";
    } else {
      out += c;
    }
  }
  return out;
}

class SegmentWriter {
 public:
  void Marker(std::string_view name) { out_.push_back({true, std::string(name)}); }
  // Empty segments are dropped (encoding_k3.py _segment).
  void Text(std::string_view text) {
    if (!text.empty()) out_.push_back({false, std::string(text)});
  }
  // Each attribute is four text segments, ` key`, `="`, value, `"`: tiktoken sees them
  // separately, so BPE never merges across them (spec §10.3).
  void Open(std::string_view tag, const Attrs& attrs = {}) {
    Marker(kK3Open);
    Text(tag);
    for (const auto& [key, value] : attrs) {
      Text(" " + key);
      Text("=\"");
      Text(EscapeAttr(value));
      Text("\"");
    }
    Marker(kK3Sep);
  }
  void Close(std::string_view tag) {
    Marker(kK3Close);
    Text(tag);
    Marker(kK3Sep);
  }
  void EndOfMessage() { Marker(kK3EndOfMsg); }
  // _internal_system_message: the fixed bodies below have no surrounding whitespace, so
  // encoding_k3.py's body.strip() never changes them.
  void InternalSystemMessage(std::string_view type, std::string_view body) {
    Open("message", {{"role", "system"}, {"type", std::string(type)}});
    Text(body);
    Close("message");
    EndOfMessage();
  }

  std::vector<ChatSegment> Take() { return std::move(out_); }

 private:
  std::vector<ChatSegment> out_;
};

std::string Field(size_t message_index, std::string_view field) {
  return "messages[" + std::to_string(message_index) + "]" +
         (field.empty() ? "" : "." + std::string(field));
}

// _render_content_segments: a string is one segment, each text part is its own segment.
Status RenderContent(const ChatMessage& m, size_t index, SegmentWriter* w) {
  if (m.content_parts.empty()) {
    w->Text(m.content);
    return Status::Ok();
  }
  for (size_t k = 0; k < m.content_parts.size(); ++k) {
    const ContentPart& part = m.content_parts[k];
    if (part.type == ContentPart::Type::kImage) {
      return Unsupported(Field(index, "content[" + std::to_string(k) + "]") +
                         ": image parts need the multimodal processor (text-only engine)");
    }
    w->Text(part.text);
  }
  return Status::Ok();
}

// The fixed English bodies of encoding_k3.py, verbatim (docs/chat-format.md).
constexpr std::string_view kToolDeclarePreamble =
    "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n";
constexpr std::string_view kDynamicToolDeclarePreamble =
    "## New Tools Available\n"
    "The system dynamically extends the toolset via lazy-loading.\n"
    "You have access to all existing and extended tools.\n"
    "Here are the specs for the extended tools.\n\n"
    "```json\n";
constexpr std::string_view kJsonFenceEnd = "\n```";
constexpr std::string_view kThinkingEffortBody =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=";
constexpr std::string_view kToolChoiceRequiredBody =
    "The system is invoked with `tool_choice=required`.\nYou MUST call tools in the next message.";
constexpr std::string_view kToolChoiceNoneBody =
    "The system is invoked with `tool_choice=none`.\n"
    "You MUST NOT call any tools in the next message.";
constexpr std::string_view kJsonObjectBody =
    "The system is invoked with `response_format=json_object`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional "
    "formatting.";
constexpr std::string_view kJsonSchemaBody =
    "The system is invoked with `response_format=json_schema`.\n"
    "Your response must be raw JSON data without markdown code blocks (```json) or any additional "
    "formatting.\n"
    "The JSON data must match the following schema:\n```json\n";

// _render_tool_declare: compact JSON, keys deep-sorted, non-ASCII kept.
void RenderToolDeclare(const nlohmann::json& tools, bool dynamic, SegmentWriter* w) {
  std::string body(dynamic ? kDynamicToolDeclarePreamble : kToolDeclarePreamble);
  body += DumpPython(tools, /*compact=*/true);
  body += kJsonFenceEnd;
  w->Open("message", {{"role", "system"}, {"type", "tool-declare"}});
  w->Text(body);
  w->Close("message");
  w->EndOfMessage();
}

// _xtml_type
std::string_view XtmlType(const nlohmann::ordered_json& v) {
  if (v.is_boolean()) return "boolean";
  if (v.is_null()) return "null";
  if (v.is_number()) return "number";
  if (v.is_string()) return "string";
  if (v.is_object()) return "object";
  return "array";
}

// _render_assistant_segments (the part inside <message role="assistant">).
Status RenderAssistantBody(const ChatMessage& m, size_t index, bool thinking, SegmentWriter* w) {
  // The think channel is structural in thinking mode: present even when empty.
  if (thinking) {
    w->Open("think");
    if (!IsPythonBlank(m.reasoning_content)) w->Text(m.reasoning_content);
    w->Close("think");
  }
  w->Open("response");
  KIMIRT_RETURN_IF_ERROR(RenderContent(m, index, w));
  w->Close("response");
  if (m.tool_calls.empty()) return Status::Ok();

  w->Open("tools");
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    const ToolCall& call = m.tool_calls[c];
    const std::string field = Field(index, "tool_calls[" + std::to_string(c) + "]");
    if (call.name.empty()) return InvalidArgument(field + ".name: empty function name");
    w->Open("call", {{"tool", call.name}, {"index", std::to_string(c + 1)}});
    // normalize_tool_arguments: blank → no arguments; unparseable → one <json type="object">
    // element holding the raw text; a JSON value that is not an object is an error. Keys keep
    // the client's order (only tools and schemas are deep-sorted).
    if (!IsPythonBlank(call.arguments)) {
      std::optional<nlohmann::ordered_json> args = ParseJson<nlohmann::ordered_json>(call.arguments);
      if (!args) {
        w->Open("json", {{"type", "object"}});
        w->Text(call.arguments);
        w->Close("json");
      } else if (!args->is_object()) {
        return InvalidArgument(field + ".arguments: must be a JSON object, got " +
                               std::string(XtmlType(*args)));
      } else {
        for (auto it = args->begin(); it != args->end(); ++it) {
          const nlohmann::ordered_json& value = it.value();
          w->Open("argument", {{"key", it.key()}, {"type", std::string(XtmlType(value))}});
          // _xtml_value: strings raw, everything else json.dumps with default separators.
          w->Text(value.is_string() ? value.get_ref<const std::string&>()
                                    : DumpPython(value, /*compact=*/false));
          w->Close("argument");
        }
      }
    }
    w->Close("call");
  }
  w->Close("tools");
  return Status::Ok();
}

bool IsTruthyJson(const nlohmann::json& j) {
  if (j.is_null()) return false;
  if (j.is_array() || j.is_object() || j.is_string()) return !j.empty();
  if (j.is_boolean()) return j.get<bool>();
  return true;
}

// One message in rendering order, after tool results were re-sorted.
struct Ordered {
  size_t index;                            // position in the caller's list (for errors)
  std::optional<std::string> tool_override;  // call name matched by tool_call_id
};

// normalize_xtml_tool_result_messages: each run of consecutive tool messages is matched to the
// most recent assistant's tool_calls by tool_call_id == id; a fully matched run is sorted by call
// position and takes the calls' names, a run with any unmatched message is left as is.
std::vector<Ordered> OrderMessages(std::span<const ChatMessage> messages) {
  std::vector<Ordered> out;
  out.reserve(messages.size());
  // id → (1-based position, name); the first occurrence of a duplicate id wins.
  std::vector<std::pair<std::string, std::pair<size_t, std::string>>> current;
  auto find_call = [&](const std::string& id) -> const std::pair<size_t, std::string>* {
    for (const auto& entry : current) {
      if (entry.first == id) return &entry.second;
    }
    return nullptr;
  };
  size_t i = 0;
  while (i < messages.size()) {
    const ChatMessage& m = messages[i];
    if (m.role == "assistant") {
      current.clear();
      for (size_t c = 0; c < m.tool_calls.size(); ++c) {
        const ToolCall& call = m.tool_calls[c];
        if (call.id.empty() || find_call(call.id) != nullptr) continue;
        current.push_back({call.id, {c + 1, call.name}});
      }
    }
    if (m.role != "tool") {
      out.push_back({i, std::nullopt});
      ++i;
      continue;
    }
    struct RunItem {
      size_t position;
      size_t offset;
      size_t index;
      std::string name;
    };
    std::vector<RunItem> run;
    bool unresolved = false;
    for (size_t offset = 0; i < messages.size() && messages[i].role == "tool"; ++i, ++offset) {
      const auto* matched =
          messages[i].tool_call_id.empty() ? nullptr : find_call(messages[i].tool_call_id);
      if (matched == nullptr) {
        unresolved = true;
        run.push_back({0, offset, i, ""});
      } else {
        run.push_back({matched->first, offset, i, matched->second});
      }
    }
    if (unresolved) {
      for (const RunItem& r : run) out.push_back({r.index, std::nullopt});
    } else {
      std::stable_sort(run.begin(), run.end(), [](const RunItem& a, const RunItem& b) {
        return a.position != b.position ? a.position < b.position : a.offset < b.offset;
      });
      for (const RunItem& r : run) out.push_back({r.index, r.name});
    }
  }
  return out;
}

// extract_response_schema + deep_sort_dict + _json_compact for response_format=json_schema.
Result<std::string> ResponseSchemaJson(const ResponseFormat& rf) {
  if (IsPythonBlank(rf.json_schema)) return std::string("null");
  std::optional<nlohmann::json> js = ParseJson<nlohmann::json>(rf.json_schema);
  if (!js) return InvalidArgument("response_format.json_schema: invalid JSON");
  const nlohmann::json* schema = &*js;
  if (js->is_object()) {
    if (auto it = js->find("schema"); it != js->end()) {
      schema = &*it;
    } else if (auto it2 = js->find("json_schema"); it2 != js->end()) {
      schema = &*it2;
    }
  }
  return DumpPython(*schema, /*compact=*/true);
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string PythonJsonQuote(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '"';
  while (!s.empty()) {
    Utf8Step step = Utf8Next(s);
    if (step.kind != Utf8Step::Kind::kValid) {
      out += "\xEF\xBF\xBD";  // U+FFFD
      s.remove_prefix(step.kind == Utf8Step::Kind::kInvalid ? step.length : s.size());
      continue;
    }
    const char32_t c = step.code_point;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", static_cast<unsigned>(c));
          out += buf;
        } else {
          out.append(s.data(), step.length);
        }
    }
    s.remove_prefix(step.length);
  }
  out += '"';
  return out;
}

Result<std::string> PythonJsonRedump(std::string_view json_text, bool compact, bool sort_keys) {
  if (sort_keys) {
    std::optional<nlohmann::json> j = ParseJson<nlohmann::json>(json_text);
    if (!j) return InvalidArgument("invalid JSON");
    return DumpPython(*j, compact);
  }
  std::optional<nlohmann::ordered_json> j = ParseJson<nlohmann::ordered_json>(json_text);
  if (!j) return InvalidArgument("invalid JSON");
  return DumpPython(*j, compact);
}

Result<std::vector<ChatSegment>> RenderK3Chat(std::span<const ChatMessage> messages,
                                              std::span<const ToolSpec> tools,
                                              const ChatOptions& options) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& role = messages[i].role;
    if (role != "system" && role != "user" && role != "assistant" && role != "tool") {
      return InvalidArgument(Field(i, "role") + ": unknown role \"" + role +
                             "\" (expected system, user, assistant or tool)");
    }
  }

  SegmentWriter w;
  if (!tools.empty()) {
    nlohmann::json array = nlohmann::json::array();
    for (size_t k = 0; k < tools.size(); ++k) {
      std::optional<nlohmann::json> tool = ParseJson<nlohmann::json>(tools[k].json);
      if (!tool) return InvalidArgument("tools[" + std::to_string(k) + "]: invalid JSON");
      array.push_back(std::move(*tool));
    }
    RenderToolDeclare(array, /*dynamic=*/false, &w);
  }
  if (options.thinking && options.thinking_effort) {
    std::string body(kThinkingEffortBody);
    body += ThinkingEffortName(*options.thinking_effort);
    body += "`.";
    w.InternalSystemMessage("thinking-effort", body);
  }

  const ChatMessage* last_assistant = nullptr;  // its tool_calls resolve unnamed results
  size_t tool_index = 0;                         // tool messages since that assistant
  for (const Ordered& o : OrderMessages(messages)) {
    const ChatMessage& m = messages[o.index];
    if (m.role == "user" || (m.role == "system" && m.tools_json.empty())) {
      Attrs attrs = {{"role", m.role}};
      if (!m.name.empty()) attrs.push_back({"name", m.name});
      w.Open("message", attrs);
      KIMIRT_RETURN_IF_ERROR(RenderContent(m, o.index, &w));
      w.Close("message");
      w.EndOfMessage();
    } else if (m.role == "system") {
      std::optional<nlohmann::json> t = ParseJson<nlohmann::json>(m.tools_json);
      if (!t) return InvalidArgument(Field(o.index, "tools") + ": invalid JSON");
      if (IsTruthyJson(*t)) {
        RenderToolDeclare(*t, /*dynamic=*/true, &w);
      } else {  // `tools: []` is falsy in Python: an ordinary system message
        Attrs attrs = {{"role", "system"}};
        if (!m.name.empty()) attrs.push_back({"name", m.name});
        w.Open("message", attrs);
        KIMIRT_RETURN_IF_ERROR(RenderContent(m, o.index, &w));
        w.Close("message");
        w.EndOfMessage();
      }
    } else if (m.role == "tool") {
      ++tool_index;
      std::string tool_name;
      if (o.tool_override) {
        tool_name = *o.tool_override;
      } else if (!m.name.empty()) {
        tool_name = m.name;
      } else if (last_assistant != nullptr && tool_index <= last_assistant->tool_calls.size()) {
        tool_name = last_assistant->tool_calls[tool_index - 1].name;  // by position
      } else {
        return InvalidArgument(
            Field(o.index, "") + ": tool message has no name and matches no tool call (" +
            (m.tool_call_id.empty() ? std::string("no tool_call_id")
                                    : "tool_call_id \"" + m.tool_call_id + "\"") +
            "); give `name` or answer a preceding assistant tool call");
      }
      w.Open("message",
             {{"role", "tool"}, {"tool", tool_name}, {"index", std::to_string(tool_index)}});
      KIMIRT_RETURN_IF_ERROR(RenderContent(m, o.index, &w));
      w.Close("message");
      w.EndOfMessage();
    } else {  // assistant
      last_assistant = &m;
      tool_index = 0;
      Attrs attrs = {{"role", "assistant"}};
      if (!m.name.empty()) attrs.push_back({"name", m.name});
      w.Open("message", attrs);
      KIMIRT_RETURN_IF_ERROR(RenderAssistantBody(m, o.index, options.thinking, &w));
      w.Close("message");
      w.EndOfMessage();
    }
  }

  if (options.tool_choice == ToolChoice::kRequired) {
    w.InternalSystemMessage("tool-choice", kToolChoiceRequiredBody);
  } else if (options.tool_choice == ToolChoice::kNone) {
    w.InternalSystemMessage("tool-choice", kToolChoiceNoneBody);
  }
  if (options.response_format.type == ResponseFormat::Type::kJsonObject) {
    w.InternalSystemMessage("response-format", kJsonObjectBody);
  } else if (options.response_format.type == ResponseFormat::Type::kJsonSchema) {
    KIMIRT_ASSIGN_OR_RETURN(std::string schema, ResponseSchemaJson(options.response_format));
    std::string body(kJsonSchemaBody);
    body += schema;
    body += kJsonFenceEnd;
    w.InternalSystemMessage("response-format", body);
  }

  if (options.add_generation_prompt) {
    w.Open("message", {{"role", "assistant"}});
    w.Open(options.thinking ? "think" : "response");
  }
  return w.Take();
}

std::string JoinSegments(std::span<const ChatSegment> segments) {
  std::string out;
  for (const ChatSegment& s : segments) out += s.text;
  return out;
}

Result<std::vector<int32_t>> EncodeSegments(const Tokenizer& tokenizer,
                                            std::span<const ChatSegment> segments) {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < segments.size(); ++i) {
    const ChatSegment& s = segments[i];
    if (s.marker) {
      std::optional<int32_t> id = tokenizer.SpecialTokenId(s.text);
      if (!id) {
        return NotFound("chat segment " + std::to_string(i) + ": the tokenizer has no special token " +
                        s.text + " (wrong tokenizer_config.json for this chat format?)");
      }
      ids.push_back(*id);
    } else {
      std::vector<int32_t> piece = tokenizer.Encode(s.text, /*allow_special=*/false);
      ids.insert(ids.end(), piece.begin(), piece.end());
    }
  }
  return ids;
}

}  // namespace kimirt
