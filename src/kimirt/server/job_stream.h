// JobStream: the part the two streaming endpoints share — an SSE body fed by a GenerationJob.
// Next() sends the endpoint's preamble, then each engine event as the endpoint renders it, then
// the endpoint's tail (the include_usage chunk) and `data: [DONE]`; Close() before the end (the
// client left) aborts the job, freeing the engine's blocks and slot at once.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "kimirt/server/generation_job.h"
#include "kimirt/server/http_server.h"
#include "kimirt/server/openai_schema.h"

namespace kimirt {

class JobStream : public HttpStream {
 public:
  explicit JobStream(std::unique_ptr<GenerationJob> job) : job_(std::move(job)) {}
  Poll Next(std::string* out, std::chrono::milliseconds wait) final;
  void Close(bool complete) final;

 protected:
  // Events sent before any engine event (chat: each choice's role chunk); none by default.
  virtual void Preamble(std::string* /*out*/) {}
  virtual void OnEvent(const JobEvent& ev, std::string* out) = 0;
  // Events sent after the last engine event, before [DONE] (the usage chunk, if asked for).
  virtual void Tail(std::string* out) = 0;

 private:
  std::unique_ptr<GenerationJob> job_;
  bool preamble_sent_ = false;
  bool done_ = false;
};

// The include_usage event: `header` (id, object, created, model) with no choices, and `usage`.
std::string UsageEvent(Json header, Json usage);

}  // namespace kimirt
