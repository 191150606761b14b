// Communicator: the collectives tensor parallelism needs (DESIGN.md principle 4). Model code
// sees its local shard and calls all_reduce / all_gather where the math needs them.
// Implementations: one rank (no-ops), in-process threads (one thread per rank; CI proves
// TP=2/4/8 equals TP=1 on CPU with it), processes over TCP (tcp_communicator.h) and NCCL
// (nccl_communicator.h).
//
// Contract: every rank calls the same collectives in the same order with the same sizes.
// Results are bitwise identical on every rank, and deterministic: sums add the ranks'
// contributions in rank order 0, 1, ..., n-1.
//
// Point to point (pipeline parallelism, docs/distributed.md "Pipeline parallelism"): Send and
// Recv pair up between two ranks only; a rank's messages to one peer arrive in the order sent,
// and the receiver names the sender and the size it expects (a different size is an error, not
// a truncation). Send may return before the peer receives; the buffer may be reused at once.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "kimirt/core/status.h"

namespace kimirt {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0..n) := sum over ranks of data[0..n), in rank order.
  virtual void AllReduceSum(float* data, size_t n) = 0;
  // recv[r*n .. (r+1)*n) := rank r's send[0..n); recv holds size()*n floats.
  virtual void AllGather(const float* send, size_t n, float* recv) = 0;
  virtual void Barrier() = 0;
  // data[0..n) to rank `peer` (!= rank()), which takes it with Recv(.., n, rank()).
  virtual void Send(const float* data, size_t n, int peer) = 0;
  // data[0..n) := the next message rank `peer` sent to this rank.
  virtual void Recv(float* data, size_t n, int peer) = 0;
  // Where Send and Recv run apart from the work around them (an NCCL communicator on a side
  // stream: NcclOptions::side_stream), that work waits from here on for every one issued so far:
  // what reads a received buffer, or reuses a sent one, comes after Join. Elsewhere (the host,
  // or one stream) they are already in order: nothing to do.
  virtual void Join() {}

  // Failure propagation (docs/distributed.md "Faults inside a step"). Abort ends this rank's
  // collectives that wait on peers, once the caller knows the group is broken (a supervisor saw
  // a rank die): pending ones return, later ones throw `why`. Any thread may call it, while the
  // rank's own thread is inside a collective. Communicators whose collectives already fail when
  // a peer dies (threads; TCP, whose sockets close) have nothing to do.
  virtual void Abort(const std::string& why) { (void)why; }
  // Why the communicator was aborted (by Abort or a watchdog of its own); empty while it works.
  // A device collective that an abort ended leaves its output undefined without throwing (the
  // host is not inside it), so whoever completes a step checks this before trusting its outputs.
  virtual std::string aborted() const { return {}; }

  // Decode graphs at TP > 1 (Model::Launch; docs/distributed.md "Decode graphs at TP > 1"):
  // whether the collectives can be recorded into a backend's graph (CUDA stream capture) and
  // replayed with it — every rank capturing and replaying the same graphs together (NCCL).
  virtual bool CapturesInGraphs() const { return false; }
  // A replayed graph holding this communicator's collectives was launched on its stream: time it
  // as the collectives themselves are (an NCCL communicator's watchdog).
  virtual void WatchLaunched(const char* what) { (void)what; }
};

// A communicator of one rank: all collectives are copies or no-ops.
std::unique_ptr<Communicator> MakeSingleRankCommunicator();

// Runs fn(comm) on `ranks` threads, each with its own rank of one in-process group, and
// returns when all are done. Collectives block until every rank reaches them.
// Never hangs silently on misuse: if fn throws on a rank, the peers' pending and later
// collectives throw too and RunOnThreadRanks rethrows the lowest failing rank's original
// exception; ranks calling different collectives (op or size), or a rank returning while its
// peers wait in a collective, make RunOnThreadRanks throw std::logic_error.
void RunOnThreadRanks(int ranks, const std::function<void(Communicator&)>& fn);

// tp × pp thread ranks, numbered stage-major (world rank = stage · tp + tp rank; docs/
// distributed.md "Pipeline parallelism"): fn(tp_comm, pp_comm) runs on each, where tp_comm is
// the rank's stage's group (size tp, rank = its tp rank) and pp_comm the group of the ranks of
// its tp rank across the stages (size pp, rank = its stage). Failures end every group as
// RunOnThreadRanks's do; a Recv whose sender returned without sending throws std::logic_error.
void RunOnThreadGrid(int tp, int pp, const std::function<void(Communicator& tp_comm, Communicator& pp_comm)>& fn);

}  // namespace kimirt
