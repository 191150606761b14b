// JobStream (job_stream.h).
#include "kimirt/server/job_stream.h"

#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/server/sse.h"

namespace kimirt {

HttpStream::Poll JobStream::Next(std::string* out, std::chrono::milliseconds wait) {
  if (done_) return Poll::kEnd;
  if (!preamble_sent_) {
    preamble_sent_ = true;
    Preamble(out);
    if (!out->empty()) return Poll::kData;
  }
  std::vector<JobEvent> events;
  const bool more = job_->Take(&events, wait);
  for (const JobEvent& ev : events) OnEvent(ev, out);
  if (!more) {
    Tail(out);
    *out += kSseDone;
    done_ = true;
    return Poll::kEnd;
  }
  return out->empty() ? Poll::kIdle : Poll::kData;
}

void JobStream::Close(bool complete) {
  if (!complete) job_->Abort();
}

std::string UsageEvent(Json header, Json usage) {
  header["choices"] = Json::array();
  header["usage"] = std::move(usage);
  return SseEvent(header.dump());
}

}  // namespace kimirt
