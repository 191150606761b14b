// Weights asked into L2 ahead of the GEMMs that read them (kernels.h PrefetchL2Ranges;
// Backend::PrefetchWeights; issue 12).
//
// Why: a batch-1 decode layer alternates weight GEMMs, which stream HBM, with chains of small
// kernels (norms, the router's top-k and grouping, the KDA step, the combine, split sums) that are
// latency-bound and leave HBM idle: ~40 µs of a ~110 µs Kimi-Linear-48B layer (Nsight Compute,
// fourteenth session). A bulk prefetch issued at the start of such a chain fills that idle time
// with the next GEMM's weight, so the GEMM then reads part of it from L2.
//
// The kernel runs beside the decode chain, on a stream of its own (CudaBackend::PrefetchWeights
// forks it off and joins it back before a graph's capture ends), never in it: as one 256-thread
// PDL kernel in the chain it made the whole 48B's batch-1 step 2.85 → 9.77 ms at 32 MB a call,
// ~86 µs a call (80 calls) — so one block's prefetches go out at only a few hundred GB/s, likely
// its multiprocessor's bulk-copy unit (inferred from the step time, not measured apart). Spread
// over blocks of one warp, each asks for a few 16 KB pieces (16 MB a call: 4-9 µs under Nsight
// Compute, serialized).
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/mma_bf16.cuh"

#include <algorithm>

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 32;
constexpr int kMaxBlocks = 128;
constexpr int64_t kChunk = 16 * 1024;  // bytes a prefetch

struct L2Ranges {
  L2Range r[kMaxL2Ranges];
  int count;
};

__global__ void __launch_bounds__(kThreads) PrefetchL2Kernel(const __grid_constant__ L2Ranges a) {
  const int64_t first = (int64_t{blockIdx.x} * kThreads + threadIdx.x) * kChunk;
  const int64_t stride = int64_t{gridDim.x} * kThreads * kChunk;
  for (int i = 0; i < a.count; ++i) {
    const char* p = static_cast<const char*>(a.r[i].p);
    const int64_t bytes = a.r[i].bytes;
    for (int64_t at = first; at < bytes; at += stride) {
      const int64_t len = bytes - at < kChunk ? bytes - at : kChunk;
      mma::PrefetchL2(p + at, static_cast<uint32_t>(len));
    }
  }
}

}  // namespace

void PrefetchL2Ranges(const L2Range* ranges, int count, cudaStream_t s) {
  L2Ranges a{};
  for (int i = 0; i < count; ++i) {
    // The bulk prefetch wants a 16-byte aligned address and a multiple of 16 bytes.
    const auto begin = (reinterpret_cast<uintptr_t>(ranges[i].p) + 15) & ~uintptr_t{15};
    const auto end = (reinterpret_cast<uintptr_t>(ranges[i].p) + static_cast<uintptr_t>(ranges[i].bytes)) & ~uintptr_t{15};
    if (end <= begin || a.count == kMaxL2Ranges) continue;
    a.r[a.count++] = L2Range{reinterpret_cast<const void*>(begin), static_cast<int64_t>(end - begin)};
  }
  if (a.count == 0) return;
  int64_t chunks = 0;
  for (int i = 0; i < a.count; ++i) chunks = std::max(chunks, (a.r[i].bytes + kChunk - 1) / kChunk);
  const auto blocks = static_cast<unsigned>(std::clamp<int64_t>((chunks + kThreads - 1) / kThreads, 1, kMaxBlocks));
  PrefetchL2Kernel<<<blocks, kThreads, 0, s>>>(a);
  CheckLaunch("PrefetchL2");
}

}  // namespace kimirt::cuda
