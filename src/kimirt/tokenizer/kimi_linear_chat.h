// Chat rendering for Kimi-Linear-48B-A3B-Instruct: the K2-style `<|im_user|>user<|im_middle|>…
// <|im_end|>` template its tokenizer_config ships (chat_template.jinja), as segments.
//
// The 48B tokenizer names ids 163586..163588 <|im_end|>, <|im_user|>, <|im_assistant|> — the ids
// K3 calls <|end_of_msg|>, <|open|>, <|close|> (spec §10.2) — so markers are taken by name from
// the model's own tokenizer_config.json through EncodeSegments (chat_renderer.h), never from a
// table of ids.
//
// Hugging Face renders the Jinja template to a string and tokenizes it, splitting at every
// added-token name; the pieces between are BPE-encoded separately. Segments here reproduce that
// split: markers where the template writes a token name, and one text segment for each maximal run
// of text between markers. One deliberate difference: message content is always plain text, so a
// user typing "<|im_end|>" gets BPE, not the control token (Hugging Face would inject it).
//
// Not rendered, because the template has no place for them: reasoning_content and
// ChatOptions::thinking / thinking_effort (the Instruct model has no reasoning channel),
// tool_choice and response_format (constrain decoding instead), a system message's tools_json.
#pragma once

#include <span>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/tokenizer/chat_message.h"
#include "kimirt/tokenizer/chat_renderer.h"

namespace kimirt {

// Errors name the field: unknown role, image parts (Unsupported), tools that are not JSON.
Result<std::vector<ChatSegment>> RenderKimiLinearChat(std::span<const ChatMessage> messages,
                                                      std::span<const ToolSpec> tools,
                                                      const ChatOptions& options);

}  // namespace kimirt
