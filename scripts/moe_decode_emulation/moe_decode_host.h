// What moe_kernels.cu needs beyond ../decode_gemm_group_emulation/decode_gemm_host.h (BF16, dim3,
// pdl.cuh's launch running 128-thread blocks as fibers) and ../kda_chunk_emulation/shim.h
// (the emulated MMA, warp barriers) in its host emulation (see ../moe_decode_emulate.sh):
// __syncwarp as the warp's own barrier (warps of ExpertMmaKernel return early, so a block-wide
// barrier would hang), __byte_perm, mul.rn.bf16x2 (BF16 round to nearest even, subnormals kept),
// `<<<>>>` launches, and the weight loads (and any L2 prefetch: the expert kernels issue none, the
// driver fails on one) checked to stay inside the experts' weights; the router's warp collectives
// (shuffles, ballot, match) and the one-warp grouping's. The block grouping kernels compile but
// are not run here: their shared-memory atomics abort if called.
#pragma once
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "decode_gemm_host.h"

#undef __launch_bounds__
#define __launch_bounds__(...)
#define __restrict__ __restrict

template <class A, class B>
constexpr std::common_type_t<A, B> min(A a, B b) {
  return a < b ? a : b;
}
inline float __int_as_float(int i) { return std::bit_cast<float>(i); }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }

// Byte n of the result is byte (selector nibble n & 7) of {y, x} (x bytes 0..3, y bytes 4..7).
inline uint32_t __byte_perm(uint32_t x, uint32_t y, uint32_t s) {
  const uint64_t in = (uint64_t{y} << 32) | x;
  uint32_t r = 0;
  for (int n = 0; n < 4; ++n) r |= static_cast<uint32_t>((in >> (8 * ((s >> (4 * n)) & 7u))) & 0xffu) << (8 * n);
  return r;
}

// The calling warp's barrier: the lanes of one warp only, like the device's __syncwarp().
inline void __syncwarp() { g_ctx->warp[threadIdx.x / 32]->arrive_and_wait(); }

// Used by the block grouping kernels only, which this emulation does not run.
[[noreturn]] inline void NotEmulated(const char* what) {
  std::fprintf(stderr, "emulation: %s is not emulated (the block grouping kernels are not run here)\n", what);
  std::abort();
}
// The router's warp collectives (MoeRouteWarpKernel: 128-thread blocks, so its lanes are threads
// with the warp barriers of shim.h): each lane puts its 4 bytes in the warp's slots between two
// barriers, then reads the lane it asks for (the next collective's first barrier keeps the slots
// until every lane has read). Float shuffles with xor are shim.h's own.
template <class T>
T WarpRead(T v, int src) {
  static_assert(sizeof(T) == 4);
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_ctx->warp[w]->arrive_and_wait();
  std::memcpy(&g_ctx->shfl[w][l], &v, 4);
  g_ctx->warp[w]->arrive_and_wait();
  T r;
  std::memcpy(&r, &g_ctx->shfl[w][src & 31], 4);
  return r;
}
template <class T>
T __shfl_xor_sync(unsigned, T v, int off) {
  return WarpRead(v, static_cast<int>(threadIdx.x % 32) ^ off);
}
template <class T>
T __shfl_sync(unsigned, T v, int src) {
  return WarpRead(v, src);
}
inline unsigned __ballot_sync(unsigned, int pred) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_ctx->warp[w]->arrive_and_wait();
  g_ctx->shfl[w][l] = pred ? 1.0f : 0.0f;
  g_ctx->warp[w]->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) r |= (g_ctx->shfl[w][i] != 0.0f ? 1u : 0u) << i;
  return r;
}
// The lanes holding the same value as this one (GroupByExpertWarp's 32-thread launch).
inline unsigned __match_any_sync(unsigned, int v) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_ctx->warp[w]->arrive_and_wait();
  std::memcpy(&g_ctx->shfl[w][l], &v, 4);
  g_ctx->warp[w]->arrive_and_wait();
  unsigned r = 0;
  for (int i = 0; i < 32; ++i) {
    int u;
    std::memcpy(&u, &g_ctx->shfl[w][i], 4);
    r |= (u == v ? 1u : 0u) << i;
  }
  return r;
}
inline int __ffs(unsigned v) { return v == 0 ? 0 : std::countr_zero(v) + 1; }
inline int atomicAdd(int*, int) { NotEmulated("atomicAdd"); }
inline int __popc(unsigned v) { return std::popcount(v); }
inline int __clz(unsigned v) { return std::countl_zero(v); }

// mul.rn.bf16x2: each half the product rounded to nearest even as BF16 (8 significant bits,
// subnormals down to 2^-133 kept, past the largest finite value ±inf; a NaN is the canonical
// 0x7fff). The double product of two BF16 values is exact, so one rounding here is the device's.
inline uint16_t MulBf16(uint16_t a, uint16_t b) {
  const double p = static_cast<double>(BfToF(a)) * static_cast<double>(BfToF(b));
  if (std::isnan(p)) return 0x7fff;
  if (p == 0.0 || std::isinf(p)) return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(p)) >> 16);
  int e;
  std::frexp(p, &e);  // |p| in [2^(e-1), 2^e)
  const double quantum = std::ldexp(1.0, std::max(e - 8, -133));
  const double r = std::nearbyint(p / quantum) * quantum;  // ties to even (the default mode)
  if (std::fabs(r) >= std::ldexp(1.0, 128)) return p < 0 ? 0xff80 : 0x7f80;
  return static_cast<uint16_t>(std::bit_cast<uint32_t>(static_cast<float>(r)) >> 16);
}
inline uint32_t HostMulBf16x2(uint32_t a, uint32_t b) {
  return MulBf16(static_cast<uint16_t>(a), static_cast<uint16_t>(b)) |
         (static_cast<uint32_t>(MulBf16(static_cast<uint16_t>(a >> 16), static_cast<uint16_t>(b >> 16))) << 16);
}

// The experts' weight buffers (the driver registers each, its exact bytes): every streaming load
// and L2 prefetch of the kernel must fall inside one of them, 16-byte aligned.
struct WeightRange {
  const char* begin;
  size_t bytes;
};
inline std::vector<WeightRange> g_weights;
inline std::atomic<long> g_prefetches{0};
inline void CheckWeightRange(const void* p, size_t bytes, const char* what) {
  const char* c = static_cast<const char*>(p);
  bool inside = reinterpret_cast<uintptr_t>(p) % 16 == 0 && bytes % 16 == 0;
  if (inside) {
    inside = false;
    for (const WeightRange& r : g_weights) inside |= c >= r.begin && c + bytes <= r.begin + r.bytes;
  }
  if (!inside) {
    std::fprintf(stderr, "emulation: %s of %zu bytes at %p outside the experts' weights, or unaligned\n", what, bytes,
                 p);
    std::abort();
  }
}
inline uint4 HostLoadStreaming(const void* p) {
  CheckWeightRange(p, 16, "streaming load");
  uint4 v;
  std::memcpy(&v, p, 16);
  return v;
}
inline void HostPrefetchL2(const void* p, uint32_t bytes) {
  CheckWeightRange(p, bytes, "L2 prefetch");
  ++g_prefetches;
}

namespace kimirt::cuda {
// kernel<<<grid, block, smem, s>>>(args...) as HostLaunch(kernel, grid, block, smem, s)(args...).
template <typename Kernel>
auto HostLaunch(Kernel kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t s) {
  return [=](auto&&... args) { LaunchPdl("<<<>>>", kernel, grid, block, smem, s, args...); };
}
}  // namespace kimirt::cuda
