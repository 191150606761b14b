// The activations of the KDA kernels (spec §3.5, §5.3), written out as the CPU reference's
// (cpu/kda_kernels.cpp) so the unfused kernels (kda_kernels.cu) and the fused decode step
// (kda_decode_kernels.cu) compute them alike.
#pragma once

#include <cuda_runtime.h>

namespace kimirt::cuda {

__device__ inline float KdaSigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ inline float KdaSilu(float x) { return x / (1.0f + expf(-x)); }
// torch softplus (beta 1, threshold 20), as the CPU reference.
__device__ inline float KdaSoftplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

}  // namespace kimirt::cuda
