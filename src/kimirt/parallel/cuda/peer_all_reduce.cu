// PeerAllReduce (peer_all_reduce.h): the one-shot kernel, its final barrier, and the IPC setup.
#include "kimirt/parallel/cuda/peer_all_reduce.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>

namespace kimirt {
namespace {

constexpr int kThreads = 512;
// Flags and counters after the two halves; the halves are whole float4s (capacity rounded up).
__host__ __device__ constexpr size_t RoundUp4(size_t n) { return (n + 3) / 4 * 4; }
size_t FlagsOffset(size_t capacity) { return 2 * RoundUp4(capacity) * sizeof(float); }
size_t CountersOffset(size_t capacity) { return FlagsOffset(capacity) + kPeerBlocks * kPeerMaxRanks * sizeof(uint32_t); }

// Memory order across GPUs (PTX ISA, memory consistency model): a block's copies are made
// visible to the peers by the CTA barrier, then one thread's release store at system scope
// (cumulative over what the barrier ordered before it: cooperative groups' grid sync publishes
// a block's writes the same way); the peer's acquire load, then its CTA barrier, orders its
// reads after them.
__device__ __forceinline__ void StoreRelease(uint32_t* p, uint32_t v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ uint32_t LoadAcquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ uint32_t LoadVolatile(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.volatile.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Block b's barrier of epoch e: thread t (t < ranks, t ≠ rank) tells peer t that this rank's
// block b arrived, then waits until peer t's block b has (flags only grow; compared modulo 2^32).
// `deadline_ns` > 0 bounds the wait (the final barrier). Returns false, on every thread, when an
// abort or the deadline ended it.
__device__ bool Meet(const PeerAllReduceArgs& a, uint32_t e, uint64_t deadline_ns) {
  __shared__ int ended;
  if (threadIdx.x == 0) ended = 0;
  __syncthreads();
  const int t = static_cast<int>(threadIdx.x);
  const int b = static_cast<int>(blockIdx.x);
  if (t < a.ranks && t != a.rank) {
    StoreRelease(a.flags[t] + b * kPeerMaxRanks + a.rank, e);
    const uint32_t* f = a.flags[a.rank] + b * kPeerMaxRanks + t;
    uint64_t start = 0;
    if (deadline_ns > 0) asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (uint32_t spins = 1; static_cast<int32_t>(LoadAcquire(f) - e) < 0; ++spins) {
      if ((spins & 1023) != 0) continue;
      // The abort word lies in host memory: read it once every 1024 polls of the flag.
      if (LoadVolatile(a.abort) != 0) {
        ended = 1;
        break;
      }
      if (deadline_ns > 0) {
        uint64_t now;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
        if (now - start > deadline_ns) {
          ended = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
  return ended == 0;
}

// Block b's part of a call: its slice [lo, hi) of the n floats every rank sends (whole float4s
// but for the message's end: the same slice on every rank), copied into this rank's buffer half
// of the call's parity; then the barrier. Returns the half's offset, or SIZE_MAX where an abort
// ended the barrier (the output is then undefined and the counters stay).
struct Slice {
  size_t lo, hi, vhi, half;  // [lo, vhi) in float4s, [vhi, hi) one float at a time
  uint32_t epoch;
};
__device__ bool CopyInAndMeet(const PeerAllReduceArgs& a, const float* send, size_t n, bool vec, Slice* out) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = a.counters[blockIdx.x] + 1;
  __syncthreads();
  Slice sl;
  sl.epoch = epoch;
  sl.half = (sl.epoch & 1) * RoundUp4(a.capacity);
  const size_t per = RoundUp4((n + kPeerBlocks - 1) / kPeerBlocks);
  sl.lo = blockIdx.x * per < n ? blockIdx.x * per : n;
  sl.hi = sl.lo + per < n ? sl.lo + per : n;
  sl.vhi = vec ? sl.lo + (sl.hi - sl.lo) / 4 * 4 : sl.lo;
  float* mine = a.buffers[a.rank] + sl.half;
  for (size_t i = sl.lo + 4 * threadIdx.x; i < sl.vhi; i += 4 * kThreads) {
    *reinterpret_cast<float4*>(mine + i) = *reinterpret_cast<const float4*>(send + i);
  }
  for (size_t i = sl.vhi + threadIdx.x; i < sl.hi; i += kThreads) mine[i] = send[i];
  *out = sl;
  return Meet(a, sl.epoch, 0);
}

__global__ void __launch_bounds__(kThreads) PeerAllReduceKernel(PeerAllReduceArgs a, float* data, size_t n) {
  Slice sl;
  if (!CopyInAndMeet(a, data, n, reinterpret_cast<uintptr_t>(data) % 16 == 0, &sl)) return;
  // Every rank's copy, loaded before any is added (the loads in flight together), then summed
  // in rank order from rank 0's value (RankOrderedSum's expression: a lone -0.0f stays).
  for (size_t i = sl.lo + 4 * threadIdx.x; i < sl.vhi; i += 4 * kThreads) {
    float4 v[kPeerMaxRanks];
#pragma unroll
    for (int r = 0; r < kPeerMaxRanks; ++r) {
      if (r < a.ranks) v[r] = __ldcg(reinterpret_cast<const float4*>(a.buffers[r] + sl.half + i));
    }
    float4 s = v[0];
#pragma unroll
    for (int r = 1; r < kPeerMaxRanks; ++r) {
      if (r < a.ranks) {
        s.x = __fadd_rn(s.x, v[r].x);
        s.y = __fadd_rn(s.y, v[r].y);
        s.z = __fadd_rn(s.z, v[r].z);
        s.w = __fadd_rn(s.w, v[r].w);
      }
    }
    *reinterpret_cast<float4*>(data + i) = s;
  }
  for (size_t i = sl.vhi + threadIdx.x; i < sl.hi; i += kThreads) {
    float v[kPeerMaxRanks];
#pragma unroll
    for (int r = 0; r < kPeerMaxRanks; ++r) {
      if (r < a.ranks) v[r] = __ldcg(a.buffers[r] + sl.half + i);
    }
    float s = v[0];
#pragma unroll
    for (int r = 1; r < kPeerMaxRanks; ++r) {
      if (r < a.ranks) s = __fadd_rn(s, v[r]);
    }
    data[i] = s;
  }
  if (threadIdx.x == 0) a.counters[blockIdx.x] = sl.epoch;
}

// recv[r·n + i] := rank r's send[i]. In place (send = recv + rank·n) too: block b reads only its
// slice of send before the barrier, and writes after it only its slice of each rank's part.
__global__ void __launch_bounds__(kThreads) PeerAllGatherKernel(PeerAllReduceArgs a, const float* send, size_t n,
                                                                float* recv) {
  const bool vec = reinterpret_cast<uintptr_t>(send) % 16 == 0 && reinterpret_cast<uintptr_t>(recv) % 16 == 0 &&
                   n % 4 == 0;
  Slice sl;
  if (!CopyInAndMeet(a, send, n, vec, &sl)) return;
  for (int r = 0; r < a.ranks; ++r) {
    const float* src = a.buffers[r] + sl.half;
    float* dst = recv + static_cast<size_t>(r) * n;
    for (size_t i = sl.lo + 4 * threadIdx.x; i < sl.vhi; i += 4 * kThreads) {
      *reinterpret_cast<float4*>(dst + i) = __ldcg(reinterpret_cast<const float4*>(src + i));
    }
    for (size_t i = sl.vhi + threadIdx.x; i < sl.hi; i += kThreads) dst[i] = __ldcg(src + i);
  }
  if (threadIdx.x == 0) a.counters[blockIdx.x] = sl.epoch;
}

// One more barrier and nothing else, bounded by `deadline_ns`: before a rank frees its region,
// every peer has finished reading it (each has arrived here, after its last call).
__global__ void __launch_bounds__(kThreads) PeerFinalBarrierKernel(PeerAllReduceArgs a, uint64_t deadline_ns) {
  __shared__ uint32_t epoch;
  if (threadIdx.x == 0) epoch = a.counters[blockIdx.x] + 1;
  __syncthreads();
  if (Meet(a, epoch, deadline_ns) && threadIdx.x == 0) a.counters[blockIdx.x] = epoch;
}

// This machine, as the ranks compare it: the host name and the kernel's boot id (two containers
// or nodes may share a name; they do not share a boot).
std::string HostIdentity() {
  char name[256] = {};
  gethostname(name, sizeof(name) - 1);
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string boot((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!boot.empty() && (boot.back() == '\n' || boot.back() == ' ')) boot.pop_back();
  return std::string(name) + "/" + boot;
}

// What a rank publishes: its region's IPC handle, the region's address and device in its own
// process (ranks that are threads of one process use the address itself: a process cannot open
// its own handle), its pid and its host.
struct Published {
  cudaIpcMemHandle_t handle;
  uint64_t address;
  int32_t pid;
  int32_t device;
  std::string host;
};

std::string Encode(const Published& p) {
  std::string s(sizeof(p.handle) + 16, '\0');
  std::memcpy(s.data(), &p.handle, sizeof(p.handle));
  std::memcpy(s.data() + sizeof(p.handle), &p.address, 8);
  std::memcpy(s.data() + sizeof(p.handle) + 8, &p.pid, 4);
  std::memcpy(s.data() + sizeof(p.handle) + 12, &p.device, 4);
  return s + p.host;
}

Result<Published> Decode(const std::string& s, const std::string& key) {
  Published p;
  if (s.size() < sizeof(p.handle) + 16) return Internal(key + ": " + std::to_string(s.size()) + " bytes, too short");
  std::memcpy(&p.handle, s.data(), sizeof(p.handle));
  std::memcpy(&p.address, s.data() + sizeof(p.handle), 8);
  std::memcpy(&p.pid, s.data() + sizeof(p.handle) + 8, 4);
  std::memcpy(&p.device, s.data() + sizeof(p.handle) + 12, 4);
  p.host = s.substr(sizeof(p.handle) + 16);
  return p;
}

}  // namespace

size_t PeerRegionBytes(size_t capacity) { return CountersOffset(capacity) + kPeerBlocks * sizeof(uint32_t); }

PeerAllReduceArgs PeerArgsOf(std::span<void* const> regions, int rank, size_t capacity, const uint32_t* abort) {
  PeerAllReduceArgs a;
  a.rank = rank;
  a.ranks = static_cast<int>(regions.size());
  a.capacity = capacity;
  a.abort = abort;
  for (size_t r = 0; r < regions.size() && r < kPeerMaxRanks; ++r) {
    char* base = static_cast<char*>(regions[r]);
    a.buffers[r] = reinterpret_cast<float*>(base);
    a.flags[r] = reinterpret_cast<uint32_t*>(base + FlagsOffset(capacity));
  }
  a.counters = reinterpret_cast<uint32_t*>(static_cast<char*>(regions[static_cast<size_t>(rank)]) + CountersOffset(capacity));
  return a;
}

cudaError_t LaunchPeerAllReduce(const PeerAllReduceArgs& a, float* data, size_t n, cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (n > a.capacity || a.ranks < 1 || a.ranks > kPeerMaxRanks) return cudaErrorInvalidValue;
  PeerAllReduceKernel<<<kPeerBlocks, kThreads, 0, s>>>(a, data, n);
  return cudaGetLastError();
}

cudaError_t LaunchPeerAllGather(const PeerAllReduceArgs& a, const float* send, size_t n, float* recv,
                                cudaStream_t s) {
  if (n == 0) return cudaSuccess;
  if (n > a.capacity || a.ranks < 1 || a.ranks > kPeerMaxRanks) return cudaErrorInvalidValue;
  PeerAllGatherKernel<<<kPeerBlocks, kThreads, 0, s>>>(a, send, n, recv);
  return cudaGetLastError();
}

Result<std::unique_ptr<PeerAllReduce>> PeerAllReduce::Make(RendezvousStore& store, const std::string& tag, int rank,
                                                           int ranks, size_t capacity, std::string* why_not) {
  auto off = [&](std::string why) -> Result<std::unique_ptr<PeerAllReduce>> {
    if (why_not != nullptr) *why_not = std::move(why);
    return std::unique_ptr<PeerAllReduce>();
  };
  if (ranks < 2 || ranks > kPeerMaxRanks) {
    return off(std::to_string(ranks) + " ranks (the peer all-reduce takes 2 to " + std::to_string(kPeerMaxRanks) + ")");
  }
  const std::string who = "peer all-reduce (rank " + std::to_string(rank) + " of " + std::to_string(ranks) + ")";
  auto cuda = [&](cudaError_t e, const char* what) -> Status {
    if (e == cudaSuccess) return Status::Ok();
    return Internal(who + ": " + what + ": " + cudaGetErrorString(e));
  };
  std::unique_ptr<PeerAllReduce> p(new PeerAllReduce);
  int device = 0;
  KIMIRT_RETURN_IF_ERROR(cuda(cudaGetDevice(&device), "cudaGetDevice"));
  const size_t bytes = PeerRegionBytes(capacity);
  KIMIRT_RETURN_IF_ERROR(cuda(cudaMalloc(&p->region_, bytes), "cudaMalloc (the region)"));
  // Zeroed before the handle is published: no peer writes a flag before every rank has.
  KIMIRT_RETURN_IF_ERROR(cuda(cudaMemset(p->region_, 0, bytes), "cudaMemset"));
  KIMIRT_RETURN_IF_ERROR(cuda(cudaDeviceSynchronize(), "cudaDeviceSynchronize"));
  KIMIRT_RETURN_IF_ERROR(
      cuda(cudaHostAlloc(reinterpret_cast<void**>(&p->abort_host_), sizeof(uint32_t), cudaHostAllocMapped),
           "cudaHostAlloc (the abort word)"));
  *p->abort_host_ = 0;
  uint32_t* abort_device = nullptr;
  KIMIRT_RETURN_IF_ERROR(cuda(cudaHostGetDevicePointer(reinterpret_cast<void**>(&abort_device), p->abort_host_, 0),
                              "cudaHostGetDevicePointer"));

  Published mine;
  KIMIRT_RETURN_IF_ERROR(cuda(cudaIpcGetMemHandle(&mine.handle, p->region_), "cudaIpcGetMemHandle"));
  mine.address = reinterpret_cast<uint64_t>(p->region_);
  mine.pid = static_cast<int32_t>(getpid());
  mine.device = device;
  mine.host = HostIdentity();
  const std::string prefix = "peer-ar/" + tag + "/";
  KIMIRT_RETURN_IF_ERROR(store.Set(prefix + std::to_string(rank), Encode(mine)));
  std::vector<Published> all;
  for (int r = 0; r < ranks; ++r) {
    const std::string key = prefix + std::to_string(r);
    Result<std::string> v = store.Get(key);
    if (!v.ok()) return v.status().WithContext(who);
    KIMIRT_ASSIGN_OR_RETURN(Published q, Decode(*v, key));
    all.push_back(std::move(q));
  }
  // Map every peer's region: a thread of this process by its address (with peer access between
  // the two devices where they differ), another process by its handle.
  std::string failed;
  std::vector<void*> regions(static_cast<size_t>(ranks), nullptr);
  p->mapped_.assign(static_cast<size_t>(ranks), nullptr);
  for (int r = 0; r < ranks && failed.empty(); ++r) {
    const Published& q = all[static_cast<size_t>(r)];
    if (q.host != mine.host) {
      failed = "rank " + std::to_string(r) + " is on host " + q.host + ", rank " + std::to_string(rank) + " on " +
               mine.host;
    } else if (r == rank) {
      regions[static_cast<size_t>(r)] = p->region_;
    } else if (q.pid == mine.pid) {
      if (q.device != device) {
        const cudaError_t e = cudaDeviceEnablePeerAccess(q.device, 0);
        if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
          failed = "device " + std::to_string(device) + " cannot map device " + std::to_string(q.device) + ": " +
                   cudaGetErrorString(e);
        }
        cudaGetLastError();  // AlreadyEnabled is not an error here
      }
      regions[static_cast<size_t>(r)] = reinterpret_cast<void*>(q.address);
    } else {
      void* m = nullptr;
      const cudaError_t e = cudaIpcOpenMemHandle(&m, q.handle, cudaIpcMemLazyEnablePeerAccess);
      if (e != cudaSuccess) {
        cudaGetLastError();
        failed = "rank " + std::to_string(rank) + " cannot map rank " + std::to_string(r) + "'s memory: " +
                 cudaGetErrorString(e);
      } else {
        p->mapped_[static_cast<size_t>(r)] = m;
        regions[static_cast<size_t>(r)] = m;
      }
    }
  }
  // Every rank takes the path only if all can: one rank's failure turns it off everywhere.
  KIMIRT_RETURN_IF_ERROR(store.Set(prefix + std::to_string(rank) + "/ok", failed.empty() ? "1" : "0" + failed));
  for (int r = 0; r < ranks; ++r) {
    Result<std::string> v = store.Get(prefix + std::to_string(r) + "/ok");
    if (!v.ok()) return v.status().WithContext(who);
    if (failed.empty() && (v->empty() || (*v)[0] != '1')) failed = v->empty() ? "rank " + std::to_string(r) : v->substr(1);
  }
  if (!failed.empty()) return off(failed);  // the destructor closes and frees
  p->args_ = PeerArgsOf(regions, rank, capacity, abort_device);
  return Result<std::unique_ptr<PeerAllReduce>>(std::move(p));
}

PeerAllReduce::~PeerAllReduce() {
  if (region_ != nullptr && args_.ranks > 1 && abort_host_ != nullptr && *abort_host_ == 0) {
    // Before this rank's region goes, every peer must be done reading it: one more barrier on a
    // stream of its own, bounded: a peer is inside its last call for microseconds after this
    // rank's ended, so 2 s only ever runs out where a peer is gone (then it costs 2 s, not a hang).
    cudaStream_t s = nullptr;
    if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) == cudaSuccess) {
      PeerFinalBarrierKernel<<<kPeerBlocks, kThreads, 0, s>>>(args_, 2'000'000'000ull);
      cudaStreamSynchronize(s);
      cudaStreamDestroy(s);
    }
    cudaGetLastError();
  }
  for (void* m : mapped_) {
    if (m != nullptr) cudaIpcCloseMemHandle(m);
  }
  if (region_ != nullptr) cudaFree(region_);
  if (abort_host_ != nullptr) cudaFreeHost(abort_host_);
}

std::string PeerAllReduce::DescribeState() const {
  const int me = args_.rank;
  // Where a copy does not finish, its destination must outlive it: the buffers are freed only
  // after it did (else released, a few KB, on a path that ends in a test's failure).
  auto counters = std::make_unique<std::vector<uint32_t>>(kPeerBlocks);
  auto flags = std::make_unique<std::vector<uint32_t>>(kPeerBlocks * kPeerMaxRanks);
  cudaStream_t s = nullptr;
  if (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking) != cudaSuccess) {
    cudaGetLastError();
    return "rank " + std::to_string(me) + ": no stream to read the state";
  }
  cudaMemcpyAsync(counters->data(), args_.counters, counters->size() * 4, cudaMemcpyDeviceToHost, s);
  cudaMemcpyAsync(flags->data(), args_.flags[me], flags->size() * 4, cudaMemcpyDeviceToHost, s);
  // Bounded: a copy queued behind a spinning kernel would never end.
  cudaError_t e = cudaErrorNotReady;
  for (int i = 0; i < 2000 && e == cudaErrorNotReady; ++i) {
    e = cudaStreamQuery(s);
    if (e == cudaErrorNotReady) usleep(1000);
  }
  cudaStreamDestroy(s);  // released once its work is done
  if (e != cudaSuccess) {
    cudaGetLastError();
    counters.release();  // still the copy's destination
    flags.release();
    return "rank " + std::to_string(me) + ": the state copy did not finish (" + cudaGetErrorString(e) + ")";
  }
  // Appended piece by piece (GCC 12 warns falsely on `" " + std::to_string(...)`).
  std::string out = "rank " + std::to_string(me) + " counters:";
  for (uint32_t c : *counters) out.append(1, ' ').append(std::to_string(c));
  for (int r = 0; r < args_.ranks; ++r) {
    if (r == me) continue;
    out.append("\n  flags from rank ").append(std::to_string(r)).append(":");
    for (int b = 0; b < kPeerBlocks; ++b) {
      out.append(1, ' ').append(std::to_string((*flags)[static_cast<size_t>(b * kPeerMaxRanks + r)]));
    }
  }
  return out;
}

void PeerAllReduce::Abort() {
  if (abort_host_ != nullptr) __atomic_store_n(abort_host_, 1u, __ATOMIC_RELEASE);
}

}  // namespace kimirt
