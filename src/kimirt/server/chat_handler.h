// POST /v1/chat/completions.
//
// Messages are rendered with the model family's chat format (K3's XTML renderer, or
// Kimi-Linear-48B's K2-style template) and encoded segment by segment. K3 output is split by
// K3CompletionParser into `reasoning_content`, `content` and `tool_calls`; finish_reason is
// "tool_calls" when the assistant called tools. Kimi-Linear output is returned as `content`
// as generated (no reasoning channel; its tool-call markers are not parsed yet).
//
// Thinking: on by default (K3's default template); chat_template_kwargs {"thinking": false}
// turns it off; the effort comes from `reasoning_effort` (OpenAI; "minimal" → "low"),
// `thinking_effort` or chat_template_kwargs.thinking_effort.
// max_tokens (or max_completion_tokens) defaults to the rest of the context, as in vLLM.
// Streams send a role chunk per choice, delta chunks, a finish chunk with an empty delta, the
// usage chunk when asked, then [DONE].
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>
#include <vector>

#include "kimirt/server/http_server.h"
#include "kimirt/server/serving_context.h"

namespace kimirt {

HttpResponse HandleChatCompletions(const ServingContext& ctx, const HttpRequest& request);

// The steps before generation, shared with /tokenize: the body parsed as a chat request (with
// --default-chat-template-kwargs under the request's own), and its prompt rendered and encoded.
std::optional<ApiError> ParseChatBody(const ServingContext& ctx, std::string_view body, ChatRequest* out);
std::optional<ApiError> EncodeChatPrompt(const ServingContext& ctx, const ChatRequest& req, std::vector<int32_t>* ids);

}  // namespace kimirt
