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

// y [T, count] = columns [begin, begin + count) of x [T, C].
__global__ void CopyColumnsKernel(const float* x, int64_t C, int64_t begin, int64_t count, float* y, int64_t n) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    y[i] = x[i / count * C + begin + i % count];
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

// A block per token. `vec` (16-byte aligned rows of y and the table): 16 bytes of the table a
// thread at a time (8 BF16 or 4 F32 values), so a 2,304-wide BF16 row is ≤ 2 loads a thread; an
// element-a-thread loop waited a round trip per element (~6 µs a row, Nsight Compute).
__global__ void EmbeddingKernel(const int32_t* ids, int64_t T, const void* __restrict__ table, bool bf16, bool vec,
                                int64_t V, int64_t D, int64_t row_begin, float* __restrict__ y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t t = blockIdx.x;
  const int64_t r = ids[t] - row_begin;
  const bool here = r >= 0 && r < V;
  float* dst = y + t * D;
  if (!vec) {
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[d] = here ? WeightAt(table, r * D + d, bf16) : 0.0f;
    return;
  }
  const int64_t per = bf16 ? 8 : 4;
  for (int64_t q = threadIdx.x; q < D / per; q += blockDim.x) {
    float4 v[2] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f), make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
    if (here && bf16) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(table) + r * D) + q);
      const auto lo = [](uint32_t w) { return __uint_as_float(w << 16); };
      const auto hi = [](uint32_t w) { return __uint_as_float(w & 0xffff0000u); };
      v[0] = make_float4(lo(u.x), hi(u.x), lo(u.y), hi(u.y));
      v[1] = make_float4(lo(u.z), hi(u.z), lo(u.w), hi(u.w));
    } else if (here) {
      v[0] = __ldg(reinterpret_cast<const float4*>(static_cast<const float*>(table) + r * D) + q);
    }
    float4* out = reinterpret_cast<float4*>(dst + q * per);
    out[0] = v[0];
    if (bf16) out[1] = v[1];
  }
}

}  // namespace

// cudaGetLastError returns the thread's last unread error, not only this launch's: session 38
// read an error an earlier call had left as CopyColumns' launch refused. The message says both.
void CheckLaunch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kimirt: CUDA error found after launching %s (its launch's, or one an earlier call left unread): %s\n",
                 what, cudaGetErrorString(e));
    std::abort();
  }
}

void Add(const float* a, const float* b, float* y, int64_t n, cudaStream_t s) {
  if (n == 0) return;
  LaunchPdl("Add", AddKernel, dim3(Blocks(n)), dim3(kThreads), 0, s, a, b, y, n);
  CheckLaunch("Add");
}

void CopyColumns(const float* x, int64_t T, int64_t C, int64_t begin, int64_t count, float* y, cudaStream_t s) {
  const int64_t n = T * count;
  if (n == 0) return;
  LaunchPdl("CopyColumns", CopyColumnsKernel, dim3(Blocks(n)), dim3(kThreads), 0, s, x, C, begin, count, y, n);
  CheckLaunch("CopyColumns");
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
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  const bool vec = D % (table_bf16 ? 8 : 4) == 0 && aligned(table) && aligned(y);
  LaunchPdl("Embedding", EmbeddingKernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, s, ids, T, table,
            table_bf16, vec, V, D, row_begin, y);
  CheckLaunch("Embedding");
}

}  // namespace kimirt::cuda
