// Deterministic block-wide sum and max for the CUDA kernels: a fixed butterfly within each warp,
// then warp 0 combines the warps' results in warp order. Same inputs, same bits, every run.
// Every thread of the block must call these (they synchronize), and gets the result.
#pragma once

#include <cuda_runtime.h>

namespace kimirt::cuda {

// The warp's sum by the xor butterfly: every lane ends with the same bits (each step adds the
// same two values in both lanes). BlockSum's two stages are this.
__device__ __forceinline__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

// scratch: 33 floats of shared memory, reused across calls.
__device__ inline float BlockSum(float v, float* scratch) {
  v = WarpSum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    const float t = WarpSum(lane < warps ? scratch[lane] : 0.0f);
    if (lane == 0) scratch[32] = t;
  }
  __syncthreads();
  return scratch[32];
}

__device__ inline float BlockMax(float v, float* scratch) {
  for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float t = lane < warps ? scratch[lane] : -INFINITY;
    for (int off = 16; off > 0; off >>= 1) t = fmaxf(t, __shfl_xor_sync(0xffffffffu, t, off));
    if (lane == 0) scratch[32] = t;
  }
  __syncthreads();
  return scratch[32];
}

}  // namespace kimirt::cuda
