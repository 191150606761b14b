// Helpers the CUDA kernel benches share (kda_decode_bench.cu, kda_chunk_bench.cu): a checked CUDA
// call that ends the program, and device arrays of hashed uniform values (never zeros:
// METHOD.md, zeros can run faster than real data and hide unwritten outputs).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
                   __LINE__);                                                                         \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace kimirt::bench {

// Uniform values in [offset - scale, offset + scale) from a hash of the index.
__global__ inline void FillKernel(float* x, int64_t n, uint64_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = offset + scale * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

// n such values in a new device array (at least one element, so n = 0 is a valid pointer), filled
// on the legacy default stream: synchronize before another stream reads them.
inline float* Alloc(int64_t n, uint64_t seed, float scale, float offset = 0.0f) {
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, sizeof(float) * static_cast<size_t>(std::max<int64_t>(n, 1))));
  FillKernel<<<1024, 256>>>(p, n, seed, scale, offset);
  CUDA_CHECK(cudaGetLastError());
  return p;
}

}  // namespace kimirt::bench
