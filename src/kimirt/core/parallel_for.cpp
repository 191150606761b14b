#include "kimirt/core/parallel_for.h"

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

namespace kimirt {
namespace {

// One ParallelFor call: indices are claimed from `next` by the caller and any idle workers.
struct Job {
  const std::function<void(int64_t)>* fn;
  int64_t n;
  std::atomic<int64_t> next{0};
  std::atomic<int64_t> done{0};
  std::mutex mu;
  std::condition_variable cv;

  void Work() {
    int64_t i;
    while ((i = next.fetch_add(1)) < n) {
      (*fn)(i);
      if (done.fetch_add(1) + 1 == n) {
        std::lock_guard<std::mutex> lock(mu);
        cv.notify_all();
      }
    }
  }
};

class Pool {
 public:
  explicit Pool(int workers) {
    for (int k = 0; k < workers; ++k) threads_.emplace_back([this] { Loop(); });
  }
  ~Pool() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      quit_ = true;
    }
    cv_.notify_all();
    for (std::thread& t : threads_) t.join();
  }
  int workers() const { return static_cast<int>(threads_.size()); }

  void Run(const std::shared_ptr<Job>& job) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs_.push_back(job);
    }
    cv_.notify_all();
    job->Work();  // the caller helps, so progress never depends on a free worker
    std::unique_lock<std::mutex> lock(job->mu);
    job->cv.wait(lock, [&] { return job->done.load() == job->n; });
  }

 private:
  void Loop() {
    for (;;) {
      std::shared_ptr<Job> job;
      {
        std::unique_lock<std::mutex> lock(mu_);
        cv_.wait(lock, [&] { return quit_ || !jobs_.empty(); });
        if (quit_) return;
        job = jobs_.front();
        // A job stays queued until its indices run out, so several workers can join it.
        if (job->next.load() >= job->n) {
          jobs_.pop_front();
          continue;
        }
      }
      job->Work();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Job>> jobs_;
  bool quit_ = false;
};

std::atomic<int> g_threads{-1};

Pool& GlobalPool() {
  static Pool pool([] {
    const int set = g_threads.load();
    if (set >= 0) return set;
    const unsigned cores = std::thread::hardware_concurrency();
    return cores > 1 ? static_cast<int>(cores) - 1 : 0;
  }());
  return pool;
}

}  // namespace

void SetParallelForThreads(int threads) { g_threads.store(threads < 0 ? 0 : threads); }

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  Pool& pool = GlobalPool();
  if (n == 1 || pool.workers() == 0) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  auto job = std::make_shared<Job>();
  job->fn = &fn;
  job->n = n;
  pool.Run(job);
}

}  // namespace kimirt
