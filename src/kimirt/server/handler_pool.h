// HandlerPool: the threads HTTP handlers run on, so the transport's I/O thread never blocks.
//
// A handler may block for as long as its request lasts (a non-streamed completion waits for its
// generation; a stream runs until its last event), so a fixed pool would let `threads` long
// requests starve every other endpoint, /health included (issue 11). The pool therefore starts
// `warm` threads and grows whenever a task finds none idle, up to `max`: a thread exists per
// request being handled, never per connection (idle and slow connections hold none). Past `max`
// tasks wait in order. Threads are kept once started (no churn under bursts) and joined by
// Shutdown().
//
// Thread safety: Submit from any thread; Shutdown once, from the owner.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kimirt {

class HandlerPool {
 public:
  HandlerPool(int warm, int max);
  ~HandlerPool();  // Shutdown()
  HandlerPool(const HandlerPool&) = delete;
  HandlerPool& operator=(const HandlerPool&) = delete;

  // Runs `task` on a pool thread. `task` must not throw.
  void Submit(std::function<void()> task);
  // Runs the tasks already submitted, then joins every thread. Later Submits are dropped.
  void Shutdown();
  int threads() const;

 private:
  void Spawn();  // with mu_ held
  void Work();

  const int max_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  size_t idle_ = 0;
  bool stop_ = false;
};

}  // namespace kimirt
