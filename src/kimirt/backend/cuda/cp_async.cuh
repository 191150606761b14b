// Asynchronous global → shared copies (PTX ISA "cp.async"), shared by the kernels that stage
// tiles through shared memory: the copy holds no register while in flight, and `valid` false
// writes zeros and reads nothing (src-size 0; `src` need only be some valid address), so rows
// past a sequence's or a matrix's end are zeros, never garbage. 16 bytes go through L2 only
// (.cg: streamed data), 8 and 4 through L1 as well (.ca: the only form for those sizes).
#pragma once

#include <cstdint>

namespace kimirt::cuda {

__device__ __forceinline__ uint32_t SharedAddress(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid = true) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync16(void* dst, const void* src, bool valid = true) {
  CpAsync16(SharedAddress(dst), src, valid);
}
__device__ __forceinline__ void CpAsync8(void* dst, const void* src, bool valid = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(SharedAddress(dst)), "l"(src),
               "r"(valid ? 8 : 0)
               : "memory");
}
__device__ __forceinline__ void CpAsync4(uint32_t dst, const void* src, bool valid = true) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
}
__device__ __forceinline__ void CpAsync4(void* dst, const void* src, bool valid = true) {
  CpAsync4(SharedAddress(dst), src, valid);
}

// One group per commit; a wait leaves at most kPending of this thread's newest groups in flight.
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}
__device__ __forceinline__ void CpAsyncWaitAll() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

}  // namespace kimirt::cuda
