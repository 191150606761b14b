// TcpCommunicator (tcp_communicator.h): a star around rank 0. Each collective is
//   followers: send {op, n} + their floats to rank 0, then receive the result;
//   rank 0:    receive every follower's frame in rank order, compute, send the result to each.
// Rank 0 checks every follower's {op, n} against its own, so ranks calling different collectives
// fail with an error naming both instead of exchanging garbage.
#include "kimirt/parallel/tcp_communicator.h"

#include <algorithm>
#include <cstring>

namespace kimirt {
namespace {

const char* OpName(uint32_t op) {
  switch (op) {
    case kFrameAllReduce:
      return "AllReduceSum";
    case kFrameAllGather:
      return "AllGather";
    case kFrameBarrier:
      return "Barrier";
    case kFrameError:
      return "error";
    case kFramePointToPoint:
      return "Send/Recv";
    default:
      return "a runner command";
  }
}

class TcpCommunicator final : public Communicator {
 public:
  explicit TcpCommunicator(StarLinks& links) : links_(links) {}

  int rank() const override { return links_.rank; }
  int size() const override { return links_.size; }

  void AllReduceSum(float* data, size_t n) override {
    if (size() == 1) return;
    const Deadline d = links_.deadline();
    if (rank() != 0) {
      ExchangeWithRoot(kFrameAllReduce, data, n, data, n, d);
      return;
    }
    // Rank order, from x0: ((x0 + x1) + x2) + ..., as the thread communicator sums.
    sum_.assign(data, data + n);
    peer_.resize(n);
    for (int r = 1; r < size(); ++r) {
      RecvFromFollower(r, kFrameAllReduce, n, peer_.data(), d);
      for (size_t i = 0; i < n; ++i) sum_[i] += peer_[i];
    }
    SendToFollowers(kFrameAllReduce, sum_.data(), n, d);
    if (n != 0) std::memcpy(data, sum_.data(), n * sizeof(float));
  }

  // In place (send == recv + rank*n) is allowed: a follower sends before it receives.
  void AllGather(const float* send, size_t n, float* recv) override {
    const size_t total = n * static_cast<size_t>(size());
    if (size() == 1) {
      if (n != 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
      return;
    }
    const Deadline d = links_.deadline();
    if (rank() != 0) {
      ExchangeWithRoot(kFrameAllGather, send, n, recv, total, d);
      return;
    }
    if (n != 0 && send != recv) std::memmove(recv, send, n * sizeof(float));
    for (int r = 1; r < size(); ++r) RecvFromFollower(r, kFrameAllGather, n, recv + static_cast<size_t>(r) * n, d);
    SendToFollowers(kFrameAllGather, recv, total, d);
  }

  void Barrier() override {
    if (size() == 1) return;
    const Deadline d = links_.deadline();
    if (rank() != 0) {
      ExchangeWithRoot(kFrameBarrier, nullptr, 0, nullptr, 0, d);
      return;
    }
    for (int r = 1; r < size(); ++r) RecvFromFollower(r, kFrameBarrier, 0, nullptr, d);
    SendToFollowers(kFrameBarrier, nullptr, 0, d);
  }

  // Straight on the link to `peer`: rank 0 and a follower always have one; two followers only
  // where the links are a mesh (StarLinks).
  void Send(const float* data, size_t n, int peer) override {
    const int fd = LinkTo(peer, "Send");
    FrameHeader h{kFramePointToPoint, static_cast<uint32_t>(rank()), n};
    Check(SendFrame(fd, h, data, n * sizeof(float), links_.deadline()), peer, kFramePointToPoint);
  }

  void Recv(float* data, size_t n, int peer) override {
    const int fd = LinkTo(peer, "Recv");
    const Deadline d = links_.deadline();
    Result<FrameHeader> h = RecvHeader(fd, peer, "Recv", d);
    Check(h.status(), peer, kFramePointToPoint);
    if (h->op != kFramePointToPoint || h->n != n) {
      Fail("receives " + std::to_string(n) + " floats from rank " + std::to_string(peer) + ", which sent " +
           OpName(h->op) + "(n=" + std::to_string(h->n) + ")");
    }
    if (n != 0) Check(RecvAll(fd, data, n * sizeof(float), d), peer, kFramePointToPoint);
  }

 private:
  [[noreturn]] void Fail(const std::string& message) const {
    throw CommunicatorError("process rank " + std::to_string(rank()) + " of " + std::to_string(size()) + ": " + message);
  }
  void Check(const Status& s, int peer, uint32_t op) const {
    if (!s.ok()) Fail(std::string(OpName(op)) + " with rank " + std::to_string(peer) + ": " + s.message());
  }

  void ExchangeWithRoot(uint32_t op, const float* send, size_t n, float* recv, size_t recv_n, Deadline d) {
    const int fd = links_.to_root().fd();
    FrameHeader h{op, static_cast<uint32_t>(rank()), n};
    Check(SendFrame(fd, h, send, n * sizeof(float), d), 0, op);
    Result<FrameHeader> back = RecvHeader(fd, 0, OpName(op), d);
    Check(back.status(), 0, op);
    if (back->op != op || back->n != recv_n) {
      Fail(std::string("rank 0 answered ") + OpName(back->op) + "(n=" + std::to_string(back->n) + ") to " +
           OpName(op) + " (every rank must call the same collectives in the same order)");
    }
    if (recv_n != 0) Check(RecvAll(fd, recv, recv_n * sizeof(float), d), 0, op);
  }

  int LinkTo(int peer, const char* what) const {
    if (peer < 0 || peer >= size() || peer == rank()) {
      Fail(std::string(what) + ": no peer rank " + std::to_string(peer));
    }
    const size_t k = static_cast<size_t>(peer);
    if (k >= links_.peers.size() || !links_.peers[k].valid()) {
      Fail(std::string(what) + ": no link to rank " + std::to_string(peer) +
           " (a star around rank 0 links each follower to rank 0 only)");
    }
    return links_.peers[k].fd();
  }

  void RecvFromFollower(int r, uint32_t op, size_t n, float* dst, Deadline d) {
    const int fd = links_.peers[static_cast<size_t>(r)].fd();
    Result<FrameHeader> h = RecvHeader(fd, r, OpName(op), d);
    Check(h.status(), r, op);
    if (h->op != op || h->n != n) {
      Fail(std::string("rank 0 called ") + OpName(op) + "(n=" + std::to_string(n) + "), rank " + std::to_string(r) +
           " called " + OpName(h->op) + "(n=" + std::to_string(h->n) +
           ") (every rank must call the same collectives in the same order with the same sizes)");
    }
    if (n != 0) Check(RecvAll(fd, dst, n * sizeof(float), d), r, op);
  }

  void SendToFollowers(uint32_t op, const float* data, size_t n, Deadline d) {
    for (int r = 1; r < size(); ++r) {
      FrameHeader h{op, 0, n};
      Check(SendFrame(links_.peers[static_cast<size_t>(r)].fd(), h, data, n * sizeof(float), d), r, op);
    }
  }

  StarLinks& links_;
  std::vector<float> sum_, peer_;  // reused: no allocation per collective once warm
};

}  // namespace

Status SendFrame(int fd, const FrameHeader& h, const void* payload, size_t bytes, Deadline deadline) {
  KIMIRT_RETURN_IF_ERROR(SendAll(fd, &h, sizeof(h), deadline));
  if (bytes != 0) KIMIRT_RETURN_IF_ERROR(SendAll(fd, payload, bytes, deadline));
  return Status::Ok();
}

Result<FrameHeader> RecvHeader(int fd, int peer, const std::string& what, Deadline deadline) {
  FrameHeader h;
  Status s = RecvAll(fd, &h, sizeof(h), deadline);
  if (!s.ok()) {
    return IoError("rank " + std::to_string(peer) + " failed or died (" + s.message() + ") in " + what);
  }
  if (h.op == kFrameError) {
    std::string text(std::min<uint64_t>(h.n, 1 << 20), '\0');
    if (!RecvAll(fd, text.data(), text.size(), deadline).ok()) text = "(its message was cut off)";
    return Internal("rank " + std::to_string(peer) + " failed: " + text);
  }
  return h;
}

void SendErrorFrame(StarLinks& links, const std::string& message) {
  if (links.rank == 0 || links.peers.empty() || !links.to_root().valid()) return;
  FrameHeader h{kFrameError, static_cast<uint32_t>(links.rank), message.size()};
  (void)SendFrame(links.to_root().fd(), h, message.data(), message.size(), Clock::now() + std::chrono::seconds(2));
}

std::unique_ptr<Communicator> MakeTcpCommunicator(StarLinks& links) {
  return std::make_unique<TcpCommunicator>(links);
}

}  // namespace kimirt
