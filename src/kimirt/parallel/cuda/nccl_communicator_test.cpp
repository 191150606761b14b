// GPU tests of the NCCL communicator (CUDA builds; run by `scripts/gpu_check.sh nccl` on a
// machine with two GPUs, e.g. nvidia-h200-x2). Two ranks as threads of this process, one GPU
// each, joined through the TCP rendezvous store over loopback, as separate processes would be.
// With fewer than two GPUs the tests fail saying so (never skip).
//   - AllReduceSum equals the rank-ordered host sum bit for bit, on both ranks;
//   - batch invariance: each row of a 64-row all-reduce is bit-identical to the row reduced alone;
//   - AllGather's layout, in place too; Barrier; NCCL's own ncclAllReduce (the non-invariant
//     path) agrees within rounding;
//   - a peer stalled in a collective ends in an error on both ranks within the timeout;
//   - Abort from another thread ends a collective waiting on a peer at once.
#include "kimirt/parallel/nccl_communicator.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/core/random.h"

namespace kimirt {
namespace {

constexpr int kRanks = 2;
constexpr size_t kWidth = 2304;  // Kimi-Linear-48B's hidden width: one decode row

#define CUDA_OK(expr)                                                                          \
  do {                                                                                         \
    cudaError_t _e = (expr);                                                                   \
    if (_e != cudaSuccess) throw std::runtime_error(std::string(#expr) + ": " + cudaGetErrorString(_e)); \
  } while (0)

std::vector<float> Random(size_t n, uint64_t seed) {
  SplitMix64 rng(seed);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(rng.Normal()) * 3.0f;
  return v;
}

// One rank's device buffer on its stream.
struct DeviceFloats {
  DeviceFloats(size_t n, cudaStream_t s) : n(n), stream(s) { CUDA_OK(cudaMalloc(&p, std::max<size_t>(n, 1) * 4)); }
  ~DeviceFloats() { cudaFree(p); }
  void Up(const std::vector<float>& v) { CUDA_OK(cudaMemcpyAsync(p, v.data(), n * 4, cudaMemcpyHostToDevice, stream)); }
  std::vector<float> Down() {
    std::vector<float> v(n);
    CUDA_OK(cudaMemcpyAsync(v.data(), p, n * 4, cudaMemcpyDeviceToHost, stream));
    CUDA_OK(cudaStreamSynchronize(stream));
    return v;
  }
  float* p = nullptr;
  size_t n;
  cudaStream_t stream;
};

// Runs fn(comm, stream) on kRanks threads, rank r on GPU r, then a Barrier. With errors_out (a
// test of failures) there is no final Barrier and each rank's error (an exception's message)
// goes to *errors_out; else any error fails the test.
// `peer_max`: NcclOptions::peer_all_reduce_max_elems (0: the all-gather + sum path for every size).
void OnGpuRanks(const std::function<void(Communicator&, cudaStream_t)>& fn, size_t nccl_min = SIZE_MAX,
                std::chrono::milliseconds timeout = std::chrono::seconds(60),
                std::vector<std::string>* errors_out = nullptr,
                size_t peer_max = NcclOptions{}.peer_all_reduce_max_elems) {
  int devices = 0;
  ASSERT_EQ(cudaGetDeviceCount(&devices), cudaSuccess);
  ASSERT_GE(devices, kRanks) << "the NcclComm tests need " << kRanks << " GPUs; this machine has " << devices
                             << " (run them on nvidia-h200-x2: scripts/gpu_check.sh nccl)";
  const int port = *PickFreePort();
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        CUDA_OK(cudaSetDevice(r));
        cudaStream_t stream;
        CUDA_OK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        RendezvousOptions ro;
        ro.master_port = port;
        ro.rank = r;
        ro.world_size = kRanks;
        ro.timeout = std::chrono::seconds(60);
        Result<std::unique_ptr<RendezvousStore>> store = RendezvousStore::Join(ro);
        if (!store.ok()) throw std::runtime_error(store.status().ToString());
        NcclOptions no;
        no.device = r;
        no.stream = stream;
        no.timeout = timeout;
        no.nccl_allreduce_min_elems = nccl_min;
        no.peer_all_reduce_max_elems = peer_max;
        Result<std::unique_ptr<Communicator>> comm = MakeNcclCommunicator(**store, no);
        if (!comm.ok()) throw std::runtime_error(comm.status().ToString());
        EXPECT_EQ((*comm)->rank(), r);
        EXPECT_EQ((*comm)->size(), kRanks);
        fn(**comm, stream);
        if (errors_out == nullptr) (*comm)->Barrier();
        comm->reset();
        if (Status s = (*store)->Barrier("done"); !s.ok()) throw std::runtime_error(s.ToString());
        CUDA_OK(cudaStreamDestroy(stream));
      } catch (const std::exception& e) {
        errors[r] = e.what();
      }
    });
  }
  for (std::thread& t : threads) t.join();
  if (errors_out != nullptr) {
    *errors_out = errors;
    return;
  }
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

// The reference: ((x0 + x1) + ...) on the host, rank order.
std::vector<float> RankOrderSum(size_t n, uint64_t seed) {
  std::vector<float> sum = Random(n, seed);
  for (int r = 1; r < kRanks; ++r) {
    const std::vector<float> x = Random(n, seed + r);
    for (size_t i = 0; i < n; ++i) sum[i] += x[i];
  }
  return sum;
}

bool BitEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

// Each rank's AllReduceSum of Random(n, seed + rank), as the rank downloads it.
std::vector<std::vector<float>> ReducedOnEveryRank(size_t n, uint64_t seed, size_t nccl_min,
                                                   size_t peer_max = NcclOptions{}.peer_all_reduce_max_elems) {
  std::vector<std::vector<float>> got(kRanks);
  OnGpuRanks(
      [&](Communicator& c, cudaStream_t s) {
        DeviceFloats d(n, s);
        d.Up(Random(n, seed + c.rank()));
        c.AllReduceSum(d.p, n);
        got[c.rank()] = d.Down();
      },
      nccl_min, std::chrono::seconds(60), nullptr, peer_max);
  return got;
}

TEST(NcclComm, AllReduceIsTheRankOrderedSumBitForBit) {
  // Both batch-invariant paths: the peer all-reduce (decode sizes, the default on one host; 300
  // rows pass its capacity and take NCCL's) and ncclAllGather + RankOrderedSum (peer_max 0).
  for (size_t peer_max : {NcclOptions{}.peer_all_reduce_max_elems, size_t{0}}) {
    for (size_t rows : {1, 3, 64, 300}) {
      const size_t n = rows * kWidth;
      const std::vector<float> want = RankOrderSum(n, 100);
      const std::vector<std::vector<float>> got = ReducedOnEveryRank(n, 100, SIZE_MAX, peer_max);
      for (int r = 0; r < kRanks; ++r) {
        EXPECT_TRUE(BitEqual(got[r], want)) << "rows " << rows << ", rank " << r << ", peer_max " << peer_max;
      }
    }
  }
}

TEST(NcclComm, EachRowIsBitIdenticalToTheRowReducedAlone) {
  const size_t rows = 64, n = rows * kWidth;
  std::vector<int> mismatched(kRanks, 0);
  OnGpuRanks([&](Communicator& c, cudaStream_t s) {
    const std::vector<float> x = Random(n, 200 + c.rank());
    DeviceFloats all(n, s);
    all.Up(x);
    c.AllReduceSum(all.p, n);
    const std::vector<float> batch = all.Down();
    DeviceFloats one(kWidth, s);
    for (size_t row = 0; row < rows; ++row) {
      one.Up(std::vector<float>(x.begin() + row * kWidth, x.begin() + (row + 1) * kWidth));
      c.AllReduceSum(one.p, kWidth);
      const std::vector<float> alone = one.Down();
      if (std::memcmp(alone.data(), batch.data() + row * kWidth, kWidth * 4) != 0) ++mismatched[c.rank()];
    }
  });
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(mismatched[r], 0) << "rows differing alone vs in the batch, rank " << r;
}

TEST(NcclComm, AllGatherLayoutAndInPlace) {
  const size_t n = 3 * kWidth + 5;
  std::vector<std::vector<float>> got(kRanks), in_place(kRanks);
  OnGpuRanks([&](Communicator& c, cudaStream_t s) {
    DeviceFloats send(n, s), recv(n * kRanks, s);
    send.Up(Random(n, 300 + c.rank()));
    c.AllGather(send.p, n, recv.p);
    got[c.rank()] = recv.Down();
    DeviceFloats buf(n * kRanks, s);
    std::vector<float> init(n * kRanks, -1.0f);
    const std::vector<float> mine = Random(n, 300 + c.rank());
    std::copy(mine.begin(), mine.end(), init.begin() + c.rank() * n);
    buf.Up(init);
    c.AllGather(buf.p + c.rank() * n, n, buf.p);
    in_place[c.rank()] = buf.Down();
  });
  std::vector<float> want;
  for (int r = 0; r < kRanks; ++r) {
    const std::vector<float> x = Random(n, 300 + r);
    want.insert(want.end(), x.begin(), x.end());
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(BitEqual(got[r], want)) << "rank " << r;
    EXPECT_TRUE(BitEqual(in_place[r], want)) << "in place, rank " << r;
  }
}

TEST(NcclComm, NcclsOwnAllReduceAgreesWithinRounding) {
  // The opt-in path for large messages: NCCL's ring/tree order, so within rounding, not bits.
  const size_t n = 64 * kWidth;
  const std::vector<float> want = RankOrderSum(n, 400);
  // peer_max 0: the peer all-reduce would take this size before ncclAllReduce.
  const std::vector<std::vector<float>> got = ReducedOnEveryRank(n, 400, /*nccl_min=*/1, /*peer_max=*/0);
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(got[r].size(), n);
    double worst = 0;
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::abs(double(got[r][i]) - want[i]) / (std::abs(want[i]) + 1e-3));
    EXPECT_LT(worst, 1e-5) << "rank " << r;
  }
}

// Rank 0 runs `rank0` while rank 1 calls no collective at all (a mismatched one could pair with
// rank 0's half-done all-gather), idling until rank 0 is done (at most a minute); each rank's
// error, if any, in *errors (OnGpuRanks's failure mode).
void RankZeroAlone(const std::function<void(Communicator&, cudaStream_t)>& rank0, std::chrono::milliseconds timeout,
                   std::vector<std::string>* errors) {
  std::atomic<bool> rank0_done{false};
  const auto t0 = std::chrono::steady_clock::now();
  OnGpuRanks(
      [&](Communicator& c, cudaStream_t s) {
        if (c.rank() == 0) {
          rank0(c, s);
          rank0_done = true;
          return;
        }
        while (!rank0_done && std::chrono::steady_clock::now() - t0 < std::chrono::seconds(60)) {
          std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
      },
      SIZE_MAX, timeout, errors);
}

TEST(NcclComm, StalledPeerTimesOutInsteadOfHanging) {
  // Rank 1 never joins rank 0's all-reduce. Rank 0's watchdog must abort within the timeout and
  // its next collective throw, naming the stalled one; nothing may hang, destructors included.
  std::string rank0_error;
  std::vector<std::string> errors;
  const auto t0 = std::chrono::steady_clock::now();
  RankZeroAlone(
      [&](Communicator& c, cudaStream_t s) {
        DeviceFloats d(kWidth, s);
        d.Up(Random(kWidth, 500));
        try {
          c.AllReduceSum(d.p, kWidth);
          c.Barrier();
        } catch (const std::exception& e) {
          rank0_error = e.what();
        }
      },
      std::chrono::seconds(3), &errors);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(seconds, 50.0);
  // The peer all-reduce where the two GPUs can map each other's memory, else NCCL's path.
  EXPECT_TRUE(rank0_error.find("NCCL rank 0 of 2: aborted: peer all-reduce did not complete within 3000 ms") !=
                  std::string::npos ||
              rank0_error.find("NCCL rank 0 of 2: aborted: ncclAllGather (all-reduce) did not complete within 3000 ms") !=
                  std::string::npos)
      << rank0_error;
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

TEST(NcclComm, AbortFromAnotherThreadEndsACollectiveWaitingOnAPeer) {
  // What the process-ranks runner's supervisor does when it sees a rank die: rank 1 never joins
  // rank 0's all-reduce; rank 0's host waits on the stream, as a step's download does, and another
  // thread calls Abort. The wait ends within seconds (the watchdog's timeout is 60 s here),
  // aborted() says why, and the next collective throws with it. A first collective may also wait
  // for the peer inside the call (NCCL connects a pair at its first call: WaitCall), so the
  // aborter starts first and the call and the stream's wait are timed together.
  std::string reason, next_error, sync_result;
  double waited = -1;
  std::vector<std::string> errors;
  RankZeroAlone(
      [&](Communicator& c, cudaStream_t s) {
        DeviceFloats d(kWidth, s);
        d.Up(Random(kWidth, 600));
        EXPECT_EQ(c.aborted(), "");
        std::thread aborter([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(300));
          c.Abort("rank 1 died (test)");
        });
        const auto w0 = std::chrono::steady_clock::now();
        try {
          c.AllReduceSum(d.p, kWidth);
          sync_result = cudaGetErrorString(cudaStreamSynchronize(s));  // NCCL's kernels return
        } catch (const std::exception& e) {
          sync_result = e.what();  // the call itself was waiting on rank 1
        }
        waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
        aborter.join();
        reason = c.aborted();
        try {
          c.AllReduceSum(d.p, kWidth);
        } catch (const std::exception& e) {
          next_error = e.what();
        }
      },
      std::chrono::seconds(60), &errors);
  EXPECT_GE(waited, 0.2) << "the all-reduce completed without rank 1";
  EXPECT_LT(waited, 10.0) << sync_result;
  EXPECT_EQ(reason, "rank 1 died (test)");
  EXPECT_NE(next_error.find("NCCL rank 0 of 2: aborted: rank 1 died (test)"), std::string::npos) << next_error;
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
}

}  // namespace
}  // namespace kimirt
