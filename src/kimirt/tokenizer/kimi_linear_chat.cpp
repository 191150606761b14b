// Kimi-Linear-48B-A3B-Instruct chat template as segments. The template (chat_template.jinja of
// moonshotai/Kimi-Linear-48B-A3B-Instruct at 5eaec587…, docs/chat-format.md) under Hugging Face's
// Jinja settings (trim_blocks, lstrip_blocks, and every line break inside a tag pair eaten by
// `-`) renders, per message:
//   <|im_user|>|<|im_assistant|>|<|im_system|>  NAME-OR-ROLE  <|im_middle|>  BODY  <|im_end|>
// with no newlines anywhere except the one after "## Return of ID" in tool results.
#include "kimirt/tokenizer/kimi_linear_chat.h"

#include <string>
#include <string_view>
#include <utility>

namespace kimirt {
namespace {

constexpr std::string_view kImSystem = "<|im_system|>";
constexpr std::string_view kImUser = "<|im_user|>";
constexpr std::string_view kImAssistant = "<|im_assistant|>";
constexpr std::string_view kImMiddle = "<|im_middle|>";
constexpr std::string_view kImEnd = "<|im_end|>";
constexpr std::string_view kToolCallsBegin = "<|tool_calls_section_begin|>";
constexpr std::string_view kToolCallBegin = "<|tool_call_begin|>";
constexpr std::string_view kToolCallArgumentBegin = "<|tool_call_argument_begin|>";
constexpr std::string_view kToolCallEnd = "<|tool_call_end|>";
constexpr std::string_view kToolCallsEnd = "<|tool_calls_section_end|>";

// Adjacent text is merged into one segment: Hugging Face BPE-encodes the whole run between two
// special tokens at once (unlike K3's per-segment encoding).
class MergingWriter {
 public:
  void Marker(std::string_view name) { out_.push_back({true, std::string(name)}); }
  void Text(std::string_view text) {
    if (text.empty()) return;
    if (!out_.empty() && !out_.back().marker) {
      out_.back().text += text;
    } else {
      out_.push_back({false, std::string(text)});
    }
  }
  std::vector<ChatSegment> Take() { return std::move(out_); }

 private:
  std::vector<ChatSegment> out_;
};

// The template's render_content macro: a string as is, text parts concatenated.
Status RenderContent(const ChatMessage& m, size_t index, MergingWriter* w) {
  if (m.content_parts.empty()) {
    w->Text(m.content);
    return Status::Ok();
  }
  for (size_t k = 0; k < m.content_parts.size(); ++k) {
    if (m.content_parts[k].type == ContentPart::Type::kImage) {
      return Unsupported("messages[" + std::to_string(index) + "].content[" + std::to_string(k) +
                         "]: image parts are not supported (text-only engine)");
    }
    w->Text(m.content_parts[k].text);
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<ChatSegment>> RenderKimiLinearChat(std::span<const ChatMessage> messages,
                                                      std::span<const ToolSpec> tools,
                                                      const ChatOptions& options) {
  MergingWriter w;
  // `tools | tojson(separators=(',', ':'))`: transformers' tojson is json.dumps(ensure_ascii=
  // False, sort_keys=False), so keys keep the client's order here (K3 sorts them).
  if (!tools.empty()) {
    std::string json = "[";
    for (size_t k = 0; k < tools.size(); ++k) {
      Result<std::string> tool = PythonJsonRedump(tools[k].json, /*compact=*/true,
                                                  /*sort_keys=*/false);
      if (!tool.ok()) return tool.status().WithContext("tools[" + std::to_string(k) + "]");
      if (k > 0) json += ",";
      json += *tool;
    }
    json += "]";
    w.Marker(kImSystem);
    w.Text("tool_declare");
    w.Marker(kImMiddle);
    w.Text(json);
    w.Marker(kImEnd);
  }

  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    std::string_view opener;
    if (m.role == "user") {
      opener = kImUser;
    } else if (m.role == "assistant") {
      opener = kImAssistant;
    } else if (m.role == "system" || m.role == "tool") {
      opener = kImSystem;
    } else {
      return InvalidArgument("messages[" + std::to_string(i) + "].role: unknown role \"" + m.role +
                             "\" (expected system, user, assistant or tool)");
    }
    w.Marker(opener);
    w.Text(m.name.empty() ? m.role : m.name);  // role_name = message.name or message.role
    w.Marker(kImMiddle);

    if (m.role == "assistant" && !m.tool_calls.empty()) {
      KIMIRT_RETURN_IF_ERROR(RenderContent(m, i, &w));
      w.Marker(kToolCallsBegin);
      for (const ToolCall& call : m.tool_calls) {
        w.Marker(kToolCallBegin);
        w.Text(call.id);  // the client's id verbatim (K2-era models saw "functions.NAME:IDX")
        w.Marker(kToolCallArgumentBegin);
        w.Text(call.arguments);  // a string argument is emitted as is, not re-serialized
        w.Marker(kToolCallEnd);
      }
      w.Marker(kToolCallsEnd);
    } else if (m.role == "tool") {
      w.Text("## Return of " + m.tool_call_id + "\n");
      KIMIRT_RETURN_IF_ERROR(RenderContent(m, i, &w));
    } else {
      KIMIRT_RETURN_IF_ERROR(RenderContent(m, i, &w));
    }
    w.Marker(kImEnd);
  }

  if (options.add_generation_prompt) {
    w.Marker(kImAssistant);
    w.Text("assistant");
    w.Marker(kImMiddle);
  }
  return w.Take();
}

}  // namespace kimirt
