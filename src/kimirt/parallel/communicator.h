// Communicator: the collectives tensor parallelism needs (DESIGN.md principle 4). Model code
// sees its local shard and calls all_reduce / all_gather where the math needs them.
// Implementations: one rank (no-ops), in-process threads (one thread per rank; CI proves
// TP=2/4/8 equals TP=1 on CPU with it), and NCCL (later).
//
// Contract: every rank calls the same collectives in the same order with the same sizes.
// Results are bitwise identical on every rank, and deterministic: sums add the ranks'
// contributions in rank order 0, 1, ..., n-1.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>

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

}  // namespace kimirt
