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

// L2 cache policies (PTX createpolicy) for the hinted loads and stores below: evict_first for data
// read once, evict_last for data read back soon. Not for cp.async: its .L2::cache_hint form trapped
// as an illegal instruction on an H100 under every policy, created or constant, where ld and st
// took all of them (session 33, bench/l2_hint_bench.cu; the cp.async hints of trial 975177e
// crashed every MLA decode through the combine).
enum class L2Hint { kEvictFirst, kEvictLast };
__device__ __forceinline__ uint64_t L2Policy(L2Hint hint) {
  uint64_t p;
  if (hint == L2Hint::kEvictFirst) {
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
  } else {
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;\n" : "=l"(p));
  }
  return p;
}
// A 4-byte global load under an L2 policy.
__device__ __forceinline__ float LoadHinted(const float* src, uint64_t policy) {
  float v;
  asm volatile("ld.global.L2::cache_hint.f32 %0, [%1], %2;\n" : "=f"(v) : "l"(src), "l"(policy) : "memory");
  return v;
}
// An 8-byte global store under an L2 policy.
__device__ __forceinline__ void StoreHinted(float2* dst, float2 v, uint64_t policy) {
  asm volatile("st.global.L2::cache_hint.v2.f32 [%0], {%1, %2}, %3;\n" ::"l"(dst), "f"(v.x), "f"(v.y), "l"(policy)
               : "memory");
}

}  // namespace kimirt::cuda
