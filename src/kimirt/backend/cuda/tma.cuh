// Hopper's tensor memory accelerator (TMA) and the shared-memory barriers its copies complete on
// (PTX ISA sm_90: cp.async.bulk.tensor, mbarrier). One thread asks for a whole box of a 2-D
// tensor — rows × 64 BF16 columns land in a 128-byte-swizzled panel, the layout our wgmma
// descriptors read (wgmma.cuh, SwizzledOffset) — and the consumers wait on the barrier for its
// bytes: no copy instructions in the consumers' warps, and one barrier a box instead of a
// block-wide __syncthreads. The box loads are used by tma_stream_bench (bench/) and TmaTest (the
// seesaw MLA decode split built on them: trial fee8584, reverted, docs/cuda.md "The seesaw
// split"); the barriers also hand tiles between the warpgroups of the warp-specialized MLA decode
// split (mla_decode_ws.cu). tma.h makes the tensor maps on the host.
#pragma once

#include <cuda.h>  // CUtensorMap (a 128-byte descriptor passed as a __grid_constant__ kernel parameter)

#include <cstdint>

namespace kimirt::cuda::tma {

// A barrier at shared address `bar` (8 bytes, 8-aligned) that completes a phase when `count`
// threads have arrived and every byte they announced (ArriveExpectTx) has landed.
__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes barrier initializations visible to the async proxy (the TMA unit); then a __syncthreads.
__device__ __forceinline__ void FenceMbarInit() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
// This thread arrives and announces `bytes` more to land before the phase completes.
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// This thread arrives (a consumer letting the producer refill what the barrier guards).
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
// Waits until the phase of parity `parity` (0 for the first, then 1, 0, ...) has completed.
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// The box of `map` whose first element is column x, row y, into shared memory at dst (for a
// 128-byte swizzle, a multiple of 1,024), completing on barrier `bar`. Elements outside the
// tensor land as zeros (and still count as bytes).
__device__ __forceinline__ void Load2D(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t x, int32_t y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y)
      : "memory");
}

// Load2D under an L2 policy (createpolicy; cp_async.cuh's L2Policy): a stream read once, asked
// evict-first, leaves L2 to what is read again.
__device__ __forceinline__ void Load2DHinted(uint32_t dst, const CUtensorMap* map, uint32_t bar, int32_t x, int32_t y,
                                             uint64_t policy) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, {%3, %4}], [%2], %5;\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(x), "r"(y), "l"(policy)
      : "memory");
}

}  // namespace kimirt::cuda::tma
