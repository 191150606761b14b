// The chat-specific parts of a /v1/chat/completions request: messages, tools and the rendering
// options (tool_choice, response_format, thinking). ParseChatRequest (openai_schema.h) calls
// these; the sampling fields are shared with completions.
#pragma once

#include <optional>
#include <vector>

#include "kimirt/server/errors.h"
#include "kimirt/server/openai_schema.h"
#include "kimirt/tokenizer/chat_message.h"

namespace kimirt {

std::optional<ApiError> ParseChatMessages(const Json& body, std::vector<ChatMessage>* out);
std::optional<ApiError> ParseChatTools(const Json& body, std::vector<ToolSpec>* out);
std::optional<ApiError> ParseChatOptions(const Json& body, ChatOptions* out);

}  // namespace kimirt
