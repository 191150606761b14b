// Messages, tools and rendering options of chat requests (chat_schema.h).
#include "kimirt/server/chat_schema.h"

#include <nlohmann/json.hpp>

#include "kimirt/server/json_fields.h"

namespace kimirt {

using namespace json_fields;  // NOLINT: the readers are this file's vocabulary

namespace {

MaybeError ParseContent(const Json& v, const std::string& param, ChatMessage* m) {
  if (v.is_string()) {
    m->content = v.get<std::string>();
    return std::nullopt;
  }
  if (!v.is_array()) return TypeError(param, "a string or an array of content parts", v);
  for (size_t j = 0; j < v.size(); ++j) {
    const Json& part = v[j];
    const std::string pp = Indexed(param, j);
    if (!part.is_object()) return TypeError(pp, "an object", part);
    std::string type;
    KIMIRT_RETURN_IF_API_ERROR(ReadString(part, "type", &type, pp + "."));
    ContentPart cp;
    if (type == "text") {
      const Json* text = Member(part, "text");
      if (text == nullptr || !text->is_string()) {
        return InvalidRequest("`" + pp + ".text` must be a string", pp + ".text");
      }
      cp.text = text->get<std::string>();
    } else if (type == "image_url" || type == "input_image" || type == "image") {
      cp.type = ContentPart::Type::kImage;  // the renderer refuses it with a clear message
    } else {
      return InvalidRequest("`" + pp + ".type` \"" + type + "\" is not supported (text only)", pp + ".type");
    }
    m->content_parts.push_back(std::move(cp));
  }
  return std::nullopt;
}

MaybeError ParseToolCalls(const Json& v, const std::string& param, ChatMessage* m) {
  if (!v.is_array()) return TypeError(param, "an array", v);
  for (size_t j = 0; j < v.size(); ++j) {
    const Json& call = v[j];
    const std::string pc = Indexed(param, j);
    if (!call.is_object()) return TypeError(pc, "an object", call);
    ToolCall tc;
    KIMIRT_RETURN_IF_API_ERROR(ReadString(call, "id", &tc.id, pc + "."));
    const Json* fn = Member(call, "function");
    if (fn == nullptr || !fn->is_object()) return InvalidRequest("`" + pc + ".function` must be an object", pc + ".function");
    const Json* name = Member(*fn, "name");
    if (name == nullptr || !name->is_string()) {
      return InvalidRequest("`" + pc + ".function.name` must be a string", pc + ".function.name");
    }
    tc.name = name->get<std::string>();
    if (const Json* args = Member(*fn, "arguments")) {
      // OpenAI sends arguments as JSON text; some clients send the object itself.
      tc.arguments = args->is_string() ? args->get<std::string>() : args->dump();
    } else {
      tc.arguments = "{}";
    }
    m->tool_calls.push_back(std::move(tc));
  }
  return std::nullopt;
}

}  // namespace

MaybeError ParseChatMessages(const Json& body, std::vector<ChatMessage>* out) {
  const Json* v = Member(body, "messages");
  if (v == nullptr) return InvalidRequest("`messages` is required", "messages");
  if (!v->is_array()) return TypeError("messages", "an array", *v);
  if (v->empty()) return InvalidRequest("`messages` must not be empty", "messages");
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& msg = (*v)[i];
    const std::string pm = Indexed("messages", i);
    if (!msg.is_object()) return TypeError(pm, "an object", msg);
    ChatMessage m;
    const Json* role = Member(msg, "role");
    if (role == nullptr || !role->is_string()) return InvalidRequest("`" + pm + ".role` must be a string", pm + ".role");
    m.role = role->get<std::string>();
    if (m.role == "developer") m.role = "system";  // OpenAI's newer name for system messages
    if (m.role != "system" && m.role != "user" && m.role != "assistant" && m.role != "tool") {
      return InvalidRequest("`" + pm + ".role` \"" + m.role + "\" is not one of system, user, assistant, tool",
                            pm + ".role");
    }
    if (const Json* content = Member(msg, "content")) {
      KIMIRT_RETURN_IF_API_ERROR(ParseContent(*content, pm + ".content", &m));
    } else if (m.role == "user") {
      return InvalidRequest("`" + pm + ".content` is required for user messages", pm + ".content");
    }
    KIMIRT_RETURN_IF_API_ERROR(ReadString(msg, "name", &m.name, pm + "."));
    KIMIRT_RETURN_IF_API_ERROR(ReadString(msg, "reasoning_content", &m.reasoning_content, pm + "."));
    if (m.reasoning_content.empty()) {
      KIMIRT_RETURN_IF_API_ERROR(ReadString(msg, "reasoning", &m.reasoning_content, pm + "."));
    }
    if (const Json* calls = Member(msg, "tool_calls")) {
      KIMIRT_RETURN_IF_API_ERROR(ParseToolCalls(*calls, pm + ".tool_calls", &m));
    }
    KIMIRT_RETURN_IF_API_ERROR(ReadString(msg, "tool_call_id", &m.tool_call_id, pm + "."));
    out->push_back(std::move(m));
  }
  return std::nullopt;
}

MaybeError ParseChatTools(const Json& body, std::vector<ToolSpec>* out) {
  const Json* v = Member(body, "tools");
  if (v == nullptr) return std::nullopt;
  if (!v->is_array()) return TypeError("tools", "an array", *v);
  for (size_t i = 0; i < v->size(); ++i) {
    const Json& tool = (*v)[i];
    const std::string pt = Indexed("tools", i);
    if (!tool.is_object()) return TypeError(pt, "an object", tool);
    const Json* type = Member(tool, "type");
    if (type != nullptr && (!type->is_string() || type->get<std::string>() != "function")) {
      return InvalidRequest("`" + pt + ".type` must be \"function\"", pt + ".type");
    }
    const Json* fn = Member(tool, "function");
    if (fn == nullptr || !fn->is_object()) return InvalidRequest("`" + pt + ".function` must be an object", pt + ".function");
    const Json* name = Member(*fn, "name");
    if (name == nullptr || !name->is_string() || name->get_ref<const std::string&>().empty()) {
      return InvalidRequest("`" + pt + ".function.name` must be a non-empty string", pt + ".function.name");
    }
    // The JSON Schema of the arguments: an object (OpenAI), or absent for a call without any.
    if (const Json* params = Member(*fn, "parameters"); params != nullptr && !params->is_object()) {
      return TypeError(pt + ".function.parameters", "a JSON Schema object", *params);
    }
    out->push_back({tool.dump()});
  }
  return std::nullopt;
}

MaybeError ParseChatOptions(const Json& body, ChatOptions* o) {
  if (const Json* tc = Member(body, "tool_choice")) {
    if (!tc->is_string()) {
      // A named function needs constrained decoding, which the engine does not have.
      return InvalidRequest("`tool_choice` naming a function is not supported; use \"auto\", \"none\" or \"required\"",
                            "tool_choice");
    }
    const std::string s = tc->get<std::string>();
    if (s == "auto") {
      o->tool_choice = ToolChoice::kAuto;
    } else if (s == "none") {
      o->tool_choice = ToolChoice::kNone;
    } else if (s == "required") {
      // Without constrained decoding the model may still answer in prose; vLLM enforces it.
      return InvalidRequest("`tool_choice` \"required\" is not supported: kimirt has no constrained decoding to "
                            "force a tool call; use \"auto\"",
                            "tool_choice");
    } else {
      return InvalidRequest("`tool_choice` must be \"auto\", \"none\" or \"required\", got \"" + s + "\"", "tool_choice");
    }
  }
  // response_format: only "text" gets here (RefuseUnsupported, openai_schema.cpp).
  KIMIRT_RETURN_IF_API_ERROR(ReadBool(body, "add_generation_prompt", &o->add_generation_prompt));

  // Thinking effort, most specific last: OpenAI's reasoning_effort, K3's thinking_effort, then
  // chat_template_kwargs (vLLM's way of passing template options).
  auto effort = [&](const Json& obj, const char* name, const std::string& param) -> MaybeError {
    const Json* e = Member(obj, name);
    if (e == nullptr) return std::nullopt;
    if (!e->is_string()) return TypeError(param, "a string", *e);
    std::string s = e->get<std::string>();
    if (s == "minimal") s = "low";  // OpenAI's lowest level; K3's lowest is "low"
    Result<ThinkingEffort> parsed = ParseThinkingEffort(s);
    if (!parsed.ok()) return InvalidRequest("`" + param + "` must be low, medium, high or max, got \"" + s + "\"", param);
    o->thinking_effort = *parsed;
    return std::nullopt;
  };
  KIMIRT_RETURN_IF_API_ERROR(effort(body, "reasoning_effort", "reasoning_effort"));
  KIMIRT_RETURN_IF_API_ERROR(effort(body, "thinking_effort", "thinking_effort"));
  if (const Json* kw = Member(body, "chat_template_kwargs")) {
    if (!kw->is_object()) return TypeError("chat_template_kwargs", "an object", *kw);
    KIMIRT_RETURN_IF_API_ERROR(ReadBool(*kw, "enable_thinking", &o->thinking, "chat_template_kwargs."));
    KIMIRT_RETURN_IF_API_ERROR(ReadBool(*kw, "thinking", &o->thinking, "chat_template_kwargs."));
    KIMIRT_RETURN_IF_API_ERROR(effort(*kw, "thinking_effort", "chat_template_kwargs.thinking_effort"));
  }
  return std::nullopt;
}

}  // namespace kimirt
