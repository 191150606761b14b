#include "kimirt/dist/rendezvous_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <list>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/dist/rendezvous_protocol.h"

namespace kimirt {
namespace {

using rendezvous::Op;

enum class RankState { kAbsent, kJoined, kLeft, kDied };

struct Conn {
  Socket sock;
  std::string in;  // bytes received, not yet parsed
  int rank = -1;   // set by Hello
  // The request waiting for an answer, if any.
  bool waiting = false;
  Op op = Op::kHello;
  std::string key;
  uint32_t timeout_ms = 0;
  Deadline deadline;
  bool close_after_reply = false;
};

std::string JoinRanks(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

// All of the server's state; touched only by its thread.
class State {
 public:
  explicit State(int world_size)
      : world_(world_size), ranks_(static_cast<size_t>(world_size), RankState::kAbsent) {}

  std::list<Conn>& conns() { return conns_; }

  // Parses and handles every complete request in c.in.
  void Consume(Conn& c) {
    while (c.in.size() >= rendezvous::kHeaderBytes && !c.waiting && !c.close_after_reply) {
      const Op op = static_cast<Op>(c.in[0]);
      const uint32_t klen = rendezvous::GetU32(&c.in[1]);
      const uint32_t vlen = rendezvous::GetU32(&c.in[5]);
      const uint32_t timeout_ms = rendezvous::GetU32(&c.in[9]);
      if (klen > rendezvous::kMaxKeyBytes || vlen > rendezvous::kMaxValueBytes) {
        Fail(c, "request too large: key " + std::to_string(klen) + " bytes, value " + std::to_string(vlen) + " bytes");
        c.close_after_reply = true;
        return;
      }
      const size_t total = rendezvous::kHeaderBytes + klen + vlen;
      if (c.in.size() < total) return;
      std::string key = c.in.substr(rendezvous::kHeaderBytes, klen);
      std::string value = c.in.substr(rendezvous::kHeaderBytes + klen, vlen);
      c.in.erase(0, total);
      Handle(c, op, std::move(key), std::move(value), timeout_ms);
    }
  }

  // A connection closed: a rank that had not said goodbye died.
  void Closed(Conn& c) {
    if (c.rank >= 0 && ranks_[c.rank] == RankState::kJoined) ranks_[c.rank] = RankState::kDied;
  }

  // Answers every waiting request that can now be answered: satisfied, failed by a rank that is
  // gone, or past its deadline.
  void Resolve() {
    const Deadline now = Clock::now();
    // A join or barrier that timed out for one rank fails for all its waiters in the same pass:
    // they wait for the same missing ranks, and rank 0 may stop the server as soon as its own
    // answer arrives, which must not turn the others' answer into "lost the master".
    std::set<std::pair<Op, std::string>> expired;
    for (const Conn& c : conns_) {
      if (c.waiting && c.op != Op::kGet && now >= c.deadline) expired.insert({c.op, c.key});
    }
    for (Conn& c : conns_) {
      if (!c.waiting) continue;
      if (c.op == Op::kGet) {
        auto it = kv_.find(c.key);
        if (it != kv_.end()) {
          Reply(c, true, it->second);
        } else if (int d = FirstGone(RankState::kDied); d >= 0) {
          Fail(c, "rank " + std::to_string(d) + " died (its connection closed without leaving) while rank " +
                      std::to_string(c.rank) + " waited for key '" + c.key + "'");
        } else if (now >= c.deadline) {
          std::string msg = "key '" + c.key + "' was not set within " + std::to_string(c.timeout_ms) + " ms";
          if (std::vector<int> m = Missing(nullptr); !m.empty()) msg += " (" + JoinRanks(m) + " never joined)";
          Fail(c, msg);
        }
        continue;
      }
      // Hello (the join barrier) and Barrier.
      const std::vector<bool>* arrived = c.op == Op::kBarrier ? &barriers_[c.key] : nullptr;
      const std::vector<int> missing = Missing(arrived);
      const std::string what = c.op == Op::kHello ? "joining the rendezvous" : "barrier '" + c.key + "'";
      if (missing.empty()) {
        // Every rank said hello, but one that died since cannot take part: the group is broken.
        if (const int d = FirstGone(RankState::kDied); c.op == Op::kHello && d >= 0) {
          Fail(c, "rank " + std::to_string(d) + " died (its connection closed without leaving) while " + what);
        } else {
          Reply(c, true, "");
        }
        continue;
      }
      for (int r : missing) {
        if (ranks_[r] == RankState::kDied || ranks_[r] == RankState::kLeft) {
          Fail(c, "rank " + std::to_string(r) +
                      (ranks_[r] == RankState::kDied ? " died (its connection closed without leaving)"
                                                     : " left the rendezvous") +
                      " before " + what);
          break;
        }
      }
      if (c.waiting && expired.count({c.op, c.key}) != 0) {
        Fail(c, what + " timed out after " + std::to_string(c.timeout_ms) + " ms: " + JoinRanks(missing) +
                    (c.op == Op::kHello ? " did not join" : " did not arrive") + " (world size " +
                    std::to_string(world_) + ")");
      }
    }
    // A barrier every rank passed is done (names are unique per use: rendezvous_store.cpp).
    for (auto it = barriers_.begin(); it != barriers_.end();) {
      it = Missing(&it->second).empty() ? barriers_.erase(it) : std::next(it);
    }
  }

  // The earliest deadline of a waiting request, for poll's timeout.
  Deadline NextDeadline(Deadline cap) const {
    for (const Conn& c : conns_) {
      if (c.waiting) cap = std::min(cap, c.deadline);
    }
    return cap;
  }

  // Sends an answer; a connection that cannot take it is closed.
  void Reply(Conn& c, bool ok, const std::string& payload) {
    c.waiting = false;
    const std::string f = rendezvous::EncodeReply(ok, payload);
    if (!SendAll(c.sock.fd(), f.data(), f.size(), Clock::now() + std::chrono::seconds(10)).ok()) {
      Closed(c);
      c.sock.Close();
    }
  }
  void Fail(Conn& c, const std::string& msg) { Reply(c, false, msg); }

 private:
  void Handle(Conn& c, Op op, std::string key, std::string value, uint32_t timeout_ms) {
    if (op != Op::kHello && c.rank < 0) {
      Fail(c, "the first request must be Hello");
      c.close_after_reply = true;
      return;
    }
    c.key = std::move(key);
    c.op = op;
    c.timeout_ms = timeout_ms;
    c.deadline = Clock::now() + std::chrono::milliseconds(timeout_ms);
    switch (op) {
      case Op::kHello: {
        int rank = -1, world = -1;
        std::istringstream(value) >> rank >> world;
        std::string err;
        if (world != world_) {
          err = "rank " + std::to_string(rank) + " has a world of " + std::to_string(world) +
                " ranks, but rank 0 has " + std::to_string(world_) + " (WORLD_SIZE / -tp × -pp differ)";
        } else if (rank < 0 || rank >= world_) {
          err = "rank " + std::to_string(rank) + " is out of range [0, " + std::to_string(world_ - 1) + "]";
        } else if (ranks_[rank] != RankState::kAbsent) {
          err = "rank " + std::to_string(rank) + " joined twice (two processes with the same rank?)";
        }
        if (!err.empty()) {
          Fail(c, err);
          c.close_after_reply = true;
          return;
        }
        c.rank = rank;
        ranks_[rank] = RankState::kJoined;
        c.waiting = true;
        return;
      }
      case Op::kSet:
        kv_[c.key] = std::move(value);
        Reply(c, true, "");
        return;
      case Op::kGet:
        c.waiting = true;
        return;
      case Op::kBarrier: {
        std::vector<bool>& a = barriers_[c.key];
        a.resize(static_cast<size_t>(world_), false);
        a[c.rank] = true;
        c.waiting = true;
        return;
      }
      case Op::kBye:
        ranks_[c.rank] = RankState::kLeft;
        Reply(c, true, "");
        return;
    }
    Fail(c, "unknown request " + std::to_string(static_cast<int>(op)));
    c.close_after_reply = true;
  }

  // Ranks that have not arrived: at the join (arrived == nullptr: never said Hello), or at a
  // barrier.
  std::vector<int> Missing(const std::vector<bool>* arrived) const {
    std::vector<int> m;
    for (int r = 0; r < world_; ++r) {
      const bool here = arrived == nullptr ? ranks_[r] != RankState::kAbsent
                                           : (static_cast<size_t>(r) < arrived->size() && (*arrived)[r]);
      if (!here) m.push_back(r);
    }
    return m;
  }

  int FirstGone(RankState s) const {
    for (int r = 0; r < world_; ++r) {
      if (ranks_[r] == s) return r;
    }
    return -1;
  }

  const int world_;
  std::vector<RankState> ranks_;
  std::map<std::string, std::string> kv_;
  std::map<std::string, std::vector<bool>> barriers_;
  std::list<Conn> conns_;
};

}  // namespace

Result<std::unique_ptr<RendezvousServer>> RendezvousServer::Start(int port, int world_size) {
  std::unique_ptr<RendezvousServer> s(new RendezvousServer());
  s->world_size_ = world_size;
  KIMIRT_ASSIGN_OR_RETURN(s->listener_, ListenTcp(port));
  KIMIRT_ASSIGN_OR_RETURN(s->port_, LocalPort(s->listener_));
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) return IoError("pipe2 failed");
  s->wake_read_ = Socket(fds[0]);
  s->wake_write_ = Socket(fds[1]);
  s->thread_ = std::thread([p = s.get()] { p->Run(); });
  return s;
}

RendezvousServer::~RendezvousServer() {
  stop_ = true;
  const char b = 1;
  (void)!write(wake_write_.fd(), &b, 1);
  if (thread_.joinable()) thread_.join();
}

void RendezvousServer::Run() {
  State state(world_size_);
  std::list<Conn>& conns = state.conns();
  std::vector<pollfd> fds;
  std::vector<Conn*> order;
  while (!stop_) {
    fds.clear();
    order.clear();
    fds.push_back({wake_read_.fd(), POLLIN, 0});
    fds.push_back({listener_.fd(), POLLIN, 0});
    for (Conn& c : conns) {
      fds.push_back({c.sock.fd(), POLLIN, 0});
      order.push_back(&c);
    }
    const int timeout = MillisUntil(state.NextDeadline(Clock::now() + std::chrono::seconds(1)));
    const int r = poll(fds.data(), fds.size(), timeout);
    if (r < 0 && errno != EINTR) break;
    if (stop_) break;
    if (r > 0 && (fds[1].revents & POLLIN)) {
      for (;;) {
        const int fd = accept4(listener_.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) break;
        conns.emplace_back();
        conns.back().sock = Socket(fd);
      }
    }
    for (size_t i = 0; r > 0 && i < order.size(); ++i) {
      Conn& c = *order[i];
      if (fds[i + 2].revents == 0) continue;
      char buf[65536];
      for (;;) {
        const ssize_t n = recv(c.sock.fd(), buf, sizeof(buf), 0);
        if (n > 0) {
          c.in.append(buf, static_cast<size_t>(n));
          continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
          state.Closed(c);
          c.sock.Close();
        }
        break;
      }
      if (c.sock.valid()) state.Consume(c);
    }
    state.Resolve();
    conns.remove_if([](const Conn& c) { return !c.sock.valid() || (c.close_after_reply && !c.waiting); });
  }
}

}  // namespace kimirt
