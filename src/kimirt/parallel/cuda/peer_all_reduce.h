// PeerAllReduce: a one-shot all-reduce (and all-gather) over the GPUs of one host through each
// other's memory (CUDA IPC over NVLink), for the small messages of decode (issue 15 item 3;
// docs/distributed.md "The peer all-reduce"). vLLM's custom all-reduce and TensorRT-LLM's
// one-shot kernel are the idea; the sum order is ours:
//
//   1. every rank copies its message into a buffer of its own that every peer has mapped;
//   2. the ranks meet at a barrier of flags, block b of each rank with block b of every other
//      (a flag a block a peer in each rank's memory, written by the peer with a release store);
//   3. every rank sums all ranks' copies of its block's slice in rank order,
//      ((x0 + x1) + x2) + ..., each element alone — the bits of the NCCL path's ncclAllGather +
//      RankOrderedSum (nccl_communicator.cu) and of the thread communicator, for every message
//      size: batch invariance holds whichever path a size takes.
//
// One kernel and one barrier a call, no NCCL call and no second kernel: at decode sizes the
// NCCL path's latency (an all-gather's launch and protocol, then the sum kernel) is what a
// TP step pays per layer.
//
// Reuse: a rank's buffer has two halves, taken by the call's parity. Call k + 2 rewrites call
// k's half only after every peer arrived at call k + 1's barrier — which a peer's kernel reaches
// only after its call-k kernel ended (kernels on one stream run in order), reads included. The
// parity and the barrier's epoch come from per-block counters in device memory, so a call
// captured in a CUDA graph advances them on every replay, as every rank's replays must (the
// ranks issue the same calls in the same order, the Communicator contract).
//
// A peer that never arrives: the waiting blocks poll an abort word in mapped host memory, so
// Abort (the communicator's watchdog or a supervisor) ends them and the stream drains; the
// call's output is then undefined, as an aborted NCCL collective's.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/dist/rendezvous_store.h"

namespace kimirt {

constexpr int kPeerMaxRanks = 8;
// Blocks a call, fixed: block b of every rank meets block b of the others, so every call must
// launch the same blocks for the counters to stay in step. 32: enough loads in flight for a
// 64-row K3 message (1.8 MB a rank, 8 ranks' copies) by the estimate, a small barrier; not
// tuned (no two-GPU machine has run it yet).
constexpr int kPeerBlocks = 32;

// What one rank's kernel reads: every rank's region as this process maps it. A region is the two
// halves of `capacity` floats each, then the flags [kPeerBlocks][kPeerMaxRanks] (u32: the epoch
// peer r's block b last arrived at), then the counters [kPeerBlocks] (u32: this rank's block b's
// last epoch).
struct PeerAllReduceArgs {
  float* buffers[kPeerMaxRanks] = {};
  uint32_t* flags[kPeerMaxRanks] = {};
  uint32_t* counters = nullptr;
  const uint32_t* abort = nullptr;  // device view of a mapped host word: nonzero ends the waits
  int rank = 0;
  int ranks = 0;
  size_t capacity = 0;  // floats in each half
};

// Bytes of one rank's region for messages of up to `capacity` floats.
size_t PeerRegionBytes(size_t capacity);
// Rank `rank`'s arguments over the regions regions[0 .. ranks) (each rank's, as mapped here; the
// regions zeroed before any rank's first call).
PeerAllReduceArgs PeerArgsOf(std::span<void* const> regions, int rank, size_t capacity, const uint32_t* abort);
// data[0 .. n) := the rank-ordered sum over the ranks of theirs, on `s`; n ≤ a.capacity. Every
// rank must make the same calls (the same n) in the same order.
cudaError_t LaunchPeerAllReduce(const PeerAllReduceArgs& a, float* data, size_t n, cudaStream_t s);
// recv[r·n .. (r+1)·n) := rank r's send[0 .. n), on `s`; n ≤ a.capacity; in place where send is
// recv + rank·n. The same barrier and halves as the all-reduce (the calls of both kinds share the
// epochs: every rank makes the same calls of either kind in the same order).
cudaError_t LaunchPeerAllGather(const PeerAllReduceArgs& a, const float* send, size_t n, float* recv,
                                cudaStream_t s);

// The IPC plumbing around the kernel, for one communicator of one process per GPU.
class PeerAllReduce {
 public:
  // Collective over a group of the store's ranks (`rank` of `ranks`, keys under "peer-ar/<tag>/"):
  // each rank allocates its region on the current device, publishes its IPC handle with its
  // host's identity, and maps every peer's. Answers nullptr on every rank alike — the caller then
  // keeps its NCCL path — where the ranks are not all on one host or some rank cannot map a
  // peer's memory (no peer access between the GPUs); `why_not` says which. Errors: the store's,
  // CUDA's allocating the region.
  static Result<std::unique_ptr<PeerAllReduce>> Make(RendezvousStore& store, const std::string& tag, int rank,
                                                     int ranks, size_t capacity, std::string* why_not = nullptr);
  ~PeerAllReduce();
  PeerAllReduce(const PeerAllReduce&) = delete;
  PeerAllReduce& operator=(const PeerAllReduce&) = delete;

  size_t capacity() const { return args_.capacity; }
  cudaError_t Launch(float* data, size_t n, cudaStream_t s) const { return LaunchPeerAllReduce(args_, data, n, s); }
  cudaError_t LaunchGather(const float* send, size_t n, float* recv, cudaStream_t s) const {
    return LaunchPeerAllGather(args_, send, n, recv, s);
  }
  // Ends every wait of this rank's calls, now and later (any thread).
  void Abort();
  // This rank's counters (the epoch each block last finished) and the flags its peers wrote (the
  // epoch each peer's block last arrived at), copied while kernels may still run: what a test
  // prints when its ranks stop making progress. A line saying why where the copy fails.
  std::string DescribeState() const;

 private:
  PeerAllReduce() = default;
  PeerAllReduceArgs args_;
  void* region_ = nullptr;           // this rank's (cudaMalloc)
  std::vector<void*> mapped_;        // the peers' (cudaIpcOpenMemHandle)
  uint32_t* abort_host_ = nullptr;   // cudaHostAlloc, mapped
};

}  // namespace kimirt
