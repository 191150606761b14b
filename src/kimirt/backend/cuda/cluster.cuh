// Thread-block clusters (sm_90): the cluster barrier and distributed shared memory, for kernels
// that spread one row's work over a cluster of blocks and combine their partial sums by rank.
#pragma once

#include <cuda_runtime.h>

namespace kimirt::cuda {

__device__ inline void ClusterArrive() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }
__device__ inline void ClusterWait() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

// The float at `p` in the shared memory of the cluster's block `rank` (same offset as in this
// block's).
__device__ inline float LoadClusterShared(const float* p, int rank) {
  const unsigned local = static_cast<unsigned>(__cvta_generic_to_shared(p));
  unsigned remote;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(rank));
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(remote) : "memory");
  return v;
}

}  // namespace kimirt::cuda
