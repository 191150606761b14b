// What tc_tile.cuh needs beyond ../kda_chunk_emulation/shim.h in its host emulation (see
// ../tc_tile_emulate.sh): the block's shared memory as one buffer addressed by 32-bit offsets
// (SharedAddr), cp.async to such offsets — each thread's copies queued in commit groups and landed
// only when a CpAsyncWait<N> leaves at most N groups pending, as cp_async_host.h does for the
// decode GEMM — ldmatrix at an offset, and the few conversions the decode uses.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "shim.h"

using cudaStream_t = void*;

inline unsigned char* g_smem;  // the running block's shared memory (one block at a time)

inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float __int_as_float(int i) {
  float f;
  std::memcpy(&f, &i, 4);
  return f;
}

namespace kimirt::cuda {

struct TcCopy {
  uint32_t dst;       // offset in g_smem
  const void* src;    // nullptr: zeros (src-size 0)
  int bytes;
};
inline PerThread<std::vector<TcCopy>> g_tc_open;
inline PerThread<std::vector<std::vector<TcCopy>>> g_tc_groups;
inline void TcCopyAsync(uint32_t dst, const void* src, bool valid, int bytes) {
  g_tc_open->push_back({dst, valid ? src : nullptr, bytes});
}
inline void CpAsync16(uint32_t dst, const void* src, bool valid = true) { TcCopyAsync(dst, src, valid, 16); }
inline void CpAsync4(uint32_t dst, const void* src, bool valid = true) { TcCopyAsync(dst, src, valid, 4); }
inline void CpAsyncCommit() {
  g_tc_groups->push_back(std::move(*g_tc_open));
  g_tc_open->clear();
}
template <int kPending>
void CpAsyncWait() {
  while (g_tc_groups->size() > static_cast<size_t>(kPending)) {
    for (const TcCopy& c : g_tc_groups->front()) {
      if (c.src != nullptr) {
        std::memcpy(g_smem + c.dst, c.src, static_cast<size_t>(c.bytes));
      } else {
        std::memset(g_smem + c.dst, 0, static_cast<size_t>(c.bytes));
      }
    }
    g_tc_groups->erase(g_tc_groups->begin());
  }
}

}  // namespace kimirt::cuda
