// Kimi Delta Attention on CUDA (kernels.h; spec §5): the short causal conv + SiLU, the decay
// gate, and the delta rule in its recurrent form, with the CPU reference's operation order
// (cpu/kda_kernels.cpp) so the two agree to rounding.
//
// The recurrent kernel runs one block per head and one thread per state column j: thread j owns
// S[:, j], so the rank-1 update and both reads of S need no synchronization beyond the per-token
// loads of q̂, k̂ and the decays. The chunked form (spec §5.5) is the same function; prefill
// through it on the GPU is a later step (Backend::KdaCore takes either form and this backend
// computes both recurrently).
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/kda_activations.cuh"
#include "kimirt/backend/cuda/kernels.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kMaxConvTaps = 16;

// A thread per channel and run of kConvRun tokens, all of a prefill chunk at once: the input at
// t − hist + j comes from x, or from the carried window before the chunk's first token; taps
// j = 0..W-1 oldest first, summed in that order (the CPU reference's and the former per-channel
// loop's). The run's last hist inputs stay in registers (kW, the conv's taps, a template: 4 in
// every model), so x is read once. A thread per channel walking the whole chunk took 1.1 ms for
// 2048 tokens × 4096 channels on an H200 (16 blocks busy); a thread per (token, channel) of a flat
// index split by 64-bit division 77 µs, by the grid 62 µs (every input read W times).
constexpr int kConvRun = 16;

// Column c of rows t0 .. t0 + kConvRun − 1 of a [T, stride] array, zeros past T: all loads issued
// before any is used.
__device__ __forceinline__ void LoadRun(const float* src, int64_t t0, int64_t T, int64_t stride, int64_t c,
                                        float (&in)[kConvRun]) {
#pragma unroll
  for (int r = 0; r < kConvRun; ++r) in[r] = t0 + r < T ? src[(t0 + r) * stride + c] : 0.0f;
}

template <int kW>
__global__ void CausalConvSiluKernel(const float* x, int64_t T, int64_t C, const float* w, const float* window,
                                     float* y) {
  constexpr int hist = kW - 1;
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  float wc[kW];
#pragma unroll
  for (int j = 0; j < kW; ++j) wc[j] = w[c * kW + j];
  for (int64_t t0 = blockIdx.y * int64_t{kConvRun}; t0 < T; t0 += int64_t{gridDim.y} * kConvRun) {
    float h[hist > 0 ? hist : 1];
#pragma unroll
    for (int j = 0; j < hist; ++j) {
      const int64_t tau = t0 - hist + j;
      h[j] = tau < 0 ? window[(tau + hist) * C + c] : x[tau * C + c];
    }
    float in[kConvRun];
    LoadRun(x, t0, T, C, c, in);
#pragma unroll
    for (int r = 0; r < kConvRun; ++r) {
      if (t0 + r >= T) break;
      float acc = 0.0f;
#pragma unroll
      for (int j = 0; j < hist; ++j) acc += wc[j] * h[j];
      acc += wc[hist] * in[r];
      y[(t0 + r) * C + c] = KdaSilu(acc);
#pragma unroll
      for (int j = 0; j + 1 < hist; ++j) h[j] = h[j + 1];
      if constexpr (hist > 0) h[hist - 1] = in[r];
    }
  }
}

// Other tap counts: a thread per (token, channel), the same sums.
__global__ void CausalConvSiluAnyKernel(const float* x, int64_t T, int64_t C, const float* w, int W,
                                        const float* window, float* y) {
  const int hist = W - 1;
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const float* wc = w + c * W;
  for (int64_t t = blockIdx.y; t < T; t += gridDim.y) {
    float acc = 0.0f;
    for (int j = 0; j < hist; ++j) {
      const int64_t tau = t - hist + j;
      acc += wc[j] * (tau < 0 ? window[(tau + hist) * C + c] : x[tau * C + c]);
    }
    acc += wc[hist] * x[t * C + c];
    y[t * C + c] = KdaSilu(acc);
  }
}

// The new window: the last `hist` inputs (spec §5.7), taken from x and, for a chunk shorter than
// the window, from the old window. One thread per channel reads its old column before writing it.
__global__ void CausalConvWindowKernel(const float* x, int64_t T, int64_t C, int W, float* window) {
  const int64_t c = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (c >= C) return;
  const int hist = W - 1;
  float old[kMaxConvTaps];
  for (int i = 0; i < hist; ++i) old[i] = window[i * C + c];
  for (int i = 0; i < hist; ++i) {
    const int64_t tau = T - hist + i;
    window[i * C + c] = tau < 0 ? old[tau + hist] : x[tau * C + c];
  }
}

// A thread per channel of the H·K and run of kConvRun tokens, as CausalConvSiluKernel (a flat
// index split by 64-bit division and modulo took 61 µs for a 2,048-token chunk at 4096 channels).
__global__ void KdaLogDecayKernel(const float* f, int64_t T, int64_t H, int64_t K, const float* a_log,
                                  const float* dt_bias, bool has_lb, float lb, float* alpha) {
  const int64_t P = H * K, p = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (p >= P) return;
  const float a = expf(a_log[p / K]), bias = dt_bias[p];
  for (int64_t t0 = blockIdx.y * int64_t{kConvRun}; t0 < T; t0 += int64_t{gridDim.y} * kConvRun) {
    float in[kConvRun];
    LoadRun(f, t0, T, P, p, in);
#pragma unroll
    for (int r = 0; r < kConvRun; ++r) {
      if (t0 + r >= T) break;
      const float xv = in[r] + bias;
      // The lower bound is reached through the sigmoid, not by clamping (spec §5.3).
      alpha[(t0 + r) * P + p] = has_lb ? lb * KdaSigmoid(a * xv) : -a * KdaSoftplus(xv);
    }
  }
}

// dynamic shared memory: q̂ [K], k̂ [K], decay [K]
__global__ void KdaRecurrentKernel(const float* q, const float* k, const float* v, const float* beta_logits,
                                   const float* alpha, int64_t T, int64_t H, int64_t K, float* state, float* o) {
  extern __shared__ float smem[];
  __shared__ float scratch[33];
  float* qn = smem;
  float* kn = smem + K;
  float* decay = smem + 2 * K;
  const int64_t h = blockIdx.x;
  const int64_t j = threadIdx.x;
  const bool active = j < K;  // the block is rounded up to whole warps
  float* S = state + h * K * K;
  const float q_scale = 1.0f / sqrtf(static_cast<float>(K));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t row = (t * H + h) * K;
    const float qj = active ? q[row + j] : 0.0f, kj = active ? k[row + j] : 0.0f;
    // Spec §3.4: L2 norm with eps inside the sqrt of the sum; q scaled by 1/sqrt(K) after.
    const float sq = BlockSum(qj * qj, scratch);
    const float sk = BlockSum(kj * kj, scratch);
    if (active) {
      qn[j] = qj * (1.0f / sqrtf(sq + 1e-6f)) * q_scale;
      kn[j] = kj * (1.0f / sqrtf(sk + 1e-6f));
      decay[j] = expf(alpha[row + j]);
    }
    // Barriers stay outside the `active` branches: every thread of the block must reach each
    // one (a barrier inside a branch that only some threads take is undefined, and hangs).
    __syncthreads();
    if (active) {
      const float beta = KdaSigmoid(beta_logits[t * H + h]);
      // Steps 1-2: decay, then p_j = Σ_d k̂_d S[d, j] (d ascending).
      float p = 0.0f;
      for (int64_t d = 0; d < K; ++d) {
        const float s = S[d * K + j] * decay[d];
        S[d * K + j] = s;
        p += kn[d] * s;
      }
      // Step 3: δ = β (v − p); steps 4-5: rank-1 write, then o = q̂ᵀ S.
      const float delta = beta * (v[row + j] - p);
      float out = 0.0f;
      for (int64_t d = 0; d < K; ++d) {
        const float s = S[d * K + j] + kn[d] * delta;
        S[d * K + j] = s;
        out += qn[d] * s;
      }
      o[row + j] = out;
    }
    __syncthreads();  // qn/kn/decay are rewritten by the next token
  }
}

}  // namespace

void CausalConvSilu(const float* x, int64_t T, int64_t C, const float* w, int64_t W, float* window, float* y,
                    cudaStream_t s) {
  if (W < 1 || W > kMaxConvTaps) {
    std::fprintf(stderr, "kimirt: causal conv of %lld taps (1..%d supported)\n", static_cast<long long>(W),
                 kMaxConvTaps);
    std::abort();
  }
  if (C == 0) return;
  if (T > 0) {
    const int threads = 256;
    const auto cx = static_cast<unsigned>((C + threads - 1) / threads);
    if (W == 4) {
      const dim3 grid(cx, static_cast<unsigned>(std::min<int64_t>((T + kConvRun - 1) / kConvRun, 65535)));
      CausalConvSiluKernel<4><<<grid, threads, 0, s>>>(x, T, C, w, window, y);
    } else {
      const dim3 grid(cx, static_cast<unsigned>(std::min<int64_t>(T, 65535)));
      CausalConvSiluAnyKernel<<<grid, threads, 0, s>>>(x, T, C, w, static_cast<int>(W), window, y);
    }
    CheckLaunch("CausalConvSilu");
  }
  CausalConvWindowKernel<<<static_cast<unsigned>((C + 127) / 128), 128, 0, s>>>(x, T, C, static_cast<int>(W),
                                                                               window);
  CheckLaunch("CausalConvWindow");
}

void KdaLogDecay(const float* f, int64_t T, int64_t H, int64_t K, const float* a_log, const float* dt_bias,
                 bool has_lower_bound, float lower_bound, float* alpha, cudaStream_t s) {
  const int64_t n = T * H * K;
  if (n == 0) return;
  const int threads = 256;
  const dim3 grid(static_cast<unsigned>((H * K + threads - 1) / threads),
                  static_cast<unsigned>(std::min<int64_t>((T + kConvRun - 1) / kConvRun, 65535)));
  KdaLogDecayKernel<<<grid, threads, 0, s>>>(f, T, H, K, a_log, dt_bias, has_lower_bound, lower_bound, alpha);
  CheckLaunch("KdaLogDecay");
}

void KdaRecurrent(const float* q, const float* k, const float* v, const float* beta_logits, const float* alpha,
                  int64_t T, int64_t H, int64_t K, float* state, float* o, cudaStream_t s) {
  if (K < 1 || K > 1024) {
    std::fprintf(stderr, "kimirt: KDA head dim %lld: the CUDA kernel takes 1..1024\n", static_cast<long long>(K));
    std::abort();
  }
  if (T == 0 || H == 0) return;
  const unsigned threads = static_cast<unsigned>((K + 31) / 32 * 32);
  KdaRecurrentKernel<<<static_cast<unsigned>(H), threads, 3 * K * sizeof(float), s>>>(
      q, k, v, beta_logits, alpha, T, H, K, state, o);
  CheckLaunch("KdaRecurrent");
}

}  // namespace kimirt::cuda
