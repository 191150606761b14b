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

// Warp-per-output dot products for the few-token case (decode): no host round trip to group
// tokens by expert; each slot reads its own expert's rows. Lanes stride the reduction dim
// (coalesced), then a fixed butterfly sums them.
__device__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ float GluOf(float a, float u, int kind, float b1, bool has_b2, float b2) {
  if (kind == 0) return a * Sigmoid(a) * u;
  const float s = b1 * tanhf(a / b1) * Sigmoid(a);
  return s * (has_b2 ? b2 * tanhf(u / b2) : u);
}

// h[slot, i] = GLU(W1_e[i] · z[t], W3_e[i] · z[t]) for slot = t·k + j, e = idx[slot].
__global__ void MoeGateUpKernel(const float* z, const int32_t* idx, int64_t slots, int64_t k, int64_t De, int64_t I,
                                const void* const* w1, const void* const* w3, bool bf16, int kind, float b1,
                                bool has_b2, float b2, float* h) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= slots * I) return;  // a whole warp leaves together: the butterfly stays full
  const int64_t slot = warp / I, i = warp % I;
  const float* x = z + (slot / k) * De;
  const int32_t e = idx[slot];
  float sg = 0.0f, su = 0.0f;
  for (int64_t d = lane; d < De; d += 32) {
    sg += WeightAt(w1[e], i * De + d, bf16) * x[d];
    su += WeightAt(w3[e], i * De + d, bf16) * x[d];
  }
  sg = WarpSum(sg);
  su = WarpSum(su);
  if (lane == 0) h[slot * I + i] = GluOf(sg, su, kind, b1, has_b2, b2);
}

// grouped[slot, d] = W2_e[d] · h[slot]
__global__ void MoeDownKernel(const float* h, const int32_t* idx, int64_t slots, int64_t De, int64_t I,
                              const void* const* w2, bool bf16, float* out) {
  const int64_t warp = (blockIdx.x * int64_t{blockDim.x} + threadIdx.x) / 32;
  const int lane = threadIdx.x & 31;
  if (warp >= slots * De) return;
  const int64_t slot = warp / De, d = warp % De;
  const void* w = w2[idx[slot]];
  const float* hs = h + slot * I;
  float s = 0.0f;
  for (int64_t i = lane; i < I; i += 32) s += WeightAt(w, d * I + i, bf16) * hs[i];
  s = WarpSum(s);
  if (lane == 0) out[slot * De + d] = s;
}

__global__ void IotaKernel(int32_t* pos, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    pos[i] = static_cast<int32_t>(i);
  }
}

}  // namespace

void MoeExpertsPerSlot(const float* z, const int32_t* idx, int64_t T, int64_t k, int64_t De, int64_t I,
                       const void* const* w1, const void* const* w3, const void* const* w2, bool w_bf16, int kind,
                       float beta, bool has_linear_beta, float linear_beta, float* h, float* per_slot,
                       int32_t* iota, cudaStream_t s) {
  const int64_t slots = T * k;
  if (slots == 0) return;
  constexpr int kThreads = 256, kWarps = kThreads / 32;
  const int64_t gate_warps = slots * I, down_warps = slots * De;
  MoeGateUpKernel<<<static_cast<unsigned>((gate_warps + kWarps - 1) / kWarps), kThreads, 0, s>>>(
      z, idx, slots, k, De, I, w1, w3, w_bf16, kind, beta, has_linear_beta, linear_beta, h);
  CheckLaunch("MoeGateUp");
  MoeDownKernel<<<static_cast<unsigned>((down_warps + kWarps - 1) / kWarps), kThreads, 0, s>>>(h, idx, slots, De, I,
                                                                                               w2, w_bf16, per_slot);
  CheckLaunch("MoeDown");
  IotaKernel<<<static_cast<unsigned>((slots + 255) / 256), 256, 0, s>>>(iota, slots);
  CheckLaunch("Iota");
}

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
