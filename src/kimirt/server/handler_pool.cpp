// HandlerPool (handler_pool.h).
#include "kimirt/server/handler_pool.h"

#include <algorithm>
#include <cstdio>
#include <system_error>
#include <utility>

namespace kimirt {

HandlerPool::HandlerPool(int warm, int max) : max_(std::max(1, max)) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int i = 0; i < std::min(std::max(1, warm), max_); ++i) Spawn();
}

HandlerPool::~HandlerPool() { Shutdown(); }

void HandlerPool::Spawn() {
  try {
    threads_.emplace_back([this] { Work(); });
  } catch (const std::system_error& e) {
    // Out of threads: the task waits for a running one to finish, as past `max`.
    std::fprintf(stderr, "kimirt server: cannot start a handler thread (%s); %zu running\n", e.what(),
                 threads_.size());
  }
}

void HandlerPool::Submit(std::function<void()> task) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stop_) return;
  tasks_.push_back(std::move(task));
  // Every idle thread will take one queued task; grow when the queue outnumbers them.
  if (idle_ < tasks_.size() && threads_.size() < static_cast<size_t>(max_)) Spawn();
  cv_.notify_one();
}

void HandlerPool::Work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    ++idle_;
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    --idle_;
    if (tasks_.empty()) return;  // stopping, and nothing is left to run
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    task();
    lock.lock();
  }
}

void HandlerPool::Shutdown() {
  std::vector<std::thread> threads;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    threads.swap(threads_);
  }
  cv_.notify_all();
  for (std::thread& t : threads) t.join();
}

int HandlerPool::threads() const {
  std::lock_guard<std::mutex> lock(mu_);
  return static_cast<int>(threads_.size());
}

}  // namespace kimirt
