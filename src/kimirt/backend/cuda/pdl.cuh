// Programmatic dependent launch (CUDA Programming Guide, "Programmatic Dependent Launch and
// Synchronization"; PTX griddepcontrol, sm_90). A kernel launched with LaunchPdl may start while
// the kernel before it in the stream is still running: the part before PdlWait() must touch
// nothing the earlier kernel writes or reads-then-overwrites (weights, its own constants); after
// PdlWait() the earlier kernel has completed and its writes are visible, as with a plain launch.
// PdlTrigger() in the earlier kernel lets the next one launch once every block of the earlier
// one has passed it (it is a no-op when nothing PDL-launched follows).
//
// Why (issue 12): a decode step is ~25 small kernels a layer; each weight GEMM of 5-20 MB paid a
// ~7 µs floor (launch, the first loads' latency, the tail) beside ~3 µs of HBM time. Started
// early, a GEMM streams its weights into L2 while the norm or sum before it finishes; every
// other kernel of the decode step at least has its launch done when its predecessor ends.
//
// Every kernel launched with LaunchPdl must call PdlWait() before it reads its inputs and before
// it writes anything: then a third kernel that waits on it has also waited on the first.
// KIMIRT_PDL=0 launches plainly (the same kernels; PdlWait is then a no-op), for A/B runs.
//
// Inside a stream capture a programmatic edge "may only be used between kernel nodes"
// (driver_types.h, cudaGraphDependencyTypeProgrammatic): a PDL launch right after a memcpy or
// memset node (a collective's copy under TP, say) has no edge it may take, so there it is
// captured as a plain launch (PdlAllowedOn). Its PdlWait() is then a no-op, as with KIMIRT_PDL=0.
#pragma once

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "kimirt/backend/cuda/env_switch.h"

namespace kimirt::cuda {

__device__ __forceinline__ void PdlWait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void PdlTrigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
// The first statement of a kernel launched with LaunchPdl that prefetches nothing.
__device__ __forceinline__ void PdlEnter() {
  PdlWait();
  PdlTrigger();
}

inline bool PdlEnabled() {
  static const bool on = EnvSwitchOn("KIMIRT_PDL");
  return on;
}

// Whether a launch on `s` may overlap the stream's previous work: KIMIRT_PDL is not 0 and, where
// `s` is capturing, every node the launch would follow is a kernel node (pdl.cu; with
// KIMIRT_PDL_CAPTURE_LOG set, each launch captured plainly is named on stderr).
bool PdlAllowedOn(cudaStream_t s, const char* what);
// A refused launch: aborts naming `what`, the error and, where `s` is capturing, the nodes the
// launch would have followed.
[[noreturn]] void LaunchRefused(const char* what, cudaError_t e, cudaStream_t s);

// kernel<<<grid, block, smem, s>>>(args...) through cudaLaunchKernelEx: blocks in clusters of
// `cluster_x` along x where it is > 1 (sm_90 thread-block clusters), and allowed to overlap the
// stream's previous kernel where `pdl` (and KIMIRT_PDL is not 0); a launch error aborts naming
// `what`, as CheckLaunch does.
template <typename... Params, typename... Args>
void LaunchEx(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
              unsigned cluster_x, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster_x > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster_x;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl && PdlAllowedOn(s, what)) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  const cudaError_t e = cudaLaunchKernelEx(&cfg, kernel, static_cast<Params>(args)...);
  if (e != cudaSuccess) LaunchRefused(what, e, s);
}

// kernel<<<grid, block, smem, s>>>(args...), allowed to overlap the stream's previous kernel.
template <typename... Params, typename... Args>
void LaunchPdl(const char* what, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t s,
               Args&&... args) {
  LaunchEx(what, kernel, grid, block, smem, s, 1, true, std::forward<Args>(args)...);
}

}  // namespace kimirt::cuda
