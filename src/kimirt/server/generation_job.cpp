// Engine requests of one HTTP request and their event queue (generation_job.h).
#include "kimirt/server/generation_job.h"

#include <deque>
#include <utility>

#include "kimirt/server/metrics.h"

namespace kimirt {

using Clock = std::chrono::steady_clock;

void JobRegistry::Add(GenerationJob* job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.insert(job);
}

void JobRegistry::Remove(GenerationJob* job) {
  std::lock_guard<std::mutex> lock(mu_);
  jobs_.erase(job);
}

void JobRegistry::AbortAll() {
  // Held while aborting so that no job is destroyed meanwhile (~GenerationJob removes itself
  // under the same mutex). Abort only calls Engine::Abort, which never calls back into here.
  std::lock_guard<std::mutex> lock(mu_);
  for (GenerationJob* job : jobs_) job->Abort();
}

size_t JobRegistry::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return jobs_.size();
}

struct GenerationJob::Shared {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<JobEvent> events;
  std::vector<bool> finished;    // per choice
  std::vector<bool> submitted;   // per choice
  std::vector<bool> aborted;     // per choice: Engine::Abort already sent
  size_t unfinished = 0;
  ServerMetrics* metrics = nullptr;
  Clock::time_point start;
  std::vector<Clock::time_point> last_token_at;  // per choice; start until the first token
  std::vector<bool> got_token;
  std::vector<bool> include_stop_str;  // per choice

  // On the engine's step-loop thread: queue the event, record latencies.
  void OnOutput(size_t choice, const RequestOutput& out) {
    const Clock::time_point now = Clock::now();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (finished[choice]) return;  // an engine that reports after its final event
      const size_t n_tokens = out.token_ids.size();
      if (metrics != nullptr && n_tokens > 0) {
        const double since = std::chrono::duration<double>(now - last_token_at[choice]).count();
        if (!got_token[choice]) {
          metrics->ObserveTimeToFirstToken(since);
          // Tokens that arrive with the first one are spread over no time at all.
          if (n_tokens > 1) metrics->ObserveTimePerOutputToken(0.0, n_tokens - 1);
        } else {
          metrics->ObserveTimePerOutputToken(since / static_cast<double>(n_tokens), n_tokens);
        }
        got_token[choice] = true;
        last_token_at[choice] = now;
      }
      events.push_back({choice, out});
      if (include_stop_str[choice]) events.back().output.text += out.stop_string;
      if (out.finish != FinishReason::kNone) {
        finished[choice] = true;
        --unfinished;
        if (metrics != nullptr) {
          metrics->ObserveEndToEnd(std::chrono::duration<double>(now - start).count());
          metrics->AddTokens(out.prompt_tokens, out.completion_tokens);
          metrics->CountFinished(out.finish);
        }
      }
    }
    cv.notify_all();
  }
};

GenerationJob::GenerationJob(Engine& engine, std::string id, ServerMetrics* metrics, JobRegistry* registry)
    : engine_(engine), id_(std::move(id)), registry_(registry), shared_(std::make_shared<Shared>()) {
  shared_->metrics = metrics;
  shared_->start = Clock::now();
  if (registry_ != nullptr) registry_->Add(this);
}

GenerationJob::~GenerationJob() {
  if (registry_ != nullptr) registry_->Remove(this);
  Abort();
}

Status GenerationJob::Submit(std::vector<JobChoice> choices) {
  num_choices_ = choices.size();
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->finished.assign(num_choices_, false);
    shared_->submitted.assign(num_choices_, false);
    shared_->aborted.assign(num_choices_, false);
    shared_->got_token.assign(num_choices_, false);
    shared_->include_stop_str.resize(num_choices_);
    for (size_t i = 0; i < num_choices_; ++i) shared_->include_stop_str[i] = choices[i].include_stop_str;
    shared_->last_token_at.assign(num_choices_, shared_->start);
    shared_->unfinished = num_choices_;
  }
  for (size_t i = 0; i < choices.size(); ++i) {
    EngineRequest request;
    request.id = id_ + "-" + std::to_string(i);
    request.prompt = std::move(choices[i].prompt);
    request.params = std::move(choices[i].params);
    request.on_output = [shared = shared_, i](const RequestOutput& out) { shared->OnOutput(i, out); };
    Status s = engine_.Submit(std::move(request));
    if (!s.ok()) {
      {
        std::lock_guard<std::mutex> lock(shared_->mu);
        // The refused choice and those never tried will send nothing: count them as finished.
        for (size_t j = i; j < num_choices_; ++j) {
          if (!shared_->finished[j]) {
            shared_->finished[j] = true;
            --shared_->unfinished;
          }
        }
      }
      Abort();
      return s;
    }
    std::lock_guard<std::mutex> lock(shared_->mu);
    shared_->submitted[i] = true;
  }
  return Status::Ok();
}

bool GenerationJob::Take(std::vector<JobEvent>* out, std::chrono::milliseconds wait) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  if (shared_->events.empty() && shared_->unfinished > 0) {
    shared_->cv.wait_for(lock, wait, [&] { return !shared_->events.empty() || shared_->unfinished == 0; });
  }
  while (!shared_->events.empty()) {
    out->push_back(std::move(shared_->events.front()));
    shared_->events.pop_front();
  }
  return shared_->unfinished > 0;
}

void GenerationJob::Abort() {
  std::vector<std::string> ids;
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    for (size_t i = 0; i < num_choices_; ++i) {
      if (shared_->submitted[i] && !shared_->finished[i] && !shared_->aborted[i]) {
        shared_->aborted[i] = true;
        ids.push_back(id_ + "-" + std::to_string(i));
      }
    }
  }
  // Outside the lock: an engine may deliver the kAbort event from inside Abort().
  for (const std::string& id : ids) engine_.Abort(id);
}

bool CollectUnlessClientGone(GenerationJob& job, const std::function<bool()>& client_gone,
                             const std::function<void(JobEvent&)>& on_event, std::chrono::milliseconds poll) {
  bool more = true;
  while (more) {
    std::vector<JobEvent> events;
    more = job.Take(&events, poll);
    for (JobEvent& ev : events) on_event(ev);
    if (more && client_gone && client_gone()) {
      job.Abort();
      std::vector<JobEvent> rest;
      while (job.Take(&rest, poll)) rest.clear();
      return false;
    }
  }
  return true;
}

}  // namespace kimirt
