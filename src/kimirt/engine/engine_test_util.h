// Test helpers shared by the engine's tests: collects every request's events; a runner's greedy
// generation of a fixed set of requests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kimirt/engine/engine.h"
#include "kimirt/engine/model_runner.h"

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

// Four greedy requests of 10 tokens (prompts of 10, 17, 24, 31 tokens) through an engine on
// `runner`, prefilled in 16-token chunks; each request's tokens. Empty when the engine fails.
inline std::vector<std::vector<int32_t>> GreedyTokens(ModelRunner& runner) {
  EngineOptions o;
  o.prefill_chunk = 16;
  o.max_num_batched_tokens = 64;
  auto engine = Engine::Create(runner, nullptr, o);
  if (!engine.ok()) return {};
  Collector c;
  std::vector<std::string> ids;
  for (int i = 0; i < 4; ++i) {
    EngineRequest r;
    r.id = "t" + std::to_string(i);
    for (int k = 0; k < 10 + 7 * i; ++k) r.prompt.push_back((k * 31 + i) % 512);
    r.params.temperature = 0;
    r.params.max_tokens = 10;
    r.params.ignore_eos = true;
    r.on_output = c.Callback();
    ids.push_back(r.id);
    if (!(*engine)->Submit(std::move(r)).ok()) return {};
  }
  std::vector<std::vector<int32_t>> out;
  if (c.Wait(ids)) {
    for (const std::string& id : ids) out.push_back(c.Get(id).tokens);
  }
  (*engine)->Shutdown(true);
  return out;
}

}  // namespace kimirt::testing
