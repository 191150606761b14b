// TcpCommunicator: the collectives of one rank per process on CPUs, over TCP sockets in a star
// around rank 0 (docs/distributed.md "Process ranks"). Rank 0 holds one connected socket per
// follower, each follower one socket to rank 0 (StarLinks). The links are shared with whoever
// drives the ranks (the process-ranks runner sends its commands on them); collectives and
// commands never interleave, since every rank runs one call at a time in the same order.
//
// Sums are computed on rank 0 in rank order ((x0 + x1) + x2) + ..., starting from x0, and sent
// back: bit for bit what the thread communicator computes (communicator.cpp), so process ranks
// give the same logits as thread ranks.
//
// No hangs: every read and write has a deadline (`timeout` per collective); a peer whose process
// died closes its socket, which ends the collective at once. Failures throw CommunicatorError
// naming the rank at fault (the Communicator interface returns nothing); a follower that fails
// on its own sends an error frame first, so rank 0's error carries the follower's message.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/dist/tcp_socket.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {

class CommunicatorError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What travels first on a link: a frame header. Collectives send {op, n} before their floats;
// the runner's commands and the error frame use the same header (ops of their own).
struct FrameHeader {
  uint32_t op = 0;
  uint32_t aux = 0;  // op-specific (e.g. the sender's rank)
  uint64_t n = 0;    // element count, or bytes of the payload that follows
};

// Frame ops the communicator itself uses; users of the links number theirs from kFrameUserBase.
enum FrameOp : uint32_t {
  kFrameAllReduce = 1,
  kFrameAllGather = 2,
  kFrameBarrier = 3,
  kFrameError = 4,  // payload: n bytes of text, the sender's failure
  kFramePointToPoint = 5,  // Send/Recv: aux the sender, n floats
  kFrameUserBase = 100,
};

// The links of one rank of a group. Collectives use those to and from rank 0 (a star); Send and
// Recv use peers[peer], so a pipeline group links every pair (a mesh; the command links of the
// process-ranks runner are a star).
struct StarLinks {
  int rank = 0;
  int size = 1;
  // Rank 0: peers[r] is the link to rank r (peers[0] unused). A follower: peers[0] is rank 0;
  // in a mesh, peers[r] the link to rank r too (peers[rank] unused).
  std::vector<Socket> peers;
  std::chrono::milliseconds timeout{300000};

  Socket& to_root() { return peers[0]; }
  Deadline deadline() const { return Clock::now() + timeout; }
};

// Sends/receives one frame on a link; errors name `peer` (the rank at the other end) and `what`.
Status SendFrame(int fd, const FrameHeader& h, const void* payload, size_t bytes, Deadline deadline);
// Receives a header; a kFrameError from the peer becomes an error carrying its text.
Result<FrameHeader> RecvHeader(int fd, int peer, const std::string& what, Deadline deadline);
// Best effort: tells rank 0 why this follower fails (before it exits).
void SendErrorFrame(StarLinks& links, const std::string& message);

// The communicator of `links.rank`; `links` must outlive it.
std::unique_ptr<Communicator> MakeTcpCommunicator(StarLinks& links);

}  // namespace kimirt
