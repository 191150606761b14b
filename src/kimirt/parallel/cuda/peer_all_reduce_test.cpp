// GPU tests of the peer all-reduce (peer_all_reduce.h) on ONE GPU: its ranks are threads of this
// process on device 0, each with its own region and stream, joined through the TCP rendezvous
// store as separate processes would be (PeerAllReduce::Make then maps a thread's region by its
// address). The kernels of all ranks run at once on the GPU, as they would on one GPU each, so
// the barrier, the halves' reuse and the rank-ordered sums are what runs on NVLink, minus the
// IPC handles (the NcclComm tests cover those on two GPUs). Run by `scripts/gpu_check.sh tests`.
//   - every rank gets the host's rank-ordered sum bit for bit: 2, 3 and 8 ranks, sizes from 1 to
//     the capacity, odd tails, a pointer off 16-byte alignment, many calls in a row (both halves);
//   - each rank's calls captured in a CUDA graph and replayed with new data, between eager calls;
//   - a rank that never comes: the others' calls end when aborted, their streams drain;
//   - the all-gather's layout, in place too, between all-reduces.
#include "kimirt/parallel/cuda/peer_all_reduce.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/core/random.h"
#include "kimirt/dist/tcp_socket.h"

namespace kimirt {
namespace {

constexpr size_t kCapacity = size_t{1} << 16;

#define CUDA_OK(expr)                                                                                    \
  do {                                                                                                   \
    cudaError_t _e = (expr);                                                                             \
    if (_e != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(_e)); \
  } while (0)

// Rank r's message of call `call`: normals, with zeros of both signs and a few large values (the
// order of the sums matters for those).
std::vector<float> Message(size_t n, int r, int call) {
  SplitMix64 rng(static_cast<uint64_t>(1000 * call + r + 1));
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const uint64_t u = rng.Next() % 16;
    v[i] = u == 0 ? -0.0f : u == 1 ? 0.0f : u == 2 ? static_cast<float>(rng.Normal()) * 1e7f
                                                   : static_cast<float>(rng.Normal());
  }
  return v;
}

// ((x0 + x1) + x2) + ..., element by element, on the host.
std::vector<float> RankOrderedSum(size_t n, int ranks, int call) {
  std::vector<float> s = Message(n, 0, call);
  for (int r = 1; r < ranks; ++r) {
    const std::vector<float> x = Message(n, r, call);
    for (size_t i = 0; i < n; ++i) s[i] += x[i];
  }
  return s;
}

// What each rank's thread gets: its rank, the peer all-reduce, its stream, and Meet — a barrier of
// the ranks' threads. Ranks that are threads of one process share one CUDA context, where
// cudaMalloc and cudaFree may wait for the whole device: a rank allocating while a peer's kernel
// waits for it in the barrier would never get there. So each test allocates, Meets, calls, syncs
// its stream, Meets, and frees.
// Up and Down copy through pinned host memory allocated before any rank's first call (a
// pageable copy may allocate staging memory of the driver's), each waiting for its stream.
struct Rank {
  int rank;
  PeerAllReduce& peer;
  cudaStream_t stream;
  std::function<void()> Meet;
  float* pinned;  // kCapacity + 1 floats

  void Up(float* d, const std::vector<float>& v) {
    std::memcpy(pinned, v.data(), v.size() * 4);
    CUDA_OK(cudaMemcpyAsync(d, pinned, v.size() * 4, cudaMemcpyHostToDevice, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
  }
  std::vector<float> Down(const float* d, size_t n) {
    CUDA_OK(cudaMemcpyAsync(pinned, d, n * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    return std::vector<float>(pinned, pinned + n);
  }
};

// Runs fn on `ranks` threads, all on device 0, each with a PeerAllReduce of kCapacity made
// through one rendezvous store; any exception fails the test, naming the rank. A test must not
// hang the suite: a watchdog aborts every rank's peer all-reduce after 30 s (their waiting
// kernels return, the streams drain) and fails the test.
void OnRanks(int ranks, const std::function<void(Rank&)>& fn) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_GE(devices, 1) << "the PeerAllReduce tests need a GPU";
  const Result<int> port = PickFreePort();
  ASSERT_TRUE(port.ok()) << port.status().ToString();
  std::vector<std::string> errors(static_cast<size_t>(ranks));
  std::mutex mu;
  std::condition_variable cv;
  std::vector<PeerAllReduce*> live(static_cast<size_t>(ranks), nullptr);
  int finished = 0;
  bool timed_out = false;
  std::thread watchdog([&] {
    std::unique_lock<std::mutex> lock(mu);
    if (cv.wait_for(lock, std::chrono::seconds(30), [&] { return finished == ranks; })) return;
    timed_out = true;
    // Where each rank stands, for the failure's record, before the waits are ended.
    for (PeerAllReduce* p : live) {
      if (p != nullptr) std::fprintf(stderr, "%s\n", p->DescribeState().c_str());
    }
    for (PeerAllReduce* p : live) {
      if (p != nullptr) p->Abort();
    }
  });
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        CUDA_OK(cudaSetDevice(0));
        cudaStream_t stream;
        CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        float* pinned = nullptr;
        CUDA_OK(cudaMallocHost(&pinned, (kCapacity + 1) * 4));
        RendezvousOptions ro;
        ro.master_port = *port;
        ro.rank = r;
        ro.world_size = ranks;
        ro.timeout = std::chrono::seconds(60);
        Result<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Join(ro);
        if (!store.ok()) throw std::runtime_error(store.status().ToString());
        std::string why_not;
        Result<std::unique_ptr<PeerAllReduce>> peer = PeerAllReduce::Make(**store, "test", r, ranks, kCapacity, &why_not);
        if (!peer.ok()) throw std::runtime_error(peer.status().ToString());
        if (*peer == nullptr) throw std::runtime_error("the peer all-reduce is off: " + why_not);
        {
          std::lock_guard<std::mutex> lock(mu);
          live[static_cast<size_t>(r)] = peer->get();
          if (timed_out) (*peer)->Abort();
        }
        // Out of the watchdog's list before the peer all-reduce goes (declared after it: destroyed
        // first, on every path).
        struct Unlist {
          std::mutex& mu;
          PeerAllReduce*& slot;
          void Now() {
            std::lock_guard<std::mutex> lock(mu);
            slot = nullptr;
          }
          ~Unlist() { Now(); }
        } unlist{mu, live[static_cast<size_t>(r)]};
        int meetings = 0;
        Rank rank{r, **peer, stream,
                  [&] {
                    Status s = (*store)->Barrier("meet " + std::to_string(meetings++));
                    if (!s.ok()) throw std::runtime_error(s.ToString());
                  },
                  pinned};
        fn(rank);
        CUDA_OK(cudaStreamSynchronize(stream));
        // Every rank's frees are done before any launches the final barrier: a cudaFree waiting
        // for the device would otherwise wait for that barrier's kernel, which waits for its rank.
        rank.Meet();
        unlist.Now();
        peer->reset();  // the final barrier: every rank's thread gets here
        if (Status s = (*store)->Barrier("done"); !s.ok()) throw std::runtime_error(s.ToString());
        CUDA_OK(cudaFreeHost(pinned));
        CUDA_OK(cudaStreamDestroy(stream));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      std::lock_guard<std::mutex> lock(mu);
      ++finished;
      cv.notify_all();
    });
  }
  for (std::thread& t : threads) t.join();
  watchdog.join();
  EXPECT_FALSE(timed_out) << "the ranks did not finish within 30 s: the watchdog aborted their peer all-reduces";
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(errors[static_cast<size_t>(r)], "") << "rank " << r;
}

size_t Mismatches(const std::vector<float>& got, const std::vector<float>& want) {
  size_t bad = 0;
  for (size_t i = 0; i < want.size(); ++i) bad += std::memcmp(&got[i], &want[i], 4) != 0 ? 1 : 0;
  return bad;
}

TEST(PeerAllReduce, EveryRankGetsTheRankOrderedSumBitForBit) {
  // Sizes: one float, a tail of 3, a block's slice and a bit, K3's width, odd, the capacity; the
  // last case starts 4 bytes into the buffer (the kernel's scalar path).
  const std::vector<size_t> sizes = {1, 3, 7, 129, 7168, 7168 * 3 + 5, 50'001, kCapacity};
  // Thread ranks share one GPU and one context here, so every rank's kernel of a call must be
  // resident at once, and on a hardware queue of its own: with CUDA's default 8 connections
  // (CUDA_DEVICE_MAX_CONNECTIONS) 8 rank streams beside the process's others share queues, and a
  // kernel spinning for a peer can sit ahead of that peer's (8 ranks hung at a call on an H100,
  // 2026-12-06). Served ranks have a GPU each; 8 of them are dist-check's (process ranks).
  for (int ranks : {2, 3, 4}) {
    std::vector<std::vector<size_t>> bad(static_cast<size_t>(ranks));
    OnRanks(ranks, [&](Rank& k) {
      float* d = nullptr;
      CUDA_OK(cudaMalloc(&d, (kCapacity + 1) * 4));
      k.Meet();
      int call = 0;
      for (int pass = 0; pass < 2; ++pass) {  // both halves, twice
        for (size_t n : sizes) {
          ++call;
          k.Up(d, Message(n, k.rank, call));
          CUDA_OK(k.peer.Launch(d, n, k.stream));
          bad[static_cast<size_t>(k.rank)].push_back(Mismatches(k.Down(d, n), RankOrderedSum(n, ranks, call)));
        }
      }
      ++call;
      const size_t n = kCapacity - 1;
      k.Up(d + 1, Message(n, k.rank, call));
      CUDA_OK(k.peer.Launch(d + 1, n, k.stream));
      bad[static_cast<size_t>(k.rank)].push_back(Mismatches(k.Down(d + 1, n), RankOrderedSum(n, ranks, call)));
      EXPECT_EQ(k.peer.Launch(d, kCapacity + 1, k.stream), cudaErrorInvalidValue);  // past the capacity
      CUDA_OK(cudaStreamSynchronize(k.stream));
      k.Meet();
      CUDA_OK(cudaFree(d));
    });
    for (int r = 0; r < ranks; ++r) {
      for (size_t i = 0; i < bad[static_cast<size_t>(r)].size(); ++i) {
        EXPECT_EQ(bad[static_cast<size_t>(r)][i], 0u) << ranks << " ranks, rank " << r << ", call " << i + 1;
      }
    }
  }
}

TEST(PeerAllReduce, FortyCallsInARowEachOnItsOwnBuffer) {
  // 40 calls, each on its own buffer, read back only after the last: every rank launches its next
  // call as soon as its own last one ended, so a fast rank is a call ahead of a slow one still
  // reading (its sum after the barrier) — the halves and epochs in turn, with no host barrier.
  // One call in flight a stream: thread ranks of one GPU can share a hardware queue (CUDA deals
  // streams onto its connections), and a queued call waiting for its stream's previous one would
  // block a peer's call behind it in that queue. With all 40 queued at once, 14 of 26 repetitions
  // hung so on an H100 (session 34: one rank's first kernel never started while the others waited
  // at epoch 1). On a GPU each, as served, no two ranks share a queue.
  constexpr int kRanksHere = 4, kCalls = 40;
  constexpr size_t kN = 7168 * 2 + 1;
  std::vector<size_t> bad(kRanksHere, 0);
  OnRanks(kRanksHere, [&](Rank& k) {
    std::vector<float*> d(kCalls);
    for (int c = 0; c < kCalls; ++c) {
      CUDA_OK(cudaMalloc(&d[static_cast<size_t>(c)], kN * 4));
      k.Up(d[static_cast<size_t>(c)], Message(kN, k.rank, c));
    }
    CUDA_OK(cudaStreamSynchronize(k.stream));
    k.Meet();
    for (int c = 0; c < kCalls; ++c) {
      CUDA_OK(k.peer.Launch(d[static_cast<size_t>(c)], kN, k.stream));
      CUDA_OK(cudaStreamSynchronize(k.stream));
    }
    for (int c = 0; c < kCalls; ++c) {
      bad[static_cast<size_t>(k.rank)] += Mismatches(k.Down(d[static_cast<size_t>(c)], kN),
                                                     RankOrderedSum(kN, kRanksHere, c));
    }
    k.Meet();
    for (int c = 0; c < kCalls; ++c) CUDA_OK(cudaFree(d[static_cast<size_t>(c)]));
  });
  for (int r = 0; r < kRanksHere; ++r) EXPECT_EQ(bad[static_cast<size_t>(r)], 0u) << "rank " << r;
}

TEST(PeerAllReduce, CallsInAGraphAdvanceOnEveryReplay) {
  // Each rank captures two calls (two sizes) in a graph and replays it three times with new data,
  // with an eager call between replays: the epochs live on the device, so a replay is a new call.
  constexpr int kRanksHere = 3;
  constexpr size_t kA = 7168, kB = 333;
  std::vector<size_t> bad(kRanksHere, 0);
  OnRanks(kRanksHere, [&](Rank& k) {
    float *a = nullptr, *b = nullptr;
    CUDA_OK(cudaMalloc(&a, kA * 4));
    CUDA_OK(cudaMalloc(&b, kA * 4));
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_OK(cudaStreamBeginCapture(k.stream, cudaStreamCaptureModeThreadLocal));
    CUDA_OK(k.peer.Launch(a, kA, k.stream));
    CUDA_OK(k.peer.Launch(b, kB, k.stream));
    CUDA_OK(cudaStreamEndCapture(k.stream, &graph));
    CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
    k.Meet();
    int call = 100;
    for (int replay = 0; replay < 3; ++replay) {
      const int ca = ++call, cb = ++call;
      k.Up(a, Message(kA, k.rank, ca));
      k.Up(b, Message(kB, k.rank, cb));
      CUDA_OK(cudaGraphLaunch(exec, k.stream));
      bad[static_cast<size_t>(k.rank)] += Mismatches(k.Down(a, kA), RankOrderedSum(kA, kRanksHere, ca));
      bad[static_cast<size_t>(k.rank)] += Mismatches(k.Down(b, kB), RankOrderedSum(kB, kRanksHere, cb));
      const int ce = ++call;
      k.Up(a, Message(kA, k.rank, ce));
      CUDA_OK(k.peer.Launch(a, kA, k.stream));
      bad[static_cast<size_t>(k.rank)] += Mismatches(k.Down(a, kA), RankOrderedSum(kA, kRanksHere, ce));
    }
    CUDA_OK(cudaStreamSynchronize(k.stream));
    k.Meet();
    CUDA_OK(cudaGraphExecDestroy(exec));
    CUDA_OK(cudaGraphDestroy(graph));
    CUDA_OK(cudaFree(a));
    CUDA_OK(cudaFree(b));
  });
  for (int r = 0; r < kRanksHere; ++r) EXPECT_EQ(bad[static_cast<size_t>(r)], 0u) << "rank " << r;
}

TEST(PeerAllReduce, AbortEndsCallsWaitingOnARankThatNeverComes) {
  // Rank 2 of 3 never calls; ranks 0 and 1 wait in the barrier until Abort (what the NCCL
  // communicator's watchdog or the runner's supervisor does), then their streams drain. Rank 2 is
  // aborted too before the end, as its group's would be, so no final barrier waits.
  constexpr int kRanksHere = 3;
  std::vector<double> waited(kRanksHere, -1);
  OnRanks(kRanksHere, [&](Rank& k) {
    float* d = nullptr;
    CUDA_OK(cudaMalloc(&d, 7168 * 4));
    CUDA_OK(cudaMemsetAsync(d, 0, 7168 * 4, k.stream));
    CUDA_OK(cudaStreamSynchronize(k.stream));
    k.Meet();
    if (k.rank != 2) {
      CUDA_OK(k.peer.Launch(d, 7168, k.stream));
      const auto t0 = std::chrono::steady_clock::now();
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      EXPECT_EQ(cudaStreamQuery(k.stream), cudaErrorNotReady) << "rank " << k.rank << " passed the barrier alone";
      k.peer.Abort();
      CUDA_OK(cudaStreamSynchronize(k.stream));
      waited[static_cast<size_t>(k.rank)] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(600));
      k.peer.Abort();
    }
    k.Meet();
    CUDA_OK(cudaFree(d));
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_GE(waited[static_cast<size_t>(r)], 0.29) << "rank " << r;
    EXPECT_LT(waited[static_cast<size_t>(r)], 5.0) << "rank " << r << ": the abort did not end the wait";
  }
}

TEST(PeerAllReduce, AllGatherLaysOutTheRanksInOrderInPlaceAndBesideAllReduces) {
  // recv[r·n + i] = rank r's send[i], bit for bit: aligned (n a multiple of 4), odd n (the scalar
  // path), in place (send = recv + rank·n), with all-reduces between (the two share the epochs).
  constexpr int kRanksHere = 3;
  const std::vector<size_t> sizes = {1, 4, 7168, 7168 + 3, 20'000};
  std::vector<size_t> bad(kRanksHere, 0);
  OnRanks(kRanksHere, [&](Rank& k) {
    float *send = nullptr, *recv = nullptr;
    CUDA_OK(cudaMalloc(&send, (kCapacity + 1) * 4));
    CUDA_OK(cudaMalloc(&recv, kRanksHere * (kCapacity + 1) * 4));
    k.Meet();
    int call = 200;
    for (size_t n : sizes) {
      for (bool in_place : {false, true}) {
        const int c = ++call;
        float* from = in_place ? recv + static_cast<size_t>(k.rank) * n : send;
        k.Up(from, Message(n, k.rank, c));
        CUDA_OK(k.peer.LaunchGather(from, n, recv, k.stream));
        const std::vector<float> got = k.Down(recv, kRanksHere * n);
        for (int r = 0; r < kRanksHere; ++r) {
          const std::vector<float> want = Message(n, r, c);
          bad[static_cast<size_t>(k.rank)] +=
              Mismatches(std::vector<float>(got.begin() + static_cast<std::ptrdiff_t>(r * n),
                                            got.begin() + static_cast<std::ptrdiff_t>((r + 1) * n)),
                         want);
        }
        const int ca = ++call;  // an all-reduce between gathers
        k.Up(send, Message(n, k.rank, ca));
        CUDA_OK(k.peer.Launch(send, n, k.stream));
        bad[static_cast<size_t>(k.rank)] += Mismatches(k.Down(send, n), RankOrderedSum(n, kRanksHere, ca));
      }
    }
    CUDA_OK(cudaStreamSynchronize(k.stream));
    k.Meet();
    CUDA_OK(cudaFree(send));
    CUDA_OK(cudaFree(recv));
  });
  for (int r = 0; r < kRanksHere; ++r) EXPECT_EQ(bad[static_cast<size_t>(r)], 0u) << "rank " << r;
}

TEST(PeerAllReduce, OneRankIsNotAGroup) {
  const Result<int> port = PickFreePort();
  ASSERT_TRUE(port.ok());
  RendezvousOptions ro;
  ro.master_port = *port;
  Result<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Join(ro);
  ASSERT_TRUE(store.ok()) << store.status().ToString();
  std::string why;
  Result<std::unique_ptr<PeerAllReduce>> peer = PeerAllReduce::Make(**store, "one", 0, 1, kCapacity, &why);
  ASSERT_TRUE(peer.ok());
  EXPECT_EQ(*peer, nullptr);
  EXPECT_NE(why.find("1 ranks"), std::string::npos) << why;
}

}  // namespace
}  // namespace kimirt
