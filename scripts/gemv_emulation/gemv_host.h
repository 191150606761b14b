// What weight_kernels.cu's Gemv needs beyond ../kda_chunk_emulation/shim.h in its host emulation
// (see ../gemv_emulate.sh): kernels.h's few names, cp.async that lands only when a wait says it
// must (so a read before its wait, or a copy into a slot still being read, shows up as wrong bits
// or NaN), the bulk L2 prefetch as a range check, and a launch that runs each block as 256
// fibers (shim.h's RunBlockThreads) with its own NaN-filled dynamic shared memory, one block after another.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "cuda_runtime.h"
#include "shim.h"

#undef __launch_bounds__
#define __launch_bounds__(...)
#define __host__

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline Dim3 blockDim;
inline float __fmaf_rn(float a, float b, float c) { return std::fmaf(a, b, c); }
using std::min;

enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize = 8, cudaFuncAttributePreferredSharedMemoryCarveout = 9 };
constexpr int cudaSharedmemCarveoutMaxShared = 100;
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
template <typename F>
cudaError_t cudaFuncSetAttribute(F, cudaFuncAttribute, int) { return cudaSuccess; }
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }

// The device buffers a kernel may read (the driver registers x and w) and the block's dynamic
// shared memory: every copy and prefetch must stay inside them, 16-byte aligned.
struct Range {
  const char* begin;
  size_t bytes;
};
inline std::vector<Range> g_inputs;
inline float* g_smem = nullptr;
inline size_t g_smem_bytes = 0;
inline void Fail(const char* what) {
  std::fprintf(stderr, "emulation: %s\n", what);
  std::abort();
}
inline void CheckInput(const void* p, size_t bytes, const char* what) {
  const char* c = static_cast<const char*>(p);
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0 || bytes % 16 != 0) Fail(what);
  for (const Range& r : g_inputs) {
    if (c >= r.begin && c + bytes <= r.begin + r.bytes) return;
  }
  Fail(what);
}

// cp.async: each thread's copies wait in groups; CpAsyncWait<N> lands all but the newest N
// groups, CpAsyncWaitAll all of them.
struct Copy {
  void* dst;
  const void* src;
};
inline PerThread<std::vector<std::vector<Copy>>> t_groups;
inline PerThread<std::vector<Copy>> t_open;
inline void CpAsync16(void* dst, const void* src) {
  CheckInput(src, 16, "cp.async source outside x and w, or unaligned");
  const char* d = static_cast<const char*>(dst);
  const char* s = reinterpret_cast<const char*>(g_smem);
  if (reinterpret_cast<uintptr_t>(dst) % 16 != 0 || d < s || d + 16 > s + g_smem_bytes) {
    Fail("cp.async destination outside the dynamic shared memory, or unaligned");
  }
  t_open->push_back({dst, src});
}
inline void CpAsyncCommit() {
  t_groups->push_back(std::move(*t_open));
  t_open->clear();
}
inline void LandOldest(size_t keep) {
  while (t_groups->size() > keep) {
    for (const Copy& c : t_groups->front()) std::memcpy(c.dst, c.src, 16);
    t_groups->erase(t_groups->begin());
  }
}
template <int N>
inline void CpAsyncWait() {
  LandOldest(N);
}
inline void CpAsyncWaitAll() {
  if (!t_open->empty()) Fail("cp.async copies never committed");
  LandOldest(0);
}

namespace kimirt::cuda {

constexpr int64_t kGemvMaxRows = 64;
inline float WeightAt(const void* w, int64_t i, bool bf16) {
  if (bf16) return __uint_as_float(static_cast<unsigned>(static_cast<const unsigned short*>(w)[i]) << 16);
  return static_cast<const float*>(w)[i];
}
inline void CheckLaunch(const char*) {}
inline void PdlWait() {}
inline void PdlTrigger() {}

namespace mma {
inline void PrefetchL2(const void* p, uint32_t bytes) { CheckInput(p, bytes, "L2 prefetch outside w, or unaligned"); }
}  // namespace mma

inline int g_launches = 0;

template <typename... Params, typename... Args>
void LaunchPdl(const char*, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t,
               Args&&... args) {
  ++g_launches;
  if (block.x != 256 || grid.z != 1) Fail("a Gemv block is 256 threads, the grid at most two-dimensional");
  const std::tuple<Params...> params(static_cast<Params>(args)...);
  std::vector<float> shared(smem / sizeof(float) + 1, std::numeric_limits<float>::quiet_NaN());
  for (unsigned b = 0; b < grid.x * grid.y; ++b) {
    const unsigned bx = b % grid.x, by = b / grid.x;
    std::fill(shared.begin(), shared.end(), std::numeric_limits<float>::quiet_NaN());
    g_smem = shared.data();
    g_smem_bytes = smem;
    BlockCtx ctx;
    g_ctx = &ctx;
    blockIdx = {bx, by, 0};
    gridDim = {grid.x, grid.y, 1};
    blockDim = {block.x, 1, 1};
    RunBlockThreads(block.x, [&](unsigned) {
      std::apply(kernel, params);
      if (!t_open->empty() || !t_groups->empty()) Fail("cp.async copies left in flight at the kernel's end");
    });
  }
}

}  // namespace kimirt::cuda
