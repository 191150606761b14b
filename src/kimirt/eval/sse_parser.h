// Incremental server-sent-events parser (WHATWG HTML "Server-sent events", event stream
// interpretation): bytes arrive in arbitrary chunks (a TCP read may end inside a field name, a
// JSON payload or between '\r' and '\n'), complete events come out as their joined `data`.
// Lines end with "\r\n", "\n" or "\r"; a blank line dispatches; ':' starts a comment (servers
// send them as keep-alive pings); fields other than `data` (event, id, retry) are ignored.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kimirt::eval {

class SseParser {
 public:
  // Appends the data of every event completed by `bytes` to `events`.
  void Feed(std::string_view bytes, std::vector<std::string>* events);
  // End of stream: an event whose blank line never came is dispatched too (the spec drops it,
  // but vLLM's client accepts a final unterminated `data:` line, and so do we).
  void Finish(std::vector<std::string>* events);

 private:
  void ProcessLine(std::vector<std::string>* events);
  void Dispatch(std::vector<std::string>* events);

  std::string line_;         // the current line, without its terminator
  std::string data_;         // data lines of the current event, each followed by '\n'
  bool has_data_ = false;
  bool skip_lf_ = false;     // the previous chunk ended in '\r': a leading '\n' belongs to it
};

}  // namespace kimirt::eval
