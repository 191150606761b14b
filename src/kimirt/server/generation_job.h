// GenerationJob: one HTTP request's engine requests (one per choice: prompts × n) and the events
// they send back, handed from the engine's step-loop thread to the HTTP thread that answers.
//
// Engine callbacks only append to a queue under a mutex and record latency metrics (they must be
// quick: engine.h). The queue state is shared with the callbacks, so an event that arrives after
// the job is gone is harmless. Destroying a job with unfinished choices aborts them, which is how
// a client disconnect frees the engine's blocks and slot.
//
// JobRegistry lets Server::Stop abort whatever is still running once the grace period is over.
//
// Thread safety: Submit/Take from the owning HTTP thread; Abort from any thread.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kimirt/engine/engine.h"

namespace kimirt {

class ServerMetrics;
class GenerationJob;

class JobRegistry {
 public:
  void Add(GenerationJob* job);
  void Remove(GenerationJob* job);
  void AbortAll();
  size_t size() const;

 private:
  mutable std::mutex mu_;
  std::set<GenerationJob*> jobs_;
};

struct JobChoice {
  std::vector<int32_t> prompt;
  SamplingParams params;  // n = 1; the seed already offset for this choice
  // vLLM's include_stop_str_in_output: the stop string that ended the choice is appended to
  // the text of its final event (the engine never emits it).
  bool include_stop_str = false;
};

struct JobEvent {
  size_t choice = 0;
  RequestOutput output;
};

class GenerationJob {
 public:
  // `metrics` may be null. `registry` may be null; else the job is listed while it lives.
  GenerationJob(Engine& engine, std::string id, ServerMetrics* metrics, JobRegistry* registry);
  ~GenerationJob();
  GenerationJob(const GenerationJob&) = delete;
  GenerationJob& operator=(const GenerationJob&) = delete;

  // Submits one engine request per choice, with ids "<id>-<choice>". All or nothing: when one is
  // refused, those already queued are aborted and the refusal is returned.
  Status Submit(std::vector<JobChoice> choices);
  // Moves the events that arrived into *out, waiting up to `wait` for the first one. Returns
  // false once every choice has finished and its events were taken.
  bool Take(std::vector<JobEvent>* out, std::chrono::milliseconds wait);
  // Aborts every unfinished choice; each then ends with a kAbort event.
  void Abort();

  const std::string& id() const { return id_; }
  size_t num_choices() const { return num_choices_; }

 private:
  struct Shared;
  Engine& engine_;
  std::string id_;
  JobRegistry* registry_;
  std::shared_ptr<Shared> shared_;
  size_t num_choices_ = 0;
};

// A non-streamed answer's wait: hands every event of `job` to `on_event` until all its choices
// have finished. Meanwhile `client_gone` (may be empty) is asked every `poll`; once it says the
// client hung up, the job is aborted (its blocks and slots freed now, not at max_tokens), the
// remaining events are drained without `on_event`, and false is returned.
bool CollectUnlessClientGone(GenerationJob& job, const std::function<bool()>& client_gone,
                             const std::function<void(JobEvent&)>& on_event,
                             std::chrono::milliseconds poll = std::chrono::milliseconds(100));

}  // namespace kimirt
