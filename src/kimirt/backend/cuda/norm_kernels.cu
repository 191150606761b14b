// Row normalizations on CUDA (kernels.h): RMSNorm (spec §3.1), the KDA output's gated RMSNorm
// (spec §3.2) and the Block AttnRes mix (spec §8.2). One block per row; the row's sums go
// through the deterministic block reduction.
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kThreads = 256;

__device__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// rsqrt(mean(row²) + eps) of one row, by the whole block.
__device__ float InverseRms(const float* row, int64_t n, float eps, float* scratch) {
  float ss = 0.0f;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) ss += row[i] * row[i];
  ss = BlockSum(ss, scratch);
  return 1.0f / sqrtf(ss / static_cast<float>(n) + eps);
}

__global__ void RmsNormKernel(const float* x, const float* w, float eps, int64_t n, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float scratch[33];
  const float* r = x + blockIdx.x * n;
  const float inv = InverseRms(r, n, eps, scratch);
  float* out = y + blockIdx.x * n;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) out[i] = w[i] * (r[i] * inv);
}

__global__ void GatedRmsNormKernel(const float* x, const float* g, const float* w, float eps, int64_t K, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float scratch[33];
  const float* xr = x + blockIdx.x * K;
  const float* gr = g + blockIdx.x * K;
  const float rstd = InverseRms(xr, K, eps, scratch);
  float* yr = y + blockIdx.x * K;
  // Weight before gate (spec §3.2).
  for (int64_t d = threadIdx.x; d < K; d += blockDim.x) yr[d] = xr[d] * rstd * w[d] * Sigmoid(gr[d]);
}

__global__ void AttnResMixKernel(const AttnResCandidates cands, const float* proj, const float* norm_w, float eps,
                                 int64_t D, float* y) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  __shared__ float scratch[33];
  __shared__ float score[kAttnResMaxCandidates];
  const int64_t t = blockIdx.x;
  const int n = cands.n;
  for (int i = 0; i < n; ++i) {
    const float* v = cands.p[i] + t * D;
    float ss = 0.0f, dot = 0.0f;
    for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
      ss += v[d] * v[d];
      dot += norm_w[d] * proj[d] * v[d];  // the key-norm gain folded into the pseudo-query
    }
    ss = BlockSum(ss, scratch);
    dot = BlockSum(dot, scratch);
    // q · (v · rsqrt(mean(v²) + eps)) = rsqrt(...) · (q · v)
    if (threadIdx.x == 0) score[i] = dot / sqrtf(ss / static_cast<float>(D) + eps);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    float mx = -INFINITY;
    for (int i = 0; i < n; ++i) mx = fmaxf(mx, score[i]);
    float z = 0.0f;
    for (int i = 0; i < n; ++i) z += (score[i] = expf(score[i] - mx));
    for (int i = 0; i < n; ++i) score[i] /= z;
  }
  __syncthreads();
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float o = 0.0f;
    for (int i = 0; i < n; ++i) o += score[i] * cands.p[i][t * D + d];
    y[t * D + d] = o;
  }
}

}  // namespace

void RmsNorm(const float* x, const float* w, float eps, int64_t rows, int64_t n, float* y, cudaStream_t s) {
  if (rows == 0) return;
  LaunchPdl("RmsNorm", RmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(kThreads), 0, s, x, w, eps, n, y);
  CheckLaunch("RmsNorm");
}

void GatedRmsNorm(const float* x, const float* g, const float* w, float eps, int64_t rows, int64_t K, float* y,
                  cudaStream_t s) {
  if (rows == 0) return;
  const int threads = K >= 256 ? 256 : (K >= 128 ? 128 : 64);
  LaunchPdl("GatedRmsNorm", GatedRmsNormKernel, dim3(static_cast<unsigned>(rows)), dim3(threads), 0, s, x, g, w, eps, K, y);
  CheckLaunch("GatedRmsNorm");
}

void AttnResMix(const AttnResCandidates& cands, const float* proj, const float* norm_w, float eps, int64_t T,
                int64_t D, float* y, cudaStream_t s) {
  if (T == 0) return;
  if (cands.n < 1 || cands.n > kAttnResMaxCandidates) {
    std::fprintf(stderr, "kimirt: AttnResMix of %d candidates (1..%d supported)\n", cands.n, kAttnResMaxCandidates);
    std::abort();
  }
  LaunchPdl("AttnResMix", AttnResMixKernel, dim3(static_cast<unsigned>(T)), dim3(kThreads), 0, s, cands, proj, norm_w, eps, D, y);
  CheckLaunch("AttnResMix");
}

}  // namespace kimirt::cuda
