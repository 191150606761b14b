// Communicator implementations that need no devices: one rank (copies and no-ops) and an
// in-process group of threads, one per rank, which is how CI checks TP = 2/4/8 against TP = 1 on
// CPU (communicator.h).
//
// Thread-safety: a Communicator object belongs to its rank's thread; its methods must not be
// called from two threads at once. The ranks of one thread group synchronize only through the
// shared ThreadGroup below, whose state is guarded by its mutex.
//
// Thread-group collectives are two generation barriers around direct reads of the peers' buffers
// (no copies through a shared staging area):
//   1. each rank publishes its buffer pointer and arrives at barrier A;
//   2. after A, each rank reads every peer's buffer: AllReduceSum sums them IN RANK ORDER
//      0, 1, ..., n-1 into a private temporary (so every rank computes the same bits, and runs
//      are deterministic); AllGather copies slot r from rank r;
//   3. all arrive at barrier B; only after B does a rank overwrite its own buffer (the sum) or
//      return (so the caller may reuse send): nobody writes a buffer another rank still reads.
// A rank republishes its pointer only at its next barrier A, i.e. after leaving barrier B, when
// every peer has arrived at B and so has finished reading: one pair of barriers suffices. Waiting
// is on a condition_variable (no spinning); the barrier is reusable (a generation counter).
//
// Misuse and failures end in an exception from RunOnThreadRanks instead of a silent deadlock:
// every arrival records (op, count); the last arrival checks they all agree, else all ranks throw
// std::logic_error. A rank whose fn returns while peers wait in a collective makes them throw
// std::logic_error; a rank whose fn throws makes the peers' collectives throw ThreadGroupAborted.
// RunOnThreadRanks joins all threads, then rethrows the lowest rank's original exception.
#include "kimirt/parallel/communicator.h"

#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/core/check.h"

namespace kimirt {
namespace {

// ---------------------------------------------------------------------------------------------
// One rank.

class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void AllReduceSum(float*, size_t) override {}  // the sum over one rank is its own data
  void AllGather(const float* send, size_t n, float* recv) override {
    if (n != 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
  }
  void Barrier() override {}
};

// ---------------------------------------------------------------------------------------------
// Threads.

// Thrown in the surviving ranks when another rank's fn threw; RunOnThreadRanks reports the
// original exception instead.
class ThreadGroupAborted : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Which barrier of which collective a rank arrives at; peers must arrive with the same tag.
enum class Op : uint8_t {
  kAllReduceA,
  kAllReduceB,
  kAllGatherA,
  kAllGatherB,
  kBarrier,
};

const char* OpName(Op op) {
  switch (op) {
    case Op::kAllReduceA:
    case Op::kAllReduceB:
      return "AllReduceSum";
    case Op::kAllGatherA:
    case Op::kAllGatherB:
      return "AllGather";
    case Op::kBarrier:
      return "Barrier";
  }
  return "?";
}

class ThreadGroup {
 public:
  explicit ThreadGroup(int size)
      : size_(size), ptrs_(static_cast<size_t>(size)), tags_(static_cast<size_t>(size)) {}

  int size() const { return size_; }

  // Records `rank`'s arrival (and, at a collective's first barrier, its buffer) and blocks until all ranks have arrived at this generation.
  // Throws instead of blocking forever when that can no longer happen (see the top comment).
  void ArriveAndWait(int rank, Op op, size_t count, const void* ptr) {
    std::unique_lock<std::mutex> lock(mu_);
    ThrowIfBroken(rank, op);
    // Only the first barrier of a collective publishes: peers read the pointers between the two
    // barriers, so the second must leave them alone.
    if (op == Op::kAllReduceA || op == Op::kAllGatherA) ptrs_[rank] = ptr;
    tags_[rank] = Tag{op, count};
    if (++arrived_ == size_) {
      for (int r = 0; r < size_; ++r) {
        if (tags_[r].op != tags_[0].op || tags_[r].count != tags_[0].count) {
          misuse_ = "thread ranks called different collectives: rank 0 called " +
                    Describe(tags_[0]) + ", rank " + std::to_string(r) + " called " +
                    Describe(tags_[r]) + " (every rank must call the same collectives in the " +
                    "same order with the same sizes)";
          cv_.notify_all();
          throw std::logic_error(misuse_);
        }
      }
      arrived_ = 0;
      ++generation_;
      cv_.notify_all();
      return;
    }
    const uint64_t gen = generation_;
    cv_.wait(lock, [&] { return generation_ != gen || Broken(); });
    // Woken by a completed generation, or by a break (then the group is dead: every later
    // arrival throws at entry, so arrived_ need not be restored).
    if (generation_ == gen) ThrowIfBroken(rank, op);
  }

  // Rank r's pointer published at the barrier just passed; valid until the next barrier.
  const void* Published(int rank) const { return ptrs_[rank]; }

  // Called once per rank when its fn ends: `failed` when it threw.
  void Exit(int rank, bool failed) {
    std::lock_guard<std::mutex> lock(mu_);
    if (failed) {
      failed_rank_ = failed_rank_ < 0 ? rank : failed_rank_;
    } else if (exited_rank_ < 0) {
      exited_rank_ = rank;
    }
    cv_.notify_all();
  }

 private:
  struct Tag {
    Op op = Op::kBarrier;
    size_t count = 0;
  };

  static std::string Describe(const Tag& t) {
    return std::string(OpName(t.op)) + "(n=" + std::to_string(t.count) + ")";
  }

  // A barrier of the current generation can no longer complete. (A rank that has exited cannot
  // be among its arrivals: had it arrived, it would still be waiting in it, or it would have
  // been the last arrival and the generation would have advanced.)
  bool Broken() const { return failed_rank_ >= 0 || !misuse_.empty() || exited_rank_ >= 0; }

  void ThrowIfBroken(int rank, Op op) const {
    if (failed_rank_ >= 0) {
      throw ThreadGroupAborted("thread rank " + std::to_string(failed_rank_) +
                               " failed; rank " + std::to_string(rank) + " abandons " +
                               OpName(op));
    }
    if (!misuse_.empty()) throw std::logic_error(misuse_);
    if (exited_rank_ >= 0) {
      throw std::logic_error("thread rank " + std::to_string(exited_rank_) +
                             " returned while rank " + std::to_string(rank) + " waits in " +
                             OpName(op) + " (every rank must call the same collectives)");
    }
  }

  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Guarded by mu_ (ptrs_ is also read after a barrier, which the mutex orders after the writes).
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<const void*> ptrs_;
  std::vector<Tag> tags_;
  int failed_rank_ = -1;  // first rank whose fn threw
  int exited_rank_ = -1;  // first rank whose fn returned
  std::string misuse_;    // set when the last arrival found mismatched tags
};

class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(ThreadGroup& group, int rank) : group_(group), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return group_.size(); }

  void AllReduceSum(float* data, size_t n) override {
    group_.ArriveAndWait(rank_, Op::kAllReduceA, n, data);
    // Same order on every rank, each element's sum is ((x0 + x1) + x2) + ... — bitwise equal
    // everywhere. Starting from x0 (not 0.0f) keeps a lone -0.0f as it is.
    sum_.resize(n);
    if (n != 0) {
      std::memcpy(sum_.data(), group_.Published(0), n * sizeof(float));
      for (int r = 1; r < size(); ++r) {
        const float* x = static_cast<const float*>(group_.Published(r));
        for (size_t i = 0; i < n; ++i) sum_[i] += x[i];
      }
    }
    group_.ArriveAndWait(rank_, Op::kAllReduceB, n, nullptr);
    if (n != 0) std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  // In place (send == recv + rank*n) is allowed: the own slot is then skipped, and the peers only
  // read that slot, which nobody writes.
  void AllGather(const float* send, size_t n, float* recv) override {
    group_.ArriveAndWait(rank_, Op::kAllGatherA, n, send);
    if (n != 0) {
      for (int r = 0; r < size(); ++r) {
        const float* src = static_cast<const float*>(group_.Published(r));
        float* dst = recv + static_cast<size_t>(r) * n;
        if (src != dst) std::memcpy(dst, src, n * sizeof(float));
      }
    }
    group_.ArriveAndWait(rank_, Op::kAllGatherB, n, nullptr);
  }

  void Barrier() override { group_.ArriveAndWait(rank_, Op::kBarrier, 0, nullptr); }

 private:
  ThreadGroup& group_;
  const int rank_;
  std::vector<float> sum_;  // reused across calls: no allocation per collective once warm
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

void RunOnThreadRanks(int ranks, const std::function<void(Communicator&)>& fn) {
  KIMIRT_CHECK_MSG(ranks >= 1, "RunOnThreadRanks needs at least one rank");
  ThreadGroup group(ranks);
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  // 1 where the rank's exception is a ThreadGroupAborted echo (a byte each: threads write their
  // own entries concurrently, which std::vector<bool>'s packed bits would make a data race).
  std::vector<uint8_t> secondary(static_cast<size_t>(ranks), 0);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator comm(group, r);
      bool failed = false;
      try {
        fn(comm);
      } catch (const ThreadGroupAborted&) {
        errors[r] = std::current_exception();
        secondary[r] = 1;
        failed = true;
      } catch (...) {
        errors[r] = std::current_exception();
        failed = true;
      }
      group.Exit(r, failed);
    });
  }
  for (std::thread& t : threads) t.join();
  // The lowest rank's own failure, not the echoes it caused in the other ranks.
  for (int r = 0; r < ranks; ++r) {
    if (errors[r] && !secondary[r]) std::rethrow_exception(errors[r]);
  }
  for (int r = 0; r < ranks; ++r) {
    if (errors[r]) std::rethrow_exception(errors[r]);
  }
}

}  // namespace kimirt
