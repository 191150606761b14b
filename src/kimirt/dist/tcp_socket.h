// TCP sockets with deadlines, for the rendezvous store (rendezvous_store.h): every wait is bounded
// (poll with a timeout), so a peer that never answers ends in an error, never a hang. IPv4.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "kimirt/core/status.h"

namespace kimirt {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

// Owns a file descriptor; closes it on destruction.
class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  Socket(Socket&& o) noexcept : fd_(o.fd_) { o.fd_ = -1; }
  Socket& operator=(Socket&& o) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;
  ~Socket() { Close(); }

  int fd() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Close();

 private:
  int fd_ = -1;
};

// A non-blocking listening socket on every IPv4 interface; port 0 lets the kernel choose.
Result<Socket> ListenTcp(int port);
Result<int> LocalPort(const Socket& s);
// A port that was free a moment ago (bind to 0, read it, close): for a launcher choosing the
// master port of its own children. Another process could take it in between; the master's
// ListenTcp then fails loudly.
Result<int> PickFreePort();

// Connects to host:port, retrying refused or unreachable attempts until `deadline` (the master
// may start after us). The socket is non-blocking, TCP_NODELAY.
Result<Socket> ConnectTcp(const std::string& host, int port, Deadline deadline);

// One connection from a listening socket (ListenTcp), waiting until `deadline` (then an error
// "timed out accepting"). The socket is non-blocking, TCP_NODELAY.
Result<Socket> AcceptTcp(const Socket& listener, Deadline deadline);

// Whole buffers, or an error: the deadline passed, the peer closed the connection ("connection
// closed"), or the OS refused.
Status SendAll(int fd, const void* data, size_t n, Deadline deadline);
Status RecvAll(int fd, void* data, size_t n, Deadline deadline);

// Milliseconds until `deadline` (0 when past), capped for poll().
int MillisUntil(Deadline deadline);

}  // namespace kimirt
