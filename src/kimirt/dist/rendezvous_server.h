// The rendezvous store's server: a thread in rank 0's process (rendezvous_store.h) that holds the
// key-value map and the barriers, and knows which rank is behind each connection, so that every
// failure it reports names a rank: one that never joined, never reached a barrier, or whose
// connection closed without saying goodbye (the process died).
#pragma once

#include <atomic>
#include <memory>
#include <thread>

#include "kimirt/core/status.h"
#include "kimirt/dist/tcp_socket.h"

namespace kimirt {

class RendezvousServer {
 public:
  // Listens on `port` (0: any; see port()) on every IPv4 interface and serves `world_size` ranks.
  static Result<std::unique_ptr<RendezvousServer>> Start(int port, int world_size);
  ~RendezvousServer();  // stops the thread; open connections close (peers see "connection closed")

  int port() const { return port_; }

 private:
  RendezvousServer() = default;
  void Run();

  int port_ = 0;
  int world_size_ = 0;
  Socket listener_;
  Socket wake_read_, wake_write_;  // a pipe: the destructor's stop signal to poll()
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace kimirt
