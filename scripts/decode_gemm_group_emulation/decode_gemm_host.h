// What decode_gemm.cu needs beyond ../kda_chunk_emulation/shim.h in its host emulation (see
// ../decode_gemm_group_emulate.sh): BF16 conversions as the device does them, dim3 and blockDim,
// and pdl.cuh's launch, which runs a kernel's blocks one after another. A block of 128 threads
// (the GEMM's: its MMAs are warp-collective) runs as 128 std::threads (shim.h's warp barriers);
// other blocks (SplitXKernel, the sums: grid-stride loops with no barriers) run their threads in
// turn on the calling thread.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
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
inline thread_local Dim3 blockDim;

namespace kimirt::cuda {

inline void PdlWait() {}
inline void PdlTrigger() {}
inline void PdlEnter() {}

inline int g_launches = 0;  // kernels launched (the driver counts a group's)

template <typename... Params, typename... Args>
void LaunchPdl(const char*, void (*kernel)(Params...), dim3 grid, dim3 block, size_t, void*, Args&&... args) {
  ++g_launches;
  const std::tuple<Params...> params(static_cast<Params>(args)...);
  auto run = [&](unsigned bx, unsigned by, unsigned tx) {
    blockIdx = {bx, by, 0};
    gridDim = {grid.x, grid.y, 1};
    blockDim = {block.x, 1, 1};
    threadIdx = {tx, 0, 0};
    std::apply(kernel, params);
  };
  for (unsigned by = 0; by < grid.y; ++by) {
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      if (block.x == 128) {
        BlockCtx ctx;
        g_ctx = &ctx;
        std::vector<std::thread> threads;
        for (unsigned tx = 0; tx < block.x; ++tx) threads.emplace_back(run, bx, by, tx);
        for (auto& t : threads) t.join();
      } else {
        for (unsigned tx = 0; tx < block.x; ++tx) run(bx, by, tx);
      }
    }
  }
}

inline void CheckLaunch(const char*) {}

}  // namespace kimirt::cuda
