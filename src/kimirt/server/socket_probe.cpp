// SocketProbe (socket_probe.h).
#include "kimirt/server/socket_probe.h"

#include <dirent.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <utility>

namespace kimirt {
namespace {

// getnameinfo with numeric host and port: the spelling cpp-httplib uses for remote_addr.
bool Endpoint(const sockaddr_storage& addr, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&addr), len, h, sizeof(h), s, sizeof(s),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
    return false;
  }
  *host = h;
  *port = std::atoi(s);
  return true;
}

bool Matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage addr{};
  socklen_t len = sizeof(addr);
  std::string host;
  int port = 0;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0 || !Endpoint(addr, len, &host, &port) ||
      port != remote_port || host != remote_addr) {
    return false;
  }
  len = sizeof(addr);
  return getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0 && Endpoint(addr, len, &host, &port) &&
         port == local_port && host == local_addr;
}

}  // namespace

SocketProbe::SocketProbe(std::string local_addr, int local_port, std::string remote_addr, int remote_port)
    : local_addr_(std::move(local_addr)),
      remote_addr_(std::move(remote_addr)),
      local_port_(local_port),
      remote_port_(remote_port) {}

int SocketProbe::fd() {
  if (looked_up_) return fd_;
  looked_up_ = true;
  if (local_port_ <= 0 || remote_port_ <= 0) return fd_;
  DIR* dir = opendir("/proc/self/fd");
  if (dir == nullptr) return fd_;
  const int own = dirfd(dir);
  while (const dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long n = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0' || n == own) continue;
    if (Matches(static_cast<int>(n), local_addr_, local_port_, remote_addr_, remote_port_)) {
      fd_ = static_cast<int>(n);
      break;
    }
  }
  closedir(dir);
  return fd_;
}

bool SocketProbe::Gone() {
  const int s = fd();
  if (s < 0) return false;
  pollfd p{s, POLLIN | POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  if ((p.revents & (POLLHUP | POLLERR | POLLRDHUP | POLLNVAL)) != 0) return true;
  if ((p.revents & POLLIN) == 0) return false;
  // Readable: a pipelined next request (still there) or EOF (gone).
  char c;
  const ssize_t got = recv(s, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return got == 0 || (got < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

}  // namespace kimirt
