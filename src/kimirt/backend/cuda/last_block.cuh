// "The last block done" (the CUDA samples' threadFenceReduction): of the `blocks` blocks that
// write parts of one output tile, the one that finishes last sums them, in the launch that wrote
// them. A decode step's small kernels (a GLU over k slices, a combine over experts and slices)
// each cost a launch, a drain and a PDL wait (~1-3 µs inside a graph, bench/kernel_trace.cpp),
// more than their arithmetic at batch 1; folded into the kernel before them as its tail, the
// sum is the same code in the same order, so the same bits.
//
// Every thread of the block must call LastBlockOf (it synchronizes). The counter is one
// unsigned of device memory, zero before the launch; the last block puts it back to zero, so a
// buffer of counters zeroed once serves every later launch and graph replay on its stream.
#pragma once

#include <cuda_runtime.h>

namespace kimirt::cuda {

__device__ __forceinline__ bool LastBlockOf(unsigned* counter, unsigned blocks) {
  __shared__ unsigned last;
  __threadfence();  // this thread's parts out to the GPU before the block counts itself
  __syncthreads();
  if (threadIdx.x == 0) {
    const unsigned ticket = atomicAdd(counter, 1u);
    last = ticket + 1 == blocks ? 1u : 0u;
    if (last != 0) *counter = 0;  // every other block has counted: nothing reads it this launch
    __threadfence();              // the others' parts, counted before this ticket, are read after it
  }
  __syncthreads();
  return last != 0;
}

// A part another block wrote, read through L2 (never a stale L1 line).
__device__ __forceinline__ float LoadPart(const float* p) { return __ldcg(p); }

}  // namespace kimirt::cuda
