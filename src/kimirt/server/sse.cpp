// SSE framing (sse.h).
#include "kimirt/server/sse.h"

namespace kimirt {

std::string SseEvent(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 8);
  size_t start = 0;
  while (true) {
    size_t end = payload.find_first_of("\r\n", start);
    out += "data: ";
    out.append(payload.substr(start, end == std::string_view::npos ? std::string_view::npos : end - start));
    out += '\n';
    if (end == std::string_view::npos) break;
    // "\r\n" is one line break, not two.
    start = end + ((payload[end] == '\r' && end + 1 < payload.size() && payload[end + 1] == '\n') ? 2 : 1);
  }
  out += '\n';
  return out;
}

}  // namespace kimirt
