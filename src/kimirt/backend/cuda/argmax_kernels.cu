// Greedy decoding's pick per row of F32 logits, on the device (Backend::ArgmaxRows): the rules
// of core/argmax.h — the lowest index of the largest value, NaN as -inf, -1 when every value is
// -inf or NaN — so the token equals what the sampler picks from the downloaded row. Comparisons
// only (no arithmetic): the result is exact, whatever the order of the reduction.
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <climits>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 256;
// Blocks per row: a 163,840-wide row is 655 KB, too much for one block's bandwidth at batch 1;
// 16 blocks took 5 µs for it (Nsight Compute), a thread's 40 loads in turn; 128 take 5 each.
constexpr int kSplits = 128;

struct Best {
  float v;
  int i;  // INT_MAX while v is -inf (nothing found)
};

// b beats a: larger, or as large at a lower index (+0 == -0, so both zeros tie).
__device__ inline Best Better(Best a, Best b) { return (b.v > a.v || (b.v == a.v && b.i < a.i)) ? b : a; }

__device__ inline Best WarpBest(Best x) {
  for (int off = 16; off > 0; off >>= 1) {
    Best o{__shfl_xor_sync(0xffffffffu, x.v, off), __shfl_xor_sync(0xffffffffu, x.i, off)};
    x = Better(x, o);
  }
  return x;
}

// Block (split s, row r) over columns [s·chunk, (s+1)·chunk): its best into part[r·kSplits + s].
__global__ void ArgmaxPartKernel(const float* x, int64_t V, int64_t chunk, Best* part) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t r = blockIdx.y, begin = blockIdx.x * chunk, end = min(V, begin + chunk);
  const float* row = x + r * V;
  Best b{-INFINITY, INT_MAX};
  // Ascending per thread and a strict >: a thread keeps the first of equal values it sees
  // (NaN > anything is false, so NaN is never taken).
  for (int64_t j = begin + threadIdx.x; j < end; j += blockDim.x) {
    const float v = row[j];
    if (v > b.v) b = Best{v, static_cast<int>(j)};
  }
  b = WarpBest(b);
  __shared__ Best warps[kThreads / 32];
  if ((threadIdx.x & 31) == 0) warps[threadIdx.x >> 5] = b;
  __syncthreads();
  if (threadIdx.x < 32) {
    Best w = threadIdx.x < kThreads / 32 ? warps[threadIdx.x] : Best{-INFINITY, INT_MAX};
    w = WarpBest(w);
    if (threadIdx.x == 0) part[r * kSplits + blockIdx.x] = w;
  }
}

// One warp per row over its kSplits parts (Better is a total order, so any grouping gives the
// same pick).
__global__ void ArgmaxFinishKernel(const Best* part, int64_t R, int32_t* ids) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t r = blockIdx.x;
  Best b{-INFINITY, INT_MAX};
  for (int j = threadIdx.x; j < kSplits; j += 32) b = Better(b, part[r * kSplits + j]);
  b = WarpBest(b);
  if (threadIdx.x == 0) ids[r] = b.v == -INFINITY ? -1 : b.i;
}

}  // namespace

size_t ArgmaxRowsScratchBytes(int64_t R) { return static_cast<size_t>(R) * kSplits * sizeof(Best); }

void ArgmaxRows(const float* x, int64_t R, int64_t V, void* scratch, int32_t* ids, cudaStream_t s) {
  if (R == 0) return;
  if (V <= 0 || V > INT_MAX || R > 65535) {
    std::fprintf(stderr, "kimirt: ArgmaxRows takes 1..%d columns and up to 65535 rows, got [%lld, %lld]\n", INT_MAX,
                 static_cast<long long>(R), static_cast<long long>(V));
    std::abort();
  }
  const int64_t chunk = (V + kSplits - 1) / kSplits;
  Best* part = static_cast<Best*>(scratch);
  LaunchPdl("ArgmaxPart", ArgmaxPartKernel, dim3(kSplits, static_cast<unsigned>(R)), dim3(kThreads), 0, s, x, V, chunk, part);
  CheckLaunch("ArgmaxPart");
  LaunchPdl("ArgmaxFinish", ArgmaxFinishKernel, dim3(static_cast<unsigned>(R)), dim3(32), 0, s, part, R, ids);
  CheckLaunch("ArgmaxFinish");
}

}  // namespace kimirt::cuda
