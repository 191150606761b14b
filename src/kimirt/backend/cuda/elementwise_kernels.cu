// Elementwise CUDA kernels (kernels.h): residual add, the MLA output gate, the GLUs, embedding.
// Same formulas as the CPU reference (cpu_backend.cpp; the GLU in cpu/moe_kernels.cpp), spec
// sections cited there.
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<int>(b < 65535 * 16 ? (b < 1 ? 1 : b) : 65535 * 16);
}

__device__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

__global__ void AddKernel(const float* a, const float* b, float* y, int64_t n) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = a[i] + b[i];
  }
}

__global__ void SigmoidMulKernel(const float* x, const float* g, float* y, int64_t n) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = x[i] * Sigmoid(g[i]);
  }
}

__global__ void GluKernel(const float* gate, const float* up, float* y, int64_t n, int kind, float b1,
                          bool has_b2, float b2) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float a = gate[i], u = up[i];
    if (kind == 0) {
      y[i] = a * Sigmoid(a) * u;
    } else {
      // Spec §3.3: the gate branch takes sigmoid of the raw a, not of a/beta.
      const float s = b1 * tanhf(a / b1) * Sigmoid(a);
      const float c = has_b2 ? b2 * tanhf(u / b2) : u;
      y[i] = s * c;
    }
  }
}

__global__ void EmbeddingKernel(const int32_t* ids, int64_t T, const void* table, bool bf16, int64_t V, int64_t D,
                                int64_t row_begin, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t t = blockIdx.x;
  const int64_t r = ids[t] - row_begin;
  float* dst = y + t * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = (r >= 0 && r < V) ? WeightAt(table, r * D + d, bf16) : 0.0f;
}

}  // namespace

void CheckLaunch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kimirt: CUDA kernel %s failed to launch: %s\n", what, cudaGetErrorString(e));
    std::abort();
  }
}

void Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl("Add", AddKernel, dim3(Blocks(n)), dim3(kThreads), 0, s, a, b, y, n);
  CheckLaunch("Add");
}

void SigmoidMul(const float* x, const float* g, float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl("SigmoidMul", SigmoidMulKernel, dim3(Blocks(n)), dim3(kThreads), 0, s, x, g, y, n);
  CheckLaunch("SigmoidMul");
}

void Glu(const float* gate, const float* up, float* y, int64_t n, int kind, float beta, bool has_linear_beta,
         float linear_beta, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl("Glu", GluKernel, dim3(Blocks(n)), dim3(kThreads), 0, s, gate, up, y, n, kind, beta, has_linear_beta, linear_beta);
  CheckLaunch("Glu");
}

void Embedding(const int32_t* ids, int64_t T, const void* table, bool table_bf16, int64_t V, int64_t D,
               int64_t row_begin, float* y, cudaStream_t s) {
  if (T == 0) return;
  LaunchPdl("Embedding", EmbeddingKernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, s, ids, T, table, table_bf16, V, D, row_begin, y);
  CheckLaunch("Embedding");
}

}  // namespace kimirt::cuda
