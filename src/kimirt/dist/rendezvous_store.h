// RendezvousStore: how the ranks of one run find each other and exchange small byte blobs — the
// NCCL unique id (ncclGetUniqueId's 128 bytes) before the communicator exists, later the step
// plan — over TCP, like torch.distributed's TCPStore. Rank 0 runs the server
// (rendezvous_server.h) on MASTER_PORT on every interface; every rank, rank 0 included, is a
// client of it.
//
// Every operation is bounded by options.timeout, and failures name the rank at fault:
//   - a rank that never starts: the others' Join fails with "rank 3 did not join";
//   - a rank that never reaches a barrier: "barrier 'x' timed out ...: rank 3 did not arrive";
//   - a rank whose process dies (its socket closes without Bye): every waiting and later
//     barrier or unanswered Get fails at once with "rank 3 died";
//   - rank 0 dying or hanging: the others fail with "lost the rendezvous master (rank 0 ...)".
// After a failure the store is broken: every later call returns the first error.
//
// Not thread-safe: one store per rank, used by one thread at a time. Rank 0's store is the server,
// so rank 0 should destroy its store last (end with a Barrier).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "kimirt/core/status.h"
#include "kimirt/dist/tcp_socket.h"

namespace kimirt {

class RendezvousServer;

struct RendezvousOptions {
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // rank 0 may pass 0 (the kernel picks; see port()); the others may not
  int rank = 0;
  int world_size = 1;
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // each operation, Join included
};

class RendezvousStore {
 public:
  // Connects (retrying until the master listens) and returns once every rank has joined.
  static Result<std::unique_ptr<RendezvousStore>> Join(const RendezvousOptions& options);
  ~RendezvousStore();  // says goodbye (a clean leave, not a death); rank 0 stops the server

  int rank() const { return o_.rank; }
  int world_size() const { return o_.world_size; }
  int port() const { return o_.master_port; }  // the master's port (rank 0's actual one)

  Status Set(std::string_view key, std::string_view value);
  // The value some rank set, waiting for it until the timeout.
  Result<std::string> Get(std::string_view key);
  // Returns when every rank has called Barrier the same number of times. `name` is for errors;
  // ranks calling barriers of different names meet at neither (the timeout names the missing).
  Status Barrier(std::string_view name);

 private:
  RendezvousStore() = default;
  // One request and its answer; an error breaks the store.
  Result<std::string> Call(uint8_t op, std::string_view key, std::string_view value);
  std::string Master() const;

  RendezvousOptions o_;
  std::unique_ptr<RendezvousServer> server_;  // rank 0 only
  Socket sock_;
  Status broken_;
  uint64_t barriers_ = 0;
};

}  // namespace kimirt
