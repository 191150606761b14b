// Host emulation of the CUDA features kda_chunk_kernels.cu uses (see ../kda_chunk_emulate.sh):
// a thread block is 256 fibers (fibers.h) with a barrier for __syncthreads and per-warp barriers
// for the warp-collective operations (shuffles, mma.sync). The MMA follows the PTX ISA's
// m16n8k16 fragment layouts (the ones decode_gemm.cu runs on the H200): it checks the kernel's
// indexing, tiling, synchronization and math, not the tensor cores' rounding.
#pragma once
#include <array>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "fibers.h"
#define __global__
#define __device__
#define __forceinline__
#define __launch_bounds__(a, b)
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
inline Dim3 threadIdx, blockIdx, gridDim;  // the running thread's, set at each of its turns
// A block's n threads: body(t) as fiber t, threadIdx set to t on each of its turns.
template <class Body>
void RunBlockThreads(unsigned n, Body&& body) {
  emu::RunFibers(n, [](unsigned t) { threadIdx = {t, 0, 0}; }, body);
}
// A value each thread of the running block has its own of (the fibers share the OS thread, so
// thread_local is the block's): t->... is thread threadIdx.x's, a fresh T at each block's start
// (as a thread_local died with its std::thread).
template <class T>
class PerThread {
 public:
  T* operator->() { return &Mine(); }
  T& operator*() { return Mine(); }

 private:
  struct Slot {
    uint64_t block = 0;
    T value{};
  };
  T& Mine() {
    Slot& s = of_[threadIdx.x];
    if (s.block != emu::g_blocks) s = Slot{emu::g_blocks, T{}};
    return s.value;
  }
  std::vector<Slot> of_ = std::vector<Slot>(1024);
};
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <typename T>
T __ldg(const T* p) { return *p; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __expf(float x) { return std::exp(x); }
inline float __uint_as_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }
[[noreturn]] inline void __trap() { std::abort(); }
#include <math.h>
struct BlockCtx {
  emu::Barrier block;  // __syncthreads: the block's threads (256 unless the launcher says)
  std::vector<emu::Barrier*> warp;
  std::atomic<int> or_acc{0};
  float shfl[8][32];
  uint32_t fa[8][32][4], fb[8][32][2];
  const void* ptr[8][32];
  float fc[8][32][4];
  explicit BlockCtx(int threads = 256) : block(threads) {
    for (int i = 0; i < 8; ++i) warp.push_back(new emu::Barrier(32));
  }
  ~BlockCtx() { for (auto* b : warp) delete b; }
};
inline BlockCtx* g_ctx;
inline void __syncthreads() { g_ctx->block.arrive_and_wait(); }
inline int __syncthreads_or(int p) {
  __syncthreads();
  if (p) g_ctx->or_acc |= 1;
  __syncthreads();
  const int r = g_ctx->or_acc.load();
  __syncthreads();
  if (threadIdx.x == 0) g_ctx->or_acc = 0;
  return r;
}
inline float __shfl_xor_sync(unsigned, float v, int o) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  g_ctx->warp[w]->arrive_and_wait();
  g_ctx->shfl[w][l] = v;
  g_ctx->warp[w]->arrive_and_wait();
  const float r = g_ctx->shfl[w][l ^ o];
  return r;
}
inline float Half(uint32_t r, int hi) { uint32_t u = hi ? (r & 0xffff0000u) : (r << 16); float f; std::memcpy(&f, &u, 4); return f; }
// m16n8k16 row.col BF16 -> F32: d = a·b + c with exact products summed in double, rounded once
// (the hardware truncates; irrelevant to an index check).
inline void EmuMma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  g_ctx->warp[w]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) g_ctx->fa[w][l][i] = a[i];
  for (int i = 0; i < 2; ++i) g_ctx->fb[w][l][i] = b[i];
  g_ctx->warp[w]->arrive_and_wait();
  auto A = [&](int row, int k) { const int ln = (row % 8) * 4 + (k % 8) / 2, reg = (row >= 8 ? 1 : 0) + (k >= 8 ? 2 : 0); return Half(g_ctx->fa[w][ln][reg], k % 2); };
  auto B = [&](int k, int n) { const int ln = n * 4 + (k % 8) / 2, reg = k >= 8 ? 1 : 0; return Half(g_ctx->fb[w][ln][reg], k % 2); };
  for (int e = 0; e < 4; ++e) {
    const int row = g + (e >= 2 ? 8 : 0), col = 2 * t + (e & 1);
    double s = c[e];
    for (int k = 0; k < 16; ++k) s += static_cast<double>(A(row, k)) * B(k, col);
    c[e] = static_cast<float>(s);
  }
}
// ldmatrix .x4: lane l's address is row l % 8 of matrix l / 8; lane g·4 + t receives columns
// 2t, 2t + 1 of row g of each matrix.
inline void EmuLdMatrixX4(uint32_t (&d)[4], const void* p) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  g_ctx->warp[w]->arrive_and_wait();
  g_ctx->ptr[w][l] = p;
  g_ctx->warp[w]->arrive_and_wait();
  for (int j = 0; j < 4; ++j) std::memcpy(&d[j], static_cast<const char*>(g_ctx->ptr[w][8 * j + g]) + 4 * t, 4);
}
// cp.async.bulk.prefetch.L2 (the state kernel's record prefetch): a hint, nothing to emulate.
inline void EmuPrefetchL2Bulk(const void*, uint32_t) {}
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
struct uint2 { uint32_t x, y; };
struct uint4 { uint32_t x, y, z, w; };
inline uint2 make_uint2(uint32_t a, uint32_t b) { return {a, b}; }
inline uint4 make_uint4(uint32_t a, uint32_t b, uint32_t c, uint32_t d) { return {a, b, c, d}; }
// ldmatrix .x4 .trans: lane g·4 + t receives rows 2t, 2t + 1 of column g of each matrix.
template <class T>
inline void EmuLdMatrixX4Trans(T (&d)[4], const void* p) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32, g = l >> 2, t = l & 3;
  g_ctx->warp[w]->arrive_and_wait();
  g_ctx->ptr[w][l] = p;
  g_ctx->warp[w]->arrive_and_wait();
  for (int j = 0; j < 4; ++j) {
    uint16_t lo, hi;
    std::memcpy(&lo, static_cast<const char*>(g_ctx->ptr[w][8 * j + 2 * t]) + 2 * g, 2);
    std::memcpy(&hi, static_cast<const char*>(g_ctx->ptr[w][8 * j + 2 * t + 1]) + 2 * g, 2);
    d[j] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
}
