// The chat request as the tokenizer layer sees it: messages, tool declarations and rendering
// options, in the shape of the OpenAI chat-completions schema (docs/chat-format.md).
//
// Plain structs with JSON kept as text: the server parses the request JSON and fills these; the
// renderers (chat_renderer.h for K3, kimi_linear_chat.h for Kimi-Linear-48B) parse the embedded
// JSON themselves, so no JSON library reaches the headers that include this one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

// One element of an array-valued `content`. Each text part is its own segment in the K3 renderer
// (encoding_k3.py renders the parts one by one), so parts are not joined before rendering.
struct ContentPart {
  enum class Type : uint8_t { kText, kImage };
  Type type = Type::kText;
  std::string text;  // kText only
};

// One assistant tool call (OpenAI `tool_calls[i]`, type "function").
struct ToolCall {
  std::string id;         // opaque; tool results find their call by it ("" = none)
  std::string name;       // function.name
  std::string arguments;  // function.arguments: JSON text of an object, as the client sent it
};

struct ChatMessage {
  std::string role;  // "system" | "user" | "assistant" | "tool"; anything else is an error
  // Text content. When content_parts is non-empty it is used instead (OpenAI array content).
  std::string content;
  std::vector<ContentPart> content_parts;
  std::string name;               // optional speaker name; for role "tool" the function name
  std::string reasoning_content;  // assistant only: the think channel (spec §10.3)
  std::vector<ToolCall> tool_calls;  // assistant only
  std::string tool_call_id;          // tool only: the ToolCall::id this result answers
  // System only: a JSON array of OpenAI tool objects. A system message carrying tools renders as
  // K3's "dynamic" tool-declare message instead of its content (spec §10.3 step 3).
  std::string tools_json;
};

// One entry of the request's `tools` array, e.g. {"type":"function","function":{...}}, as JSON
// text. The renderers re-serialize it in the model's own spelling (sorted keys for K3).
struct ToolSpec {
  std::string json;
};

// K3's `thinking_effort` (spec §10.3 step 2; encoding_k3.py accepts exactly these four).
enum class ThinkingEffort : uint8_t { kLow, kMedium, kHigh, kMax };
enum class ToolChoice : uint8_t { kAuto, kNone, kRequired };

struct ResponseFormat {
  enum class Type : uint8_t { kText, kJsonObject, kJsonSchema };
  Type type = Type::kText;
  // kJsonSchema: the request's `response_format.json_schema` member as JSON text. The renderer
  // takes its "schema" field (else its "json_schema" field, else the whole object), as
  // encoding_k3.py's extract_response_schema does.
  std::string json_schema;
};

struct ChatOptions {
  // K3: render the think channel in assistant messages and open `think` in the generation
  // prompt. Kimi-Linear-48B-Instruct has no reasoning channel and ignores it.
  bool thinking = true;
  // Defaults to kMax because that is what Moonshot's apply_chat_template() does (spec §10.3
  // step 2), so default prompts match Hugging Face token for token. nullopt = no effort message.
  std::optional<ThinkingEffort> thinking_effort = ThinkingEffort::kMax;
  ToolChoice tool_choice = ToolChoice::kAuto;  // kAuto renders nothing
  ResponseFormat response_format;
  bool add_generation_prompt = true;
};

// Defined in chat_renderer.cpp (the layer has no chat_message.cpp).
std::string_view ThinkingEffortName(ThinkingEffort effort);
// "low" | "medium" | "high" | "max"; anything else is InvalidArgument naming the value.
Result<ThinkingEffort> ParseThinkingEffort(std::string_view name);

}  // namespace kimirt
