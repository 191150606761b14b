// NcclCommunicator (nccl_communicator.h): NCCL init from the rendezvous store's unique id, with
// a deadline (non-blocking communicator, polled); the batch-invariant all-reduce (the peer
// all-reduce for decode sizes on one host, else ncclAllGather then RankOrderedSum below); a
// watchdog that aborts a collective stalled past the deadline.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/dist/tcp_socket.h"
#include "kimirt/parallel/cuda/peer_all_reduce.h"
#include "kimirt/parallel/nccl_communicator.h"

namespace kimirt {
namespace {

// out[i] := ((g[0][i] + g[1][i]) + g[2][i]) + ... with g[r] = gathered + r*n: rank order, the
// same bits on every rank and for every n (each element is summed alone). Starting from g[0]
// (not 0.0f) keeps a lone -0.0f, as the thread communicator does.
__global__ void RankOrderedSum(const float* __restrict__ gathered, size_t n, int ranks, float* __restrict__ out) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    float s = gathered[i];
    for (int r = 1; r < ranks; ++r) s = __fadd_rn(s, gathered[static_cast<size_t>(r) * n + i]);
    out[i] = s;
  }
}

// The tag of a sender's piece in SharedPointToPoint (a float's bits, set by a byte memset).
constexpr uint32_t kSentTag = 0x01010101u;

// The receiver's piece of a pair's all-gather (NcclCommunicator::SharedPointToPoint): the sender's
// c floats at `slot`, or NaN where the tag after them says the peer was not sending (its calls out
// of step with this rank's).
__global__ void TakePiece(const float* __restrict__ slot, size_t c, float* __restrict__ out) {
  const bool sent = __float_as_uint(slot[c]) == kSentTag;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < c;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    out[i] = sent ? slot[i] : __int_as_float(0x7fc00000);
  }
}

std::string NcclMessage(ncclResult_t r, ncclComm_t comm) {
  std::string m = ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);  // comm may be null: then the thread's last error
  if (last != nullptr && *last != '\0') m += ": " + std::string(last);
  return m;
}

// Timeouts on collectives: every collective records an event on the stream after it; a watchdog
// thread polls the oldest one, and one that has not completed within options.timeout (a peer
// stalled or died inside a collective), or an asynchronous NCCL error, aborts the communicator:
// NCCL's kernels then return, the stream drains, and this rank's next collective throws, naming
// the one that stalled. The host never blocks inside a collective, so the watchdog is the only
// place a hang can be seen before the backend's next download would wait on it forever.
// call_mu_ keeps ncclCommAbort (watchdog) and NCCL calls (the rank's thread) apart: after an
// abort the communicator handle is gone.
class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size, const NcclOptions& o, std::unique_ptr<PeerAllReduce> peer)
      : comm_(comm),
        rank_(rank),
        size_(size),
        o_(o),
        stream_(static_cast<cudaStream_t>(o.stream)),
        peer_(std::move(peer)) {
    if (o.side_stream) {
      // The communicator's calls go on a stream of its own, ordered against the user's
      // (NcclOptions::side_stream): two events, re-recorded for every call.
      order_ = stream_;
      CheckCuda(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate (side stream)");
      CheckCuda(cudaEventCreateWithFlags(&to_side_, cudaEventDisableTiming), "cudaEventCreate");
      CheckCuda(cudaEventCreateWithFlags(&from_side_, cudaEventDisableTiming), "cudaEventCreate");
    }
    watchdog_ = std::thread([this] { Watch(); });
  }

  ~NcclCommunicator() override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    watchdog_.join();
    // A broken communicator is aborted first, so its kernels return and the stream can drain.
    // Finalize flushes outstanding work; one that cannot finalize in time (a peer is gone) is
    // aborted instead.
    if (!aborted_ && broken_) AbortLocked("");
    if (!aborted_ && comm_ != nullptr) {
      const ncclResult_t f = ncclCommFinalize(comm_);
      if ((f != ncclSuccess && f != ncclInProgress) || !Wait(std::chrono::seconds(30)).empty()) AbortLocked("");
    }
    if (!aborted_ && comm_ != nullptr) ncclCommDestroy(comm_);
    retired_.push_back({scratch_, scratch_async_});
    cudaStreamSynchronize(stream_);
    // A healthy group's peer regions go after a last barrier of every rank's (~PeerAllReduce); an
    // aborted one's at once.
    peer_.reset();
    for (const Buffer& b : retired_) {
      if (b.p != nullptr) b.stream_ordered ? cudaFreeAsync(b.p, stream_) : cudaFree(b.p);
    }
    cudaStreamSynchronize(stream_);
    for (const Pending& p : pending_) cudaEventDestroy(p.event);
    for (cudaEvent_t e : free_events_) cudaEventDestroy(e);
    if (order_ != nullptr) {
      cudaEventDestroy(to_side_);
      cudaEventDestroy(from_side_);
      cudaStreamDestroy(stream_);
    }
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  bool has_peer_all_reduce() const { return peer_ != nullptr; }

  void AllReduceSum(float* data, size_t n) override {
    if (n == 0 || Alone()) return;  // the sum is the message
    if (peer_ != nullptr && (n <= peer_->capacity() || comm_ == nullptr)) {
      // Ranks sharing a GPU (no NCCL): larger messages in pieces of the capacity.
      Enqueue("peer all-reduce", Capturing(), [&] {
        for (size_t off = 0; off < n; off += peer_->capacity()) {
          CheckCuda(peer_->Launch(data + off, std::min(peer_->capacity(), n - off), stream_), "peer all-reduce launch");
        }
        return ncclSuccess;
      });
      return;
    }
    if (n >= o_.nccl_allreduce_min_elems) {
      Enqueue("ncclAllReduce", Capturing(),
              [&] { return ncclAllReduce(data, data, n, ncclFloat32, ncclSum, comm_, stream_); });
      return;
    }
    const bool capturing = Capturing();
    float* g = Scratch(n * static_cast<size_t>(size_), capturing);
    Enqueue("ncclAllGather (all-reduce)", capturing,
            [&] { return ncclAllGather(data, g, n, ncclFloat32, comm_, stream_); });
    const int threads = 256;
    const size_t blocks = std::min<size_t>((n + threads - 1) / threads, 1024);
    RankOrderedSum<<<static_cast<unsigned>(blocks), threads, 0, stream_>>>(g, n, size_, data);
    CheckCuda(cudaGetLastError(), "RankOrderedSum launch");
  }

  void AllGather(const float* send, size_t n, float* recv) override {
    if (n == 0) return;
    if (Alone()) {
      if (recv != send) CheckCuda(cudaMemcpyAsync(recv, send, n * sizeof(float), cudaMemcpyDeviceToDevice, stream_), "copy");
      return;
    }
    if (peer_ != nullptr && n <= peer_->capacity()) {
      Enqueue("peer all-gather", Capturing(), [&] {
        CheckCuda(peer_->LaunchGather(send, n, recv, stream_), "peer all-gather launch");
        return ncclSuccess;
      });
      return;
    }
    if (comm_ == nullptr) {
      // Ranks sharing a GPU: pieces of the capacity gathered into the scratch, each rank's piece
      // then copied to its place in recv (rank r's message at recv + r·n). In place, a rank's own
      // piece lands where it was.
      const size_t cap = peer_->capacity();
      const bool capturing = Capturing();
      float* g = Scratch(cap * static_cast<size_t>(size_), capturing);
      Enqueue("peer all-gather (pieces)", capturing, [&] {
        for (size_t off = 0; off < n; off += cap) {
          const size_t c = std::min(cap, n - off);
          CheckCuda(peer_->LaunchGather(send + off, c, g, stream_), "peer all-gather launch");
          CheckCuda(cudaMemcpy2DAsync(recv + off, n * sizeof(float), g, c * sizeof(float), c * sizeof(float),
                                      static_cast<size_t>(size_), cudaMemcpyDeviceToDevice, stream_),
                    "peer all-gather copy");
        }
        return ncclSuccess;
      });
      return;
    }
    Enqueue("ncclAllGather", Capturing(), [&] { return ncclAllGather(send, recv, n, ncclFloat32, comm_, stream_); });
  }

  // Point to point on the stream, each call a group of its own (a non-blocking communicator
  // may answer ncclGroupEnd with ncclInProgress: Check waits). Stream-ordered like the
  // collectives: the host does not wait for the peer, the stream does.
  // With a side stream (NcclOptions::side_stream), each call first waits on the side stream for
  // the work issued on the user's stream so far (what a Send reads, the buffer a Recv fills, is
  // made there); the user's stream waits for them at Join.
  void Send(const float* data, size_t n, int peer) override {
    if (comm_ == nullptr) return SharedPointToPoint("peer send", const_cast<float*>(data), n, peer, true);
    SideWaitsForOrder();
    PointToPoint("ncclSend", n, peer, [&] { return ncclSend(data, n, ncclFloat32, peer, comm_, stream_); });
  }

  void Recv(float* data, size_t n, int peer) override {
    if (comm_ == nullptr) return SharedPointToPoint("peer recv", data, n, peer, false);
    SideWaitsForOrder();
    PointToPoint("ncclRecv", n, peer, [&] { return ncclRecv(data, n, ncclFloat32, peer, comm_, stream_); });
  }

  void Join() override {
    if (order_ == nullptr) return;
    CheckCuda(cudaEventRecord(from_side_, stream_), "cudaEventRecord (side stream)");
    CheckCuda(cudaStreamWaitEvent(order_, from_side_, 0), "cudaStreamWaitEvent (user stream)");
  }

  // NCCL's collectives can be captured into a CUDA graph (NCCL >= 2.9): every rank must capture
  // the same collectives and replay the graphs together (Model::Launch agrees on that first).
  bool CapturesInGraphs() const override { return true; }

  // A graph holding this communicator's collectives was launched on its stream.
  void WatchLaunched(const char* what) override {
    std::lock_guard<std::mutex> call_lock(call_mu_);
    ThrowIfAborted();
    Track(what);
  }

  // From another thread (the runner's supervisor saw a peer die): NCCL's kernels waiting on the
  // peer return and the stream drains at once, instead of at the watchdog's timeout. call_mu_
  // waits out an NCCL call the rank's thread is making (never a wait on the device); a call
  // waiting on a peer inside NCCL (WaitCall) sees the request and aborts itself.
  void Abort(const std::string& why) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      requested_reason_ = why;
    }
    abort_requested_ = true;
    std::lock_guard<std::mutex> call_lock(call_mu_);
    AbortLocked(why);
  }

  std::string aborted() const override {
    if (!aborted_) return {};
    std::lock_guard<std::mutex> lock(mu_);
    return abort_reason_;
  }

  // A one-float all-reduce, then the stream drained; the watchdog turns a peer that never
  // arrives into an abort, seen here.
  void Barrier() override {
    float* one = Scratch(static_cast<size_t>(size_), false);  // a barrier waits: never captured
    if (Alone()) {
      // Nothing to meet: the stream drained below.
    } else if (comm_ == nullptr) {
      Enqueue("peer all-reduce (Barrier)", false, [&] {
        CheckCuda(peer_->Launch(one, 1, stream_), "peer all-reduce launch");
        return ncclSuccess;
      });
    } else {
      Enqueue("ncclAllReduce (Barrier)", false,
              [&] { return ncclAllReduce(one, one, 1, ncclFloat32, ncclSum, comm_, stream_); });
    }
    for (;;) {
      const cudaError_t e = cudaStreamQuery(stream_);
      ThrowIfAborted();
      if (e == cudaSuccess) return;
      if (e != cudaErrorNotReady) CheckCuda(e, "Barrier");
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  }

 private:
  struct Pending {
    cudaEvent_t event;
    Deadline deadline;
    const char* what;
  };

  // Issues one NCCL call (under call_mu_, so the watchdog cannot abort in the middle) and
  // records the event the watchdog waits for — unless the stream is being captured into a graph
  // (`capturing`: Capturing()): nothing runs then, and the graph's launches are watched instead
  // (WatchLaunched).
  template <typename F>
  void Enqueue(const char* what, bool capturing, F&& call) {
    std::lock_guard<std::mutex> call_lock(call_mu_);
    ThrowIfAborted();
    Check(call(), what);
    if (!capturing) Track(what);
  }

  bool Capturing() {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    CheckCuda(cudaStreamIsCapturing(stream_, &status), "cudaStreamIsCapturing");
    return status == cudaStreamCaptureStatusActive;
  }

  // Records an event on the stream after the work issued so far; the watchdog aborts the
  // communicator if it has not completed within the timeout.
  void Track(const char* what) {
    cudaEvent_t ev;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (free_events_.empty()) {
        CheckCuda(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
      } else {
        ev = free_events_.back();
        free_events_.pop_back();
      }
    }
    CheckCuda(cudaEventRecord(ev, stream_), "cudaEventRecord");
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back({ev, Clock::now() + o_.timeout, what});
  }

  void Watch() {
    cudaSetDevice(o_.device);  // events are queried in the communicator's device context
    for (;;) {
      std::string stalled;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (stop_) return;
        while (!pending_.empty() && cudaEventQuery(pending_.front().event) == cudaSuccess) {
          free_events_.push_back(pending_.front().event);
          pending_.pop_front();
        }
        if (!pending_.empty() && Clock::now() >= pending_.front().deadline) stalled = StallMessage(pending_.front().what);
      }
      if (stalled.empty() && !aborted_) {
        ncclResult_t async = ncclSuccess;
        std::lock_guard<std::mutex> call_lock(call_mu_);
        if (!aborted_ && comm_ != nullptr) ncclCommGetAsyncError(comm_, &async);
        if (async != ncclSuccess && async != ncclInProgress) stalled = "NCCL error: " + NcclMessage(async, comm_);
      }
      if (!stalled.empty() && !aborted_) {
        std::lock_guard<std::mutex> call_lock(call_mu_);
        AbortLocked(stalled);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }

  // Aborts the communicator once (call_mu_ held, or no other thread left); `why` becomes the
  // error of every later collective.
  void AbortLocked(const std::string& why) {
    if (aborted_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      abort_reason_ = why.empty() ? "the communicator was aborted after an earlier error" : why;
    }
    if (peer_ != nullptr) peer_->Abort();  // its kernels waiting on a peer return
    if (comm_ != nullptr) ncclCommAbort(comm_);
    aborted_ = true;
  }

  void ThrowIfAborted() {
    if (!aborted_) return;
    std::string why;
    {
      std::lock_guard<std::mutex> lock(mu_);
      why = abort_reason_;
    }
    Fail("aborted", why);
  }

  std::string StallMessage(const char* what) const {
    return std::string(what) + " did not complete within " + std::to_string(o_.timeout.count()) +
           " ms (a peer rank stalled or died)";
  }

  // A call answered ncclInProgress: the communicator is non-blocking, and since NCCL 2.27 every
  // group end on one is; a connection still made at a pair's first call (a send and receive's:
  // ConnectInInit has the collectives' made in init) waits here until the peer makes it too, as
  // would any call if a peer never comes. call_mu_ is held, so
  // Abort and the watchdog cannot take it: an abort asked for meanwhile, or the call outliving
  // the timeout, aborts the communicator here and the call throws, as a stalled stream does.
  void WaitCall(const char* what) {
    const Deadline deadline = Clock::now() + o_.timeout;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return;
      if (state != ncclInProgress) Fail(what, NcclMessage(state, comm_));
      if (abort_requested_) {
        std::string why;
        {
          std::lock_guard<std::mutex> lock(mu_);
          why = requested_reason_;
        }
        AbortLocked(why);
      } else if (Clock::now() >= deadline) {
        AbortLocked(StallMessage(what));
      }
      ThrowIfAborted();
      std::this_thread::yield();
    }
  }

  // The non-blocking communicator may answer ncclInProgress; poll until done or `limit` (the
  // destructor's finalize). Returns an error message, empty on success.
  std::string Wait(std::chrono::milliseconds limit) {
    const Deadline deadline = Clock::now() + limit;
    for (;;) {
      ncclResult_t state = ncclSuccess;
      ncclCommGetAsyncError(comm_, &state);
      if (state == ncclSuccess) return "";
      if (state != ncclInProgress) return NcclMessage(state, comm_);
      if (Clock::now() >= deadline) return "timed out after " + std::to_string(limit.count()) + " ms";
      std::this_thread::yield();
    }
  }

  void Check(ncclResult_t r, const char* what) {
    if (r == ncclSuccess) return;
    if (r == ncclInProgress) return WaitCall(what);
    Fail(what, NcclMessage(r, comm_));
  }

  // One send or receive on the stream, a group of its own (a non-blocking communicator may
  // answer ncclGroupEnd with ncclInProgress: Check waits).
  template <class Call>
  void PointToPoint(const char* what, size_t n, int peer, Call call) {
    CheckPeer(peer, what);
    if (n == 0) return;
    Enqueue(what, Capturing(), [&] {
      ncclGroupStart();
      const ncclResult_t r = call();
      const ncclResult_t e = ncclGroupEnd();
      return r != ncclSuccess ? r : e;
    });
  }

  void SideWaitsForOrder() {
    if (order_ == nullptr) return;
    CheckCuda(cudaEventRecord(to_side_, order_), "cudaEventRecord (user stream)");
    CheckCuda(cudaStreamWaitEvent(stream_, to_side_, 0), "cudaStreamWaitEvent (side stream)");
  }

  // Ranks sharing one GPU (no NCCL): a send and its receive are one all-gather of the pair, in
  // pieces of the peer kernel's capacity less one float: each rank contributes a piece and a tag
  // after it (the sender's kSentTag, the receiver's 0), and the receiver takes the sender's piece.
  // A call pairs with the peer's call of the same count, so the two ranks must make their sends
  // and receives in one order, as NCCL's per-pair order does for one direction; a receive met by
  // the peer's receive is caught by the tag (the received piece is NaN then), so a pipeline whose
  // two directions interleave differently on the two ranks fails loudly instead of mixing them.
  void SharedPointToPoint(const char* what, float* data, size_t n, int peer, bool sending) {
    CheckPeer(peer, what);
    if (size_ != 2) Fail(what, "ranks sharing one GPU send and receive in groups of two only");
    if (n == 0) return;
    SideWaitsForOrder();
    const size_t piece = peer_->capacity() - 1;
    const bool capturing = Capturing();
    float* staged = Scratch(3 * (piece + 1), capturing);  // this rank's piece and tag, then the pair's
    float* pair = staged + piece + 1;
    Enqueue(what, capturing, [&] {
      for (size_t off = 0; off < n; off += piece) {
        const size_t c = std::min(piece, n - off);
        if (sending) {
          CheckCuda(cudaMemcpyAsync(staged, data + off, c * sizeof(float), cudaMemcpyDeviceToDevice, stream_), what);
        }
        CheckCuda(cudaMemsetAsync(staged + c, sending ? 1 : 0, sizeof(float), stream_), what);
        CheckCuda(peer_->LaunchGather(staged, c + 1, pair, stream_), "peer all-gather launch");
        if (!sending) {
          const unsigned blocks = static_cast<unsigned>(std::min<size_t>((c + 255) / 256, 1024));
          TakePiece<<<blocks, 256, 0, stream_>>>(pair + static_cast<size_t>(peer) * (c + 1), c, data + off);
          CheckCuda(cudaGetLastError(), "TakePiece launch");
        }
      }
      return ncclSuccess;
    });
  }

  // A group of one among ranks sharing a GPU (no NCCL communicator, no peer kernel): its
  // collectives are the identity.
  bool Alone() const { return comm_ == nullptr && size_ == 1; }

  void CheckPeer(int peer, const char* what) {
    if (peer < 0 || peer >= size_ || peer == rank_) Fail(what, "no peer rank " + std::to_string(peer));
  }

  void CheckCuda(cudaError_t e, const char* what) {
    if (e != cudaSuccess) Fail(what, cudaGetErrorString(e));
  }

  [[noreturn]] void Fail(const char* what, const std::string& msg) {
    broken_ = true;
    throw std::runtime_error("NCCL rank " + std::to_string(rank_) + " of " + std::to_string(size_) + ": " + what +
                             ": " + msg);
  }

  // A device buffer of at least `count` floats, reused across calls (stream-ordered). A graph
  // captured with it keeps its address: once one has, a larger buffer replaces it without
  // freeing it (it lives as long as the communicator). While capturing, a new one comes from
  // cudaMalloc (a stream-ordered allocation would become the graph's own).
  // `capturing`: Capturing(), asked once by the collective.
  float* Scratch(size_t count, bool capturing) {
    if (count > scratch_count_) {
      if (scratch_ != nullptr && (scratch_in_graph_ || capturing)) {
        retired_.push_back({scratch_, scratch_async_});
      } else if (scratch_ != nullptr) {
        CheckCuda(scratch_async_ ? cudaFreeAsync(scratch_, stream_) : cudaFree(scratch_), "freeing the scratch");
      }
      scratch_ = nullptr;
      scratch_in_graph_ = false;
      scratch_async_ = !capturing;
      CheckCuda(capturing ? cudaMalloc(reinterpret_cast<void**>(&scratch_), count * sizeof(float))
                          : cudaMallocAsync(reinterpret_cast<void**>(&scratch_), count * sizeof(float), stream_),
                "allocating the all-reduce scratch");
      scratch_count_ = count;
    }
    scratch_in_graph_ = scratch_in_graph_ || capturing;
    return scratch_;
  }

  ncclComm_t comm_;  // null: ranks sharing one GPU (NcclOptions::share_gpu), the peer kernel for everything
  const int rank_;
  const int size_;
  const NcclOptions o_;
  cudaStream_t stream_;             // where the NCCL calls go: the user's, or the side stream
  std::unique_ptr<PeerAllReduce> peer_;  // null: NCCL for every all-reduce
  cudaStream_t order_ = nullptr;    // with a side stream: the user's (NcclOptions::stream)
  cudaEvent_t to_side_ = nullptr, from_side_ = nullptr;
  struct Buffer {
    float* p;
    bool stream_ordered;  // cudaMallocAsync (else cudaMalloc)
  };
  float* scratch_ = nullptr;
  size_t scratch_count_ = 0;
  bool scratch_async_ = true;
  bool scratch_in_graph_ = false;
  std::vector<Buffer> retired_;  // scratch buffers a graph may still use; freed at the end
  bool broken_ = false;  // the rank's thread only

  std::mutex call_mu_;              // NCCL calls vs the watchdog's abort
  mutable std::mutex mu_;           // guards the fields below
  std::deque<Pending> pending_;     // collectives in flight, oldest first
  std::vector<cudaEvent_t> free_events_;
  std::string abort_reason_;
  std::string requested_reason_;  // Abort's, for a WaitCall that sees abort_requested_
  bool stop_ = false;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> abort_requested_{false};
  std::thread watchdog_;
};

}  // namespace

bool NcclCommunicatorBuilt() { return true; }

namespace {

// NCCL connects ranks for a collective at its first call by default (NCCL_RUNTIME_CONNECT=1,
// 2.22+): the first collective of a kind then waits inside the call for the peer (WaitCall), and
// a graph captured before every connection exists would capture the connecting. Set to 0 once a
// process, before its first NCCL init and forced (every rank must agree, or one waits in init for
// connections the other makes later), the collectives' connections are made in init, under
// init's deadline (point-to-point ones may still come at a pair's first send and receive).
void ConnectInInit() {
  static std::once_flag once;
  std::call_once(once, [] { setenv("NCCL_RUNTIME_CONNECT", "0", 1); });
}

}  // namespace

namespace {

// NcclOptions::share_gpu: the peer all-reduce alone, no NCCL init.
Result<std::unique_ptr<Communicator>> MakeSharedGpuCommunicator(RendezvousStore& store, const NcclOptions& o, int rank,
                                                                int size, const std::string& who) {
  if (size == 1) return std::unique_ptr<Communicator>(new NcclCommunicator(nullptr, rank, size, o, nullptr));
  if (o.peer_all_reduce_max_elems < 2) {
    return InvalidArgument(who + ": ranks sharing one GPU (KIMIRT_RANKS_SHARE_GPU) need the peer all-reduce "
                                 "(peer_all_reduce_max_elems >= 2)");
  }
  std::string why_not;
  Result<std::unique_ptr<PeerAllReduce>> peer =
      PeerAllReduce::Make(store, o.tag, rank, size, o.peer_all_reduce_max_elems, &why_not);
  if (!peer.ok()) return peer.status().WithContext(who);
  if (*peer == nullptr) return Internal(who + ": ranks sharing one GPU need the peer all-reduce: " + why_not);
  return std::unique_ptr<Communicator>(new NcclCommunicator(nullptr, rank, size, o, std::move(*peer)));
}

}  // namespace

Result<std::unique_ptr<Communicator>> MakeNcclCommunicator(RendezvousStore& store, const NcclOptions& o) {
  ConnectInInit();
  const int rank = o.group_rank >= 0 ? o.group_rank : store.rank();
  const int size = o.group_size >= 0 ? o.group_size : store.world_size();
  const std::string who = "NCCL init (rank " + std::to_string(rank) + " of " + std::to_string(size) + ", device " +
                          std::to_string(o.device) + ")";
  if (cudaError_t e = cudaSetDevice(o.device); e != cudaSuccess) {
    return Internal(who + ": cudaSetDevice: " + cudaGetErrorString(e));
  }
  if (o.share_gpu) return MakeSharedGpuCommunicator(store, o, rank, size, who);
  ncclUniqueId id;
  const std::string key = "nccl/unique-id/" + o.tag;
  if (rank == 0) {
    if (ncclResult_t r = ncclGetUniqueId(&id); r != ncclSuccess) {
      return Internal(who + ": ncclGetUniqueId: " + NcclMessage(r, nullptr));
    }
    KIMIRT_RETURN_IF_ERROR(store.Set(key, std::string(id.internal, sizeof(id.internal))));
  } else {
    Result<std::string> bytes = store.Get(key);
    if (!bytes.ok()) return bytes.status().WithContext(who);
    if (bytes->size() != sizeof(id.internal)) {
      return Internal(who + ": the unique id has " + std::to_string(bytes->size()) + " bytes, not " +
                      std::to_string(sizeof(id.internal)));
    }
    std::memcpy(id.internal, bytes->data(), sizeof(id.internal));
  }
  // Non-blocking, so a peer that never initialises ends in an abort at the deadline.
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, size, id, rank, &config);
  const Deadline deadline = Clock::now() + o.timeout;
  while (comm != nullptr && (r == ncclInProgress || r == ncclSuccess)) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state != ncclInProgress) {
      r = state;
      break;
    }
    if (Clock::now() >= deadline) {
      ncclCommAbort(comm);
      return Internal(who + ": timed out after " + std::to_string(o.timeout.count()) +
                      " ms (a peer rank did not initialise)");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (r != ncclSuccess) {
    const std::string msg = NcclMessage(r, comm);
    if (comm != nullptr) ncclCommAbort(comm);
    return Internal(who + ": " + msg);
  }
  // The peer all-reduce for decode sizes, where the whole group is on one host (every rank
  // agrees; none of it where one cannot). Point-to-point communicators (a side stream) need none.
  std::unique_ptr<PeerAllReduce> peer;
  const char* env = std::getenv("KIMIRT_PEER_ALLREDUCE");
  const bool peer_off = env != nullptr && std::string(env) == "0";
  if (size > 1 && !o.side_stream && o.peer_all_reduce_max_elems > 0 && !peer_off) {
    Result<std::unique_ptr<PeerAllReduce>> made =
        PeerAllReduce::Make(store, o.tag, rank, size, o.peer_all_reduce_max_elems);
    if (!made.ok()) {
      ncclCommAbort(comm);
      return made.status().WithContext(who);
    }
    peer = std::move(*made);
  }
  return std::unique_ptr<Communicator>(new NcclCommunicator(comm, rank, size, o, std::move(peer)));
}

namespace {

// A rank's CUDA resources for the checks below, released on every path.
struct DeviceScope {
  ~DeviceScope() {
    for (void* p : buffers) cudaFree(p);
    for (cudaEvent_t e : events) cudaEventDestroy(e);
    if (stream != nullptr) cudaStreamDestroy(stream);
  }
  cudaStream_t stream = nullptr;
  std::vector<void*> buffers;
  std::vector<cudaEvent_t> events;
};

Status CudaOk(cudaError_t e, int rank, const char* what) {
  if (e == cudaSuccess) return Status::Ok();
  return Internal("rank " + std::to_string(rank) + ": " + what + ": " + cudaGetErrorString(e));
}

// Runs fn, turning the communicator's exceptions into a Status.
Status Guard(const std::function<Status()>& fn) {
  try {
    return fn();
  } catch (const std::exception& e) {
    return Internal(e.what());
  }
}

Result<float*> DeviceFloats(DeviceScope& scope, size_t count, int rank) {
  void* p = nullptr;
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaMalloc(&p, count * sizeof(float)), rank, "cudaMalloc"));
  scope.buffers.push_back(p);
  return static_cast<float*>(p);
}

// The scope's stream on `device`, and a communicator on it.
Result<std::unique_ptr<Communicator>> SetUp(RendezvousStore& store, int device, DeviceScope& scope, NcclOptions o) {
  const int rank = store.rank();
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), rank, "cudaSetDevice"));
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaStreamCreateWithFlags(&scope.stream, cudaStreamNonBlocking), rank, "cudaStreamCreate"));
  o.device = device;
  o.stream = scope.stream;
  return MakeNcclCommunicator(store, o);
}

}  // namespace

Status NcclSelfCheck(RendezvousStore& store, int device, size_t count) {
  const int rank = store.rank();
  const int size = store.world_size();
  DeviceScope scope;
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> comm, SetUp(store, device, scope, NcclOptions{}));
  KIMIRT_ASSIGN_OR_RETURN(float* d, DeviceFloats(scope, count, rank));
  KIMIRT_ASSIGN_OR_RETURN(float* g, DeviceFloats(scope, count * size, rank));
  std::vector<float> host(count, static_cast<float>(rank + 1));
  std::vector<float> gathered(count * size, -1.0f);
  KIMIRT_RETURN_IF_ERROR(Guard([&]() -> Status {
    KIMIRT_RETURN_IF_ERROR(
        CudaOk(cudaMemcpyAsync(d, host.data(), count * 4, cudaMemcpyHostToDevice, scope.stream), rank, "upload"));
    comm->AllGather(d, count, g);
    comm->AllReduceSum(d, count);
    comm->Barrier();
    KIMIRT_RETURN_IF_ERROR(
        CudaOk(cudaMemcpyAsync(host.data(), d, count * 4, cudaMemcpyDeviceToHost, scope.stream), rank, "download"));
    KIMIRT_RETURN_IF_ERROR(CudaOk(
        cudaMemcpyAsync(gathered.data(), g, gathered.size() * 4, cudaMemcpyDeviceToHost, scope.stream), rank,
        "download"));
    return CudaOk(cudaStreamSynchronize(scope.stream), rank, "cudaStreamSynchronize");
  }));
  const float want = static_cast<float>(size * (size + 1) / 2);
  for (size_t i = 0; i < count; ++i) {
    if (host[i] != want) {
      return Internal("rank " + std::to_string(rank) + ": all-reduce element " + std::to_string(i) + " is " +
                      std::to_string(host[i]) + ", want " + std::to_string(want));
    }
  }
  for (size_t i = 0; i < gathered.size(); ++i) {
    if (gathered[i] != static_cast<float>(i / count + 1)) {
      return Internal("rank " + std::to_string(rank) + ": all-gather element " + std::to_string(i) + " is " +
                      std::to_string(gathered[i]) + ", want " + std::to_string(i / count + 1));
    }
  }
  return Status::Ok();
}

Status PeerAllReduceSelfCheck(RendezvousStore& store, int device, size_t count, int calls) {
  const int rank = store.rank();
  const int size = store.world_size();
  DeviceScope scope;
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaSetDevice(device), rank, "cudaSetDevice"));
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaStreamCreateWithFlags(&scope.stream, cudaStreamNonBlocking), rank, "cudaStreamCreate"));
  std::string why_not;
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<PeerAllReduce> peer,
                          PeerAllReduce::Make(store, "self-check", rank, size, count, &why_not));
  if (peer == nullptr) return Unsupported("rank " + std::to_string(rank) + ": the peer all-reduce is off: " + why_not);
  KIMIRT_ASSIGN_OR_RETURN(float* d, DeviceFloats(scope, count, rank));
  const std::vector<float> mine(count, static_cast<float>(rank + 1));
  const float want = static_cast<float>(size * (size + 1) / 2);
  std::vector<float> host(count);
  for (int call = 0; call < calls; ++call) {
    KIMIRT_RETURN_IF_ERROR(CudaOk(
        cudaMemcpyAsync(d, mine.data(), count * 4, cudaMemcpyHostToDevice, scope.stream), rank, "upload"));
    KIMIRT_RETURN_IF_ERROR(CudaOk(peer->Launch(d, count, scope.stream), rank, "peer all-reduce"));
    KIMIRT_RETURN_IF_ERROR(
        CudaOk(cudaMemcpyAsync(host.data(), d, count * 4, cudaMemcpyDeviceToHost, scope.stream), rank, "download"));
    KIMIRT_RETURN_IF_ERROR(CudaOk(cudaStreamSynchronize(scope.stream), rank, "cudaStreamSynchronize"));
    for (size_t i = 0; i < count; ++i) {
      if (host[i] != want) {
        return Internal("rank " + std::to_string(rank) + ": peer all-reduce call " + std::to_string(call) +
                        ", element " + std::to_string(i) + " is " + std::to_string(host[i]) + ", want " +
                        std::to_string(want));
      }
    }
  }
  return Status::Ok();
}

Result<std::vector<AllReduceTiming>> NcclAllReduceBench(RendezvousStore& store, int device,
                                                        const std::vector<size_t>& counts, int iters) {
  const int rank = store.rank();
  DeviceScope scope;
  NcclOptions o;
  o.tag = "bench-invariant";
  o.peer_all_reduce_max_elems = 0;
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> ours, SetUp(store, device, scope, o));
  o.tag = "bench-peer";
  o.peer_all_reduce_max_elems = NcclOptions{}.peer_all_reduce_max_elems;
  o.device = device;
  o.stream = scope.stream;
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> peer, MakeNcclCommunicator(store, o));
  const bool has_peer = static_cast<NcclCommunicator*>(peer.get())->has_peer_all_reduce();
  o.peer_all_reduce_max_elems = 0;
  o.tag = "bench-nccl";
  o.nccl_allreduce_min_elems = 0;
  o.device = device;
  o.stream = scope.stream;
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> nccl, MakeNcclCommunicator(store, o));
  size_t most = 1;
  for (size_t c : counts) most = std::max(most, c);
  KIMIRT_ASSIGN_OR_RETURN(float* buf, DeviceFloats(scope, most, rank));
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaMemsetAsync(buf, 0, most * sizeof(float), scope.stream), rank, "cudaMemset"));
  const size_t ranks = static_cast<size_t>(store.world_size());
  KIMIRT_ASSIGN_OR_RETURN(float* gathered, DeviceFloats(scope, most * ranks, rank));
  cudaEvent_t start, stop;
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaEventCreate(&start), rank, "cudaEventCreate"));
  scope.events.push_back(start);
  KIMIRT_RETURN_IF_ERROR(CudaOk(cudaEventCreate(&stop), rank, "cudaEventCreate"));
  scope.events.push_back(stop);
  std::vector<AllReduceTiming> out;
  KIMIRT_RETURN_IF_ERROR(Guard([&]() -> Status {
    for (size_t c : counts) {
      AllReduceTiming t;
      t.count = c;
      for (Communicator* comm : {ours.get(), nccl.get(), peer.get()}) {
        if (comm == peer.get() && (!has_peer || c > NcclOptions{}.peer_all_reduce_max_elems)) continue;
        // The mean of `iters` back-to-back calls of `call` after a warm-up (scratch, NCCL channels).
        auto time_us = [&](const std::function<void()>& call, double* us) -> Status {
          for (int i = 0; i < 5; ++i) call();
          comm->Barrier();
          KIMIRT_RETURN_IF_ERROR(CudaOk(cudaEventRecord(start, scope.stream), rank, "cudaEventRecord"));
          for (int i = 0; i < iters; ++i) call();
          KIMIRT_RETURN_IF_ERROR(CudaOk(cudaEventRecord(stop, scope.stream), rank, "cudaEventRecord"));
          KIMIRT_RETURN_IF_ERROR(CudaOk(cudaEventSynchronize(stop), rank, "cudaEventSynchronize"));
          float ms = 0;
          KIMIRT_RETURN_IF_ERROR(CudaOk(cudaEventElapsedTime(&ms, start, stop), rank, "cudaEventElapsedTime"));
          *us = 1000.0 * ms / iters;
          return Status::Ok();
        };
        KIMIRT_RETURN_IF_ERROR(time_us([&] { comm->AllReduceSum(buf, c); },
                                       comm == ours.get()   ? &t.invariant_us
                                       : comm == nccl.get() ? &t.nccl_us
                                                            : &t.peer_us));
        // The all-gather of the same message: ncclAllGather (the invariant form's first half, the
        // same call in `nccl`), or the peer kernel.
        if (comm != nccl.get()) {
          KIMIRT_RETURN_IF_ERROR(time_us([&] { comm->AllGather(buf, c, gathered); },
                                         comm == ours.get() ? &t.allgather_nccl_us : &t.allgather_peer_us));
        }
      }
      out.push_back(t);
    }
    return Status::Ok();
  }));
  return out;
}

}  // namespace kimirt
