#include "kimirt/dist/tcp_socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace kimirt {
namespace {

std::string Errno(const std::string& what) { return what + ": " + std::strerror(errno); }

Status SetNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) return IoError(Errno("fcntl(O_NONBLOCK)"));
  return Status::Ok();
}

// Waits until fd is ready for `events` or the deadline passes.
Status WaitFor(int fd, short events, Deadline deadline, const char* what) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int r = poll(&p, 1, MillisUntil(deadline));
    if (r > 0) return Status::Ok();
    if (r == 0) return IoError(std::string("timed out ") + what);
    if (errno != EINTR) return IoError(Errno(std::string("poll while ") + what));
  }
}

// One connection attempt, bounded by the deadline; errno-style result in *err on failure.
Result<Socket> TryConnect(const sockaddr_in& addr, Deadline deadline, int* err) {
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return IoError(Errno("socket"));
  KIMIRT_RETURN_IF_ERROR(SetNonBlocking(s.fd()));
  *err = 0;
  if (connect(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      return IoError(Errno("connect"));
    }
    pollfd p{s.fd(), POLLOUT, 0};
    const int r = poll(&p, 1, std::min(MillisUntil(deadline), 1000));
    if (r <= 0) {
      *err = r == 0 ? ETIMEDOUT : errno;
      return IoError("connect timed out");
    }
    socklen_t len = sizeof(*err);
    getsockopt(s.fd(), SOL_SOCKET, SO_ERROR, err, &len);
    if (*err != 0) return IoError(std::string("connect: ") + std::strerror(*err));
  }
  const int one = 1;
  setsockopt(s.fd(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return s;
}

}  // namespace

Socket& Socket::operator=(Socket&& o) noexcept {
  if (this != &o) {
    Close();
    fd_ = o.fd_;
    o.fd_ = -1;
  }
  return *this;
}

void Socket::Close() {
  if (fd_ >= 0) close(fd_);
  fd_ = -1;
}

int MillisUntil(Deadline deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
}

Result<Socket> ListenTcp(int port) {
  Socket s(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s.valid()) return IoError(Errno("socket"));
  const int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (bind(s.fd(), reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) {
    return IoError(Errno("bind to port " + std::to_string(port)));
  }
  if (listen(s.fd(), 1024) != 0) return IoError(Errno("listen on port " + std::to_string(port)));
  KIMIRT_RETURN_IF_ERROR(SetNonBlocking(s.fd()));
  return s;
}

Result<int> LocalPort(const Socket& s) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  if (getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len) != 0) return IoError(Errno("getsockname"));
  return static_cast<int>(ntohs(addr.sin_port));
}

Result<int> PickFreePort() {
  KIMIRT_ASSIGN_OR_RETURN(Socket s, ListenTcp(0));
  return LocalPort(s);
}

Result<Socket> ConnectTcp(const std::string& host, int port, Deadline deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  // Name resolution is retried too: a node's DNS entry may appear late in a fresh allocation.
  std::string last;
  for (;;) {
    const int rc = getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc == 0) {
      sockaddr_in addr = *reinterpret_cast<const sockaddr_in*>(res->ai_addr);
      freeaddrinfo(res);
      addr.sin_port = htons(static_cast<uint16_t>(port));
      int err = 0;
      Result<Socket> s = TryConnect(addr, deadline, &err);
      if (s.ok()) return s;
      last = s.status().message();
      // Refused (no listener yet), unreachable or timed out: retry; anything else is final.
      if (err != ECONNREFUSED && err != ETIMEDOUT && err != EHOSTUNREACH && err != ENETUNREACH &&
          err != ECONNRESET && err != ECONNABORTED) {
        return s.status();
      }
    } else {
      last = std::string("cannot resolve host: ") + gai_strerror(rc);
      if (rc != EAI_AGAIN && rc != EAI_NONAME && rc != EAI_FAIL) return IoError(last);
    }
    if (Clock::now() >= deadline) return IoError(last);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min(100, MillisUntil(deadline))));
  }
}

Result<Socket> AcceptTcp(const Socket& listener, Deadline deadline) {
  for (;;) {
    const int fd = accept4(listener.fd(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) {
      const int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      return Socket(fd);
    }
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) {
      KIMIRT_RETURN_IF_ERROR(WaitFor(listener.fd(), POLLIN, deadline, "accepting"));
      continue;
    }
    return IoError(Errno("accept"));
  }
}

Status SendAll(int fd, const void* data, size_t n, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
    if (w > 0) {
      p += w;
      n -= static_cast<size_t>(w);
    } else if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      KIMIRT_RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline, "sending"));
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && (errno == EPIPE || errno == ECONNRESET)) {
      return IoError("connection closed");
    } else {
      return IoError(Errno("send"));
    }
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = recv(fd, p, n, 0);
    if (r > 0) {
      p += r;
      n -= static_cast<size_t>(r);
    } else if (r == 0 || (r < 0 && errno == ECONNRESET)) {
      return IoError("connection closed");
    } else if (errno == EAGAIN || errno == EWOULDBLOCK) {
      KIMIRT_RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline, "waiting for an answer"));
    } else if (errno != EINTR) {
      return IoError(Errno("recv"));
    }
  }
  return Status::Ok();
}

}  // namespace kimirt
