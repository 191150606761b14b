// Test helper shared by the engine's tests: collects every request's events.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kimirt/engine/engine.h"

namespace kimirt::testing {

// Collects every request's events; Wait() blocks until the given ids finished.
class Collector {
 public:
  std::function<void(const RequestOutput&)> Callback() {
    return [this](const RequestOutput& o) {
      std::lock_guard<std::mutex> lock(mu_);
      Result& r = results_[o.request_id];
      r.tokens.insert(r.tokens.end(), o.token_ids.begin(), o.token_ids.end());
      for (const SampleResult& s : o.logprobs) r.logprobs.push_back(s.logprob);
      if (!o.prompt_logprobs.empty()) {
        r.prompt_logprobs_event = r.events;
        r.prompt_logprobs.insert(r.prompt_logprobs.end(), o.prompt_logprobs.begin(), o.prompt_logprobs.end());
      }
      r.events += 1;
      if (o.finish != FinishReason::kNone) {
        r.finish = o.finish;
        r.error = o.error;
        r.prompt_tokens = o.prompt_tokens;
        r.completion_tokens = o.completion_tokens;
        cv_.notify_all();
      }
    };
  }
  struct Result {
    std::vector<int32_t> tokens;
    std::vector<float> logprobs;
    std::vector<SampleResult> prompt_logprobs;
    int prompt_logprobs_event = -1;  // the index of the event that carried them
    FinishReason finish = FinishReason::kNone;
    Status error;
    int events = 0;
    int64_t prompt_tokens = 0, completion_tokens = 0;
  };
  bool Wait(const std::vector<std::string>& ids, double seconds = 60) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] {
      for (const std::string& id : ids) {
        auto it = results_.find(id);
        if (it == results_.end() || it->second.finish == FinishReason::kNone) return false;
      }
      return true;
    });
  }
  Result Get(const std::string& id) {
    std::lock_guard<std::mutex> lock(mu_);
    return results_[id];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, Result> results_;
};

}  // namespace kimirt::testing
