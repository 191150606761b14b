// SocketProbe: tells whether the peer of one accepted TCP connection has hung up, knowing only
// the connection's address pair. cpp-httplib 0.11 (Debian 12) hands handlers no socket and no
// "closed" signal; a non-streamed generation would otherwise run to max_tokens for nobody
// (issue "Engine and server": a dropped connection frees its work).
//
// The socket is found once, lazily, among this process's descriptors (Linux /proc/self/fd) as
// the one whose local and peer addresses both match; a TCP 4-tuple names one live connection,
// and the connection's descriptor stays open while its handler runs. Gone() is then one
// non-blocking poll: EOF, an error or a hang-up on the socket means the client left. A peer that
// only shut down its sending side also reads as gone (as in vLLM and SGLang, whose ASGI servers
// report http.disconnect on EOF). If the socket cannot be found, Gone() is always false.
//
// Thread safety: one thread at a time (the connection's handler).
#pragma once

#include <string>

namespace kimirt {

class SocketProbe {
 public:
  // Addresses as numeric host strings ("127.0.0.1", "::1") and ports, as cpp-httplib reports them.
  SocketProbe(std::string local_addr, int local_port, std::string remote_addr, int remote_port);
  bool Gone();
  // The descriptor found (-1 if none); looks it up on first use. For tests.
  int fd();

 private:
  std::string local_addr_, remote_addr_;
  int local_port_, remote_port_;
  bool looked_up_ = false;
  int fd_ = -1;
};

}  // namespace kimirt
