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
// Point to point: Send copies the message into the (sender, receiver) mailbox of the group and
// returns; Recv waits for the oldest message of that mailbox. Buffered sends never block, so a
// pipeline's stages cannot deadlock on each other whatever order they send in.
//
// A tp × pp grid (RunOnThreadGrid) is one ThreadWorld — the mutex and condition variable every
// wait uses, and who failed or returned — with tp + pp groups over it (the stages' TP groups and
// the tp ranks' pipeline groups). A failure anywhere ends every group; a rank returning ends the
// collectives of its own groups only (its peers in other groups may still be working).
//
// Misuse and failures end in an exception from RunOnThreadRanks instead of a silent deadlock:
// every arrival records (op, count); the last arrival checks they all agree, else all ranks throw
// std::logic_error. A rank whose fn returns while peers wait in a collective makes them throw
// std::logic_error; a rank whose fn throws makes the peers' collectives throw ThreadGroupAborted.
// RunOnThreadRanks joins all threads, then rethrows the lowest rank's original exception.
#include "kimirt/parallel/communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
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
  void Send(const float*, size_t, int peer) override { NoPeer(peer); }
  void Recv(float*, size_t, int peer) override { NoPeer(peer); }

 private:
  [[noreturn]] static void NoPeer(int peer) {
    throw std::logic_error("a communicator of one rank has no peer " + std::to_string(peer) + " to send to or receive from");
  }
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

// What every group of one run shares (see the top comment). Guarded by mu.
struct ThreadWorld {
  explicit ThreadWorld(int size)
      : exited(static_cast<size_t>(size), 0), waits_on(static_cast<size_t>(size)), where(static_cast<size_t>(size)) {}
  std::mutex mu;
  std::condition_variable cv;
  int failed_rank = -1;        // first world rank whose fn threw
  std::vector<uint8_t> exited;  // per world rank: its fn returned
  std::string misuse;           // set when a group's last arrival found mismatched tags
  // Per world rank: what it is blocked on (a group's barrier, a mailbox), null while it runs.
  std::vector<const void*> waits_on;
  std::vector<std::string> where;
  std::string deadlock;  // set when every rank still running is blocked

  // Called once per rank when its fn ends: `failed` when it threw.
  void Exit(int world_rank, bool failed) {
    std::lock_guard<std::mutex> lock(mu);
    if (failed) {
      failed_rank = failed_rank < 0 ? world_rank : failed_rank;
    } else {
      exited[static_cast<size_t>(world_rank)] = 1;
    }
    CheckDeadlock();
    cv.notify_all();
  }

  // Rank w blocks on `what` (`why` describes it). When every rank that has not returned is
  // blocked, none can wake another: a deadlock (a Recv without its Send, stages waiting on each
  // other), which ends every wait in std::logic_error instead of a hang.
  void Block(int w, const void* what, std::string why) {
    waits_on[static_cast<size_t>(w)] = what;
    where[static_cast<size_t>(w)] = std::move(why);
    CheckDeadlock();
  }
  // Every rank blocked on `what` may run again (its barrier completed, its mailbox got mail).
  void Wake(const void* what) {
    for (const void*& p : waits_on) {
      if (p == what) p = nullptr;
    }
  }
  void Unblock(int w) { waits_on[static_cast<size_t>(w)] = nullptr; }

 private:
  void CheckDeadlock() {
    std::string who;
    for (size_t r = 0; r < exited.size(); ++r) {
      if (exited[r] != 0) continue;
      if (waits_on[r] == nullptr) return;
      who += (who.empty() ? "" : ", ") + where[r];
    }
    if (who.empty() || !deadlock.empty()) return;
    deadlock = "thread ranks deadlocked: every rank still running waits (" + who + ")";
    cv.notify_all();
  }
};

class ThreadGroup {
 public:
  // `members[r]` is the world rank of group rank r.
  ThreadGroup(ThreadWorld& world, std::vector<int> members)
      : world_(world),
        members_(std::move(members)),
        ptrs_(members_.size()),
        tags_(members_.size()),
        mail_(members_.size() * members_.size()) {}

  int size() const { return static_cast<int>(members_.size()); }

  // Records `rank`'s arrival (and, at a collective's first barrier, its buffer) and blocks until all ranks have arrived at this generation.
  // Throws instead of blocking forever when that can no longer happen (see the top comment).
  void ArriveAndWait(int rank, Op op, size_t count, const void* ptr) {
    std::unique_lock<std::mutex> lock(world_.mu);
    ThrowIfBroken(rank, OpName(op));
    // Only the first barrier of a collective publishes: peers read the pointers between the two
    // barriers, so the second must leave them alone.
    if (op == Op::kAllReduceA || op == Op::kAllGatherA) ptrs_[rank] = ptr;
    tags_[rank] = Tag{op, count};
    if (++arrived_ == size()) {
      for (int r = 0; r < size(); ++r) {
        if (tags_[r].op != tags_[0].op || tags_[r].count != tags_[0].count) {
          world_.misuse = "thread ranks called different collectives: rank 0 called " +
                          Describe(tags_[0]) + ", rank " + std::to_string(r) + " called " +
                          Describe(tags_[r]) + " (every rank must call the same collectives in the " +
                          "same order with the same sizes)";
          world_.cv.notify_all();
          throw std::logic_error(world_.misuse);
        }
      }
      arrived_ = 0;
      ++generation_;
      world_.Wake(this);
      world_.cv.notify_all();
      return;
    }
    const uint64_t gen = generation_;
    const int w = members_[static_cast<size_t>(rank)];
    world_.Block(w, this, "rank " + std::to_string(w) + " in " + OpName(op));
    world_.cv.wait(lock, [&] { return generation_ != gen || Broken(); });
    world_.Unblock(w);
    // Woken by a completed generation, or by a break (then the group is dead: every later
    // arrival throws at entry, so arrived_ need not be restored).
    if (generation_ == gen) ThrowIfBroken(rank, OpName(op));
  }

  // Rank r's pointer published at the barrier just passed; valid until the next barrier.
  const void* Published(int rank) const { return ptrs_[rank]; }

  void Send(int from, int to, const float* data, size_t n) {
    CheckPeer(from, to);
    std::lock_guard<std::mutex> lock(world_.mu);
    if (world_.failed_rank >= 0 || !world_.misuse.empty()) ThrowIfBroken(from, "Send");
    Mailbox(from, to).emplace_back(data, data + n);
    world_.Wake(&Mailbox(from, to));
    world_.cv.notify_all();
  }

  void Recv(int to, int from, float* data, size_t n) {
    CheckPeer(to, from);
    std::unique_lock<std::mutex> lock(world_.mu);
    std::deque<std::vector<float>>& box = Mailbox(from, to);
    const int w = members_[static_cast<size_t>(to)], peer = members_[static_cast<size_t>(from)];
    if (box.empty() && world_.exited[static_cast<size_t>(peer)] == 0) world_.Block(w, &box, "rank " + std::to_string(w) + " in Recv from rank " + std::to_string(peer));
    world_.cv.wait(lock, [&] {
      return !box.empty() || world_.failed_rank >= 0 || !world_.misuse.empty() || !world_.deadlock.empty() ||
             world_.exited[static_cast<size_t>(peer)] != 0;
    });
    world_.Unblock(w);
    if (box.empty()) {
      if (world_.failed_rank >= 0 || !world_.misuse.empty()) ThrowIfBroken(to, "Recv");
      if (world_.exited[static_cast<size_t>(peer)] == 0) throw std::logic_error(world_.deadlock);
      throw std::logic_error("thread rank " + std::to_string(from) + " returned while rank " + std::to_string(to) +
                             " waits in Recv from it (every Recv needs its Send)");
    }
    if (box.front().size() != n) {
      throw std::logic_error("thread rank " + std::to_string(to) + " receives " + std::to_string(n) +
                             " floats from rank " + std::to_string(from) + ", which sent " +
                             std::to_string(box.front().size()));
    }
    std::copy(box.front().begin(), box.front().end(), data);
    box.pop_front();
  }

 private:
  struct Tag {
    Op op = Op::kBarrier;
    size_t count = 0;
  };

  static std::string Describe(const Tag& t) {
    return std::string(OpName(t.op)) + "(n=" + std::to_string(t.count) + ")";
  }

  void CheckPeer(int self, int peer) const {
    if (peer < 0 || peer >= size() || peer == self) {
      throw std::logic_error("thread rank " + std::to_string(self) + " of " + std::to_string(size()) +
                             ": no peer rank " + std::to_string(peer));
    }
  }

  std::deque<std::vector<float>>& Mailbox(int from, int to) {
    // (World ranks of other groups never wait on this group's mailboxes: pointers are unique.)
    return mail_[static_cast<size_t>(from) * members_.size() + static_cast<size_t>(to)];
  }

  // The first member whose fn returned, or -1.
  int ExitedMember() const {
    for (size_t r = 0; r < members_.size(); ++r) {
      if (world_.exited[static_cast<size_t>(members_[r])] != 0) return static_cast<int>(r);
    }
    return -1;
  }

  // A barrier of the current generation can no longer complete. (A rank that has exited cannot
  // be among its arrivals: had it arrived, it would still be waiting in it, or it would have
  // been the last arrival and the generation would have advanced.)
  bool Broken() const {
    return world_.failed_rank >= 0 || !world_.misuse.empty() || !world_.deadlock.empty() || ExitedMember() >= 0;
  }

  void ThrowIfBroken(int rank, const char* what) const {
    if (world_.failed_rank >= 0) {
      throw ThreadGroupAborted("thread rank " + std::to_string(world_.failed_rank) + " failed; rank " +
                               std::to_string(rank) + " abandons " + what);
    }
    if (!world_.misuse.empty()) throw std::logic_error(world_.misuse);
    if (!world_.deadlock.empty()) throw std::logic_error(world_.deadlock);
    if (const int exited = ExitedMember(); exited >= 0) {
      throw std::logic_error("thread rank " + std::to_string(exited) + " returned while rank " +
                             std::to_string(rank) + " waits in " + what +
                             " (every rank must call the same collectives)");
    }
  }

  ThreadWorld& world_;
  const std::vector<int> members_;
  // Guarded by world_.mu (ptrs_ is also read after a barrier, which the mutex orders after the
  // writes).
  int arrived_ = 0;
  uint64_t generation_ = 0;
  std::vector<const void*> ptrs_;
  std::vector<Tag> tags_;
  std::vector<std::deque<std::vector<float>>> mail_;  // [from * size + to]: messages in flight
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

  void Send(const float* data, size_t n, int peer) override { group_.Send(rank_, peer, data, n); }
  void Recv(float* data, size_t n, int peer) override { group_.Recv(rank_, peer, data, n); }

 private:
  ThreadGroup& group_;
  const int rank_;
  std::vector<float> sum_;  // reused across calls: no allocation per collective once warm
};

}  // namespace

std::unique_ptr<Communicator> MakeSingleRankCommunicator() {
  return std::make_unique<SingleRankCommunicator>();
}

void RunOnThreadGrid(int tp, int pp, const std::function<void(Communicator&, Communicator&)>& fn) {
  KIMIRT_CHECK_MSG(tp >= 1 && pp >= 1, "RunOnThreadGrid needs at least one rank");
  const int ranks = tp * pp;
  ThreadWorld world(ranks);
  // World rank w = stage * tp + tp rank (stage-major).
  std::vector<std::unique_ptr<ThreadGroup>> stages, pipes;
  for (int s = 0; s < pp; ++s) {
    std::vector<int> m;
    for (int t = 0; t < tp; ++t) m.push_back(s * tp + t);
    stages.push_back(std::make_unique<ThreadGroup>(world, std::move(m)));
  }
  for (int t = 0; t < tp; ++t) {
    std::vector<int> m;
    for (int s = 0; s < pp; ++s) m.push_back(s * tp + t);
    pipes.push_back(std::make_unique<ThreadGroup>(world, std::move(m)));
  }
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  // 1 where the rank's exception is a ThreadGroupAborted echo (a byte each: threads write their
  // own entries concurrently, which std::vector<bool>'s packed bits would make a data race).
  std::vector<uint8_t> secondary(static_cast<size_t>(ranks), 0);
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      ThreadCommunicator tp_comm(*stages[static_cast<size_t>(r / tp)], r % tp);
      ThreadCommunicator pp_comm(*pipes[static_cast<size_t>(r % tp)], r / tp);
      bool failed = false;
      try {
        fn(tp_comm, pp_comm);
      } catch (const ThreadGroupAborted&) {
        errors[r] = std::current_exception();
        secondary[r] = 1;
        failed = true;
      } catch (...) {
        errors[r] = std::current_exception();
        failed = true;
      }
      world.Exit(r, failed);
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

void RunOnThreadRanks(int ranks, const std::function<void(Communicator&)>& fn) {
  KIMIRT_CHECK_MSG(ranks >= 1, "RunOnThreadRanks needs at least one rank");
  RunOnThreadGrid(ranks, 1, [&](Communicator& comm, Communicator&) { fn(comm); });
}

}  // namespace kimirt
