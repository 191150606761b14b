// cp_async.cuh's copies in the host emulation of decode_gemm.cu (see ../decode_gemm_group_emulate.sh,
// which includes this in its place). Unlike the KDA chunk and MLA decode emulations' plain copies,
// each thread's copies wait in its queue, in commit groups, and land only when a CpAsyncWait<N>
// leaves at most N groups pending: the latest moment the device may land them, so a read before
// its wait, a missing wait or barrier, or a copy into the wrong buffer reads the old contents.
// (Copies landing early, over data a warp still reads, are not modelled.) Each of a block's
// threads has its queues (shim.h's PerThread); a kernel leaves them empty.
#pragma once
#include <cstring>
#include <vector>

#include "shim.h"  // PerThread

namespace kimirt::cuda {

struct CpAsyncCopy {
  void* dst;
  const void* src;  // nullptr: zeros (src-size 0)
};
inline PerThread<std::vector<CpAsyncCopy>> g_cp_open;
inline PerThread<std::vector<std::vector<CpAsyncCopy>>> g_cp_groups;

inline void CpAsync16(void* dst, const void* src, bool valid = true) { g_cp_open->push_back({dst, valid ? src : nullptr}); }
inline void CpAsyncCommit() {
  g_cp_groups->push_back(std::move(*g_cp_open));
  g_cp_open->clear();
}
template <int kPending>
void CpAsyncWait() {
  while (g_cp_groups->size() > static_cast<size_t>(kPending)) {
    for (const CpAsyncCopy& c : g_cp_groups->front()) {
      if (c.src) {
        std::memcpy(c.dst, c.src, 16);
      } else {
        std::memset(c.dst, 0, 16);
      }
    }
    g_cp_groups->erase(g_cp_groups->begin());
  }
}

}  // namespace kimirt::cuda
