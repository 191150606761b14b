// What decode_gemm.cu needs beyond ../kda_chunk_emulation/shim.h in its host emulation (see
// ../decode_gemm_group_emulate.sh): BF16 conversions as the device does them, dim3 and blockDim,
// dynamic shared memory, the runtime's function attributes, and pdl.cuh's launch, which runs a
// kernel's blocks (grids of up to three dimensions) one after another (cp.async:
// cp_async_host.h). A block of 128 threads (the GEMM's, and the MoE decode's: MMAs are
// warp-collective, the GEMM's x staging has __syncthreads) runs as 128 fibers
// (shim.h's warp and block barriers), a one-warp block (the MoE grouping's) as 32; other
// blocks (SplitXKernel, the sums: grid-stride loops with no barriers) run their threads in turn
// on the calling thread.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda_bf16.h"
#include "shim.h"

#define __grid_constant__
using std::isfinite;

struct __nv_bfloat16 {
  uint16_t bits;
};
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  if (std::isnan(f)) return {0x7fff};
  return {BfRn(f)};
}
inline float __bfloat162float(__nv_bfloat16 b) { return BfToF(b.bits); }
inline uint16_t __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }

struct dim3 {
  unsigned x, y, z;
  dim3(unsigned a = 1, unsigned b = 1, unsigned c = 1) : x(a), y(b), z(c) {}
};
inline Dim3 blockDim;

// The runtime calls decode_gemm.cu makes for its shared memory: the dynamic size a kernel was
// allowed is recorded, and the launch below refuses more than that (or than 48 KB unasked), as
// the device does.
enum cudaError_t { cudaSuccess = 0 };
enum cudaFuncAttribute { cudaFuncAttributeMaxDynamicSharedMemorySize, cudaFuncAttributePreferredSharedMemoryCarveout };
constexpr int cudaSharedmemCarveoutMaxShared = 100;
inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
inline cudaError_t cudaGetDevice(int* d) {
  *d = 0;
  return cudaSuccess;
}
inline std::map<const void*, size_t> g_smem_allowed;  // kernel → its MaxDynamicSharedMemorySize
inline int g_attr_calls = 0;                           // cudaFuncSetAttribute calls (once per kernel)
template <typename Kernel>
cudaError_t cudaFuncSetAttribute(Kernel* kernel, cudaFuncAttribute attr, int value) {
  ++g_attr_calls;  // host code: one thread
  if (attr == cudaFuncAttributeMaxDynamicSharedMemorySize) {
    g_smem_allowed[reinterpret_cast<const void*>(kernel)] = static_cast<size_t>(value);
  }
  return cudaSuccess;
}

// Dynamic shared memory: the running block's buffer (the script turns the kernel's
// `extern __shared__ uint4 x_smem[]` into this pointer), filled with 0xff bytes (BF16 NaNs) at the
// start of each block, so a read of a chunk no copy wrote shows as NaN.
inline uint4* g_dyn_smem;

namespace kimirt::cuda {

inline void PdlWait() {}
inline void PdlTrigger() {}
inline void PdlEnter() {}

inline int g_launches = 0;  // kernels launched (the driver counts a group's)

template <typename... Params, typename... Args>
void LaunchPdl(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, void*,
               Args&&... args) {
  ++g_launches;
  const auto allowed = g_smem_allowed.find(reinterpret_cast<const void*>(kernel));
  if (smem > (allowed == g_smem_allowed.end() ? size_t{48 * 1024} : allowed->second)) {
    std::fprintf(stderr, "%s: %zu bytes of dynamic shared memory, not allowed (cudaFuncSetAttribute)\n", what, smem);
    std::abort();
  }
  std::vector<uint4> shared((smem + sizeof(uint4) - 1) / sizeof(uint4));
  const std::tuple<Params...> params(static_cast<Params>(args)...);
  for (unsigned b = 0; b < grid.x * grid.y * grid.z; ++b) {
    blockIdx = {b % grid.x, b / grid.x % grid.y, b / grid.x / grid.y};
    gridDim = {grid.x, grid.y, grid.z};
    blockDim = {block.x, 1, 1};
    g_dyn_smem = shared.data();
    if (!shared.empty()) std::memset(shared.data(), 0xff, shared.size() * sizeof(uint4));
    if (block.x == 128 || block.x == 32) {  // warp collectives: the lanes as threads
      BlockCtx ctx(static_cast<int>(block.x));
      g_ctx = &ctx;
      RunBlockThreads(block.x, [&](unsigned) { std::apply(kernel, params); });
    } else {
      for (unsigned tx = 0; tx < block.x; ++tx) {
        threadIdx = {tx, 0, 0};
        std::apply(kernel, params);
      }
    }
  }
}

inline void CheckLaunch(const char*) {}

}  // namespace kimirt::cuda
