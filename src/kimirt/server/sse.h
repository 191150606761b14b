// Server-sent events framing for the streaming endpoints, as OpenAI streams them: each event is
// `data: <json>\n\n` and the stream ends with `data: [DONE]\n\n`.
#pragma once

#include <string>
#include <string_view>

namespace kimirt {

// One event carrying `payload`. A payload with line breaks becomes one `data:` line per line
// (the SSE rule), so a client's parser joins them back with '\n'; compact JSON has none.
std::string SseEvent(std::string_view payload);
// The terminator OpenAI clients wait for.
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";
inline constexpr std::string_view kSseContentType = "text/event-stream";

}  // namespace kimirt
