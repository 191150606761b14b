// MoE routing and the token shuffles around the experts on CUDA (kernels.h; spec §7.2).
// The router follows the CPU reference exactly: sigmoid scores, the correction bias for the
// choice only, top-k by (biased score desc, expert id asc), combine weights from the unbiased
// (or, for Kimi-Linear-48B, biased: spec §15.6) scores, renormalized in top-k order.
#include "kimirt/backend/cuda/kernels.h"

#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kMaxTopK = 64;

__device__ float Sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// One thread per token: k passes over the experts, each taking the best not yet chosen.
__global__ void MoeRouteKernel(const float* logits, const float* bias, int64_t T, int64_t E, int k, bool renormalize,
                               float scaling, bool combine_biased, int32_t* idx, float* weights) {
  const int64_t t = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (t >= T) return;
  const float* row = logits + t * E;
  int32_t chosen[kMaxTopK];
  float sum = 0.0f;
  for (int j = 0; j < k; ++j) {
    int32_t best = -1;
    float best_choice = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      bool taken = false;
      for (int m = 0; m < j; ++m) taken |= chosen[m] == e;
      if (taken) continue;
      const float c = Sigmoid(row[e]) + bias[e];
      // Strictly greater: among equal choices the lower id (seen first) stays.
      if (best < 0 || c > best_choice) {
        best = static_cast<int32_t>(e);
        best_choice = c;
      }
    }
    chosen[j] = best;
    const float w = combine_biased ? best_choice : Sigmoid(row[best]);
    idx[t * k + j] = best;
    weights[t * k + j] = w;
    sum += w;
  }
  for (int j = 0; j < k; ++j) {
    float w = weights[t * k + j];
    if (renormalize && k > 1) w /= (sum + 1e-20f);
    weights[t * k + j] = w * scaling;
  }
}

__global__ void GatherRowsKernel(const float* src, int64_t D, const int32_t* rows, float* dst) {
  const int64_t i = blockIdx.x;
  const float* from = src + static_cast<int64_t>(rows[i]) * D;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) dst[i * D + d] = from[d];
}

__global__ void MoeCombineKernel(const float* grouped, const int32_t* pos, const float* weights, int64_t k, int64_t D,
                                 float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += weights[t * k + j] * grouped[static_cast<int64_t>(pos[t * k + j]) * D + d];
    out[t * D + d] = acc;
  }
}

}  // namespace

void MoeRoute(const float* logits, const float* bias, int64_t T, int64_t E, int64_t k, bool renormalize,
              float scaling, bool combine_biased, int32_t* idx, float* weights, cudaStream_t s) {
  if (k < 1 || k > kMaxTopK || k > E) {
    std::fprintf(stderr, "kimirt: MoE top-%lld of %lld experts (the CUDA router takes k in 1..%d)\n",
                 static_cast<long long>(k), static_cast<long long>(E), kMaxTopK);
    std::abort();
  }
  if (T == 0) return;
  const int threads = 64;
  MoeRouteKernel<<<static_cast<unsigned>((T + threads - 1) / threads), threads, 0, s>>>(
      logits, bias, T, E, static_cast<int>(k), renormalize, scaling, combine_biased, idx, weights);
  CheckLaunch("MoeRoute");
}

void GatherRows(const float* src, int64_t D, const int32_t* rows, int64_t n, float* dst, cudaStream_t s) {
  if (n == 0) return;
  GatherRowsKernel<<<static_cast<unsigned>(n), 128, 0, s>>>(src, D, rows, dst);
  CheckLaunch("GatherRows");
}

void MoeCombine(const float* grouped, const int32_t* pos, const float* weights, int64_t T, int64_t k, int64_t D,
                float* out, cudaStream_t s) {
  if (T == 0) return;
  MoeCombineKernel<<<static_cast<unsigned>(T), 128, 0, s>>>(grouped, pos, weights, k, D, out);
  CheckLaunch("MoeCombine");
}

}  // namespace kimirt::cuda
