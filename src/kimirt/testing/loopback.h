// 127.0.0.1 sockets for the tests that talk to a real (test) server or need a port nobody
// listens on: the address, binding to a port the kernel picks, and reading a socket's port.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdint>

namespace kimirt::testing {

// 127.0.0.1:`port` (0: any port, for bind).
inline sockaddr_in LoopbackAddress(int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  return addr;
}

// The port of socket `fd`'s own end, or with `peer` of the other end; -1 (errno set) on error.
inline int SocketPort(int fd, bool peer = false) {
  sockaddr_in addr{};
  socklen_t len = sizeof(addr);
  auto* a = reinterpret_cast<sockaddr*>(&addr);
  if ((peer ? ::getpeername(fd, a, &len) : ::getsockname(fd, a, &len)) != 0) return -1;
  return ntohs(addr.sin_port);
}

// Binds `fd` to 127.0.0.1 on a port the kernel picks and returns that port; -1 (errno set) when
// bind fails.
inline int BindLoopback(int fd) {
  const sockaddr_in addr = LoopbackAddress(0);
  if (::bind(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) != 0) return -1;
  return SocketPort(fd);
}

}  // namespace kimirt::testing
