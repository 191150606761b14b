// Named barriers (PTX ISA bar.sync / bar.arrive): a barrier that only some warps of a block take
// part in, and where some of them only signal. A producer warpgroup arrives (and goes on) and a
// consumer warpgroup syncs (and waits until every producer thread has arrived); ids 1 .. 15 (0 is
// __syncthreads'). The MLA decode seesaw (mla_decode_seesaw.cu) passes its softmax scales and
// its probability tiles between its two warpgroups this way.
#pragma once

namespace kimirt::cuda {

// Waits until `threads` threads (a multiple of 32, counting this warp) have arrived at barrier `id`.
__device__ __forceinline__ void NamedSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
// Counts this warp towards barrier `id`'s `threads` without waiting: the shared-memory writes
// before it are visible to the threads that pass the barrier's NamedSync.
__device__ __forceinline__ void NamedArrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

}  // namespace kimirt::cuda
