// NcclCommunicator: the Communicator (communicator.h) of one process per GPU, over NCCL
// (docs/distributed.md). Buffers are device pointers on `stream`, the stream the rank's backend
// issues on, so collectives are ordered with the ops around them and the host never waits.
//
// Batch invariance (issue 15 item 3, docs/architecture.md): NCCL's ring and tree all-reduce sum
// an element in an order that depends on the message size and the channel count, so a row's
// bits would depend on the other rows of the call. AllReduceSum is therefore an ncclAllGather of
// every rank's buffer followed by a sum on the device in rank order ((x0 + x1) + x2) + ... —
// each element's order is fixed, the result is bitwise the same on every rank, for every message
// size, and equal to the thread communicator's (communicator.cpp). It moves (n-1)/n more bytes
// than a ring all-reduce; at decode sizes (a few rows × hidden) latency dominates, not bytes.
// `nccl_allreduce_min_elems` lets large messages use ncclAllReduce instead (prefill), which gives
// up invariance; the default never does. Decode-sized messages on one host take the peer
// all-reduce instead (cuda/peer_all_reduce.h): the same sums in one kernel, no NCCL call.
//
// Built only with -DKIMIRT_CUDA=ON and NCCL found at configure time; otherwise the factory
// answers Unsupported.
#pragma once

#include <chrono>
#include <cstddef>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/dist/rendezvous_store.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {

struct NcclOptions {
  int device = 0;          // CUDA device index: the rank's LOCAL_RANK (launch_env.h)
  void* stream = nullptr;  // cudaStream_t; nullptr: the legacy default stream
  // NCCL's init (a peer that never initialises) and any collective not complete after this (a
  // peer stalled or died: the watchdog aborts the communicator) fail; the error names this rank
  // and the collective.
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};
  // Messages of at least this many floats use ncclAllReduce (not batch-invariant), unless the
  // peer all-reduce below takes them first (it does up to its capacity).
  size_t nccl_allreduce_min_elems = std::numeric_limits<size_t>::max();
  // Names this communicator's unique id in the store ("nccl/unique-id/<tag>"): each
  // communicator of one store (a TP group, a PP pair, a bench's second one) needs its own.
  std::string tag = "world";
  // A group of some of the store's ranks (a pipeline stage's TP group, a pipeline): this rank's
  // place in it and its size; -1: the store's rank and world size. Group rank 0 publishes the id.
  int group_rank = -1;
  int group_size = -1;
  // Send and Recv on a stream of the communicator's own, ordered against `stream`: each waits for
  // the work issued on `stream` so far, and `stream` waits for them at Join (Communicator::Join).
  // For the pipeline's logits with steps in flight (docs/distributed.md "Steps in flight"): on
  // `stream` they would queue behind the next step's activations, and a Recv posted after a Send
  // that waits for the peer's next Recv closes a cycle. Point to point only.
  bool side_stream = false;
  // Messages of up to this many floats take the peer all-reduce (cuda/peer_all_reduce.h: one
  // kernel over the GPUs' mapped memory, the same bits as the all-gather + rank-ordered sum)
  // where every rank of the group is on one host and can map the others' memory; 0, a side
  // stream, or KIMIRT_PEER_ALLREDUCE=0 keep NCCL for every size. 2^19 floats (2 MB) covers a
  // 64-row decode message at K3's width (64 × 7168).
  size_t peer_all_reduce_max_elems = size_t{1} << 19;
  // Every rank of the group on one GPU (KIMIRT_RANKS_SHARE_GPU, rank_device.h; for checking
  // correctness where one GPU is lent): no NCCL communicator (NCCL refuses two ranks on one
  // device); every all-reduce and all-gather through the peer kernel, messages past its capacity
  // in pieces (each element's rank-ordered sum is the same whatever the pieces, so the same bits
  // as the NCCL path's); Send and Recv in groups of two, each a pair's all-gather (the two ranks'
  // calls must come in one order; a receive met by a receive gives NaN).
  bool share_gpu = false;
};

// Whether this build has the NCCL communicator (else the functions below answer Unsupported).
bool NcclCommunicatorBuilt();

// Collective over the ranks of `store` (or of the group options names): rank 0 creates the NCCL unique id and publishes it
// through the store ("nccl/unique-id/<tag>"), every rank initialises its NCCL communicator on
// options.device. Errors name the rank, and NCCL's own message.
// The communicator's collectives throw std::runtime_error on an NCCL or CUDA error (the
// Communicator interface has no Status; the thread communicator throws the same way).
Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(RendezvousStore& store, const NcclOptions& options);

// End-to-end check of a group (`kimirt dist-check --device cuda`): builds the communicator on
// `device`, all-reduces `count` floats where rank r contributes r + 1 and all-gathers the ranks,
// and checks every element exactly (n(n+1)/2 is exact in float for any small n). Collective.
Status NcclSelfCheck(RendezvousStore& store, int device, size_t count);

// The peer all-reduce alone (cuda/peer_all_reduce.h, no NCCL), as `kimirt dist-check --device
// cuda --peer-only` runs it: every rank of the store on `device` — on one GPU too, which NCCL
// refuses, so the IPC path of process ranks is checked where only one GPU is lent (their kernels
// then take turns on the GPU: milliseconds a call, not the NVLink latency). Each rank
// contributes r + 1 to `count` floats, `calls` times: every element exact on every rank, every
// call. Answers Unsupported where the group cannot map each other's memory. Collective.
Status PeerAllReduceSelfCheck(RendezvousStore& store, int device, size_t count, int calls);

// All-reduce latency, this communicator's batch-invariant forms (all-gather + sum; the peer
// all-reduce where the group has it) beside ncclAllReduce, and the all-gather's (NCCL's, the
// peer one), for each message size in `counts` (floats): the mean of `iters` back-to-back calls
// on the device after warm-up (CUDA events). Collective; every rank returns its own table.
struct AllReduceTiming {
  size_t count = 0;
  double invariant_us = 0;  // ncclAllGather + rank-ordered sum
  double nccl_us = 0;       // ncclAllReduce
  double peer_us = 0;       // the peer all-reduce (0: not available to this group)
  double allgather_nccl_us = 0;  // ncclAllGather of the same message (recv: ranks × count)
  double allgather_peer_us = 0;  // the peer all-gather (0: not available)
};
Result<std::vector<AllReduceTiming>> NcclAllReduceBench(RendezvousStore& store, int device,
                                                        const std::vector<size_t>& counts, int iters);

}  // namespace kimirt
