// Causal softmax attention for MLA on CUDA (kernels.h; spec §6.4, §6.6).
//
// One block per (token, head). Positions go by in tiles of kTile: each thread scores one
// position of the tile, the block takes the tile's max and rescales its running sums (the
// online softmax), then each thread accumulates its share of the value dims over the tile in
// position order. Every sum has a fixed order, so results are deterministic; they differ from
// the CPU reference (one softmax over all scores) only by rounding. The per-head part of the
// key and the value are read through strides, which lets one kernel serve both forms:
//   expanded: key = [W_UK c_s ‖ k_s], value = W_UV c_s, from one kv_b projection of the cache;
//   absorbed: key = [c_s ‖ k_s], value = c_s, with the query absorbed beforehand (AbsorbQuery)
//             and the output expanded afterwards (AbsorbOutput).
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/kernels.h"

#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {
namespace {

constexpr int kTile = 128;  // = threads per block
constexpr int kValuesPerThread = static_cast<int>(kAttentionMaxValueDim / kTile);

__global__ void CausalAttentionKernel(AttentionArgs a) {
  extern __shared__ float qs[];  // the query, da + db
  __shared__ float scratch[33];
  __shared__ float p[kTile];
  const int64_t t = blockIdx.x / a.H, h = blockIdx.x % a.H;
  const int64_t dq = a.da + a.db;
  const float* q = a.q + t * a.q_t + h * a.q_h;
  for (int64_t i = threadIdx.x; i < dq; i += blockDim.x) qs[i] = q[i];
  __syncthreads();
  const int64_t len = a.start + t + 1;
  float m = -INFINITY, l = 0.0f;
  float acc[kValuesPerThread];
  for (int i = 0; i < kValuesPerThread; ++i) acc[i] = 0.0f;
  for (int64_t s0 = 0; s0 < len; s0 += kTile) {
    const int64_t s = s0 + threadIdx.x;
    float score = -INFINITY;
    if (s < len) {
      const float* ka = a.ka + s * a.ka_s + h * a.ka_h;
      float dot = 0.0f;
      for (int64_t i = 0; i < a.da; ++i) dot += qs[i] * ka[i];
      const float* kb = a.kb + s * a.kb_s;
      for (int64_t i = 0; i < a.db; ++i) dot += qs[a.da + i] * kb[i];
      score = a.scale * dot;
    }
    const float m_new = fmaxf(m, BlockMax(score, scratch));  // finite: the tile has a position
    const float e = s < len ? expf(score - m_new) : 0.0f;
    p[threadIdx.x] = e;
    const float correction = expf(m - m_new);  // 0 on the first tile (m = -inf)
    l = l * correction + BlockSum(e, scratch);  // BlockSum's barriers also publish p[]
    const int64_t n = len - s0 < kTile ? len - s0 : kTile;
#pragma unroll
    for (int r = 0; r < kValuesPerThread; ++r) {  // unrolled: acc stays in registers
      const int64_t dim = threadIdx.x + int64_t{r} * kTile;
      if (dim < a.dv) {
        float sum = acc[r] * correction;
        for (int64_t j = 0; j < n; ++j) sum += p[j] * a.v[(s0 + j) * a.v_s + h * a.v_h + dim];
        acc[r] = sum;
      }
    }
    m = m_new;
    __syncthreads();  // p[] is rewritten by the next tile
  }
  float* o = a.o + t * a.o_t + h * a.o_h;
  const float inv = 1.0f / l;
#pragma unroll
  for (int r = 0; r < kValuesPerThread; ++r) {
    const int64_t dim = threadIdx.x + int64_t{r} * kTile;
    if (dim < a.dv) o[dim] = acc[r] * inv;
  }
}

// qc[t,h,j] = Σ_i q_n[t,h,i] W_UK,h[i,j] for j < r; then q_s copied after it.
__global__ void AbsorbQueryKernel(const float* q, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r,
                                  const void* w_kvb, bool bf16, float* qc) {
  const int64_t t = blockIdx.x / H, h = blockIdx.x % H;
  const float* qn = q + (t * H + h) * (dn + dr);
  const int64_t w_uk = h * (dn + dv) * r;  // element offset of W_UK,h
  float* out = qc + (t * H + h) * (r + dr);
  for (int64_t j = threadIdx.x; j < r; j += blockDim.x) {
    float sum = 0.0f;
    for (int64_t i = 0; i < dn; ++i) sum += qn[i] * WeightAt(w_kvb, w_uk + i * r + j, bf16);
    out[j] = sum;
  }
  for (int64_t i = threadIdx.x; i < dr; i += blockDim.x) out[r + i] = qn[dn + i];
}

// o[t,h,i] = Σ_j W_UV,h[i,j] ō[t,h,j]
__global__ void AbsorbOutputKernel(const float* o_bar, int64_t H, int64_t dn, int64_t dv, int64_t r,
                                   const void* w_kvb, bool bf16, float* o) {
  const int64_t t = blockIdx.x / H, h = blockIdx.x % H;
  const float* ob = o_bar + (t * H + h) * r;
  const int64_t w_uv = (h * (dn + dv) + dn) * r;  // element offset of W_UV,h
  for (int64_t i = threadIdx.x; i < dv; i += blockDim.x) {
    float sum = 0.0f;
    for (int64_t j = 0; j < r; ++j) sum += WeightAt(w_kvb, w_uv + i * r + j, bf16) * ob[j];
    o[(t * H + h) * dv + i] = sum;
  }
}

}  // namespace

void CausalAttention(const AttentionArgs& a, cudaStream_t s) {
  if (a.dv > kAttentionMaxValueDim || a.da + a.db > kAttentionMaxQueryDim) {
    std::fprintf(stderr, "kimirt: attention with value dim %lld / query dim %lld exceeds the kernel's %lld / %lld\n",
                 static_cast<long long>(a.dv), static_cast<long long>(a.da + a.db),
                 static_cast<long long>(kAttentionMaxValueDim), static_cast<long long>(kAttentionMaxQueryDim));
    std::abort();
  }
  if (a.T == 0 || a.H == 0) return;
  const size_t smem = static_cast<size_t>(a.da + a.db) * sizeof(float);
  CausalAttentionKernel<<<static_cast<unsigned>(a.T * a.H), kTile, smem, s>>>(a);
  CheckLaunch("CausalAttention");
}

void AbsorbQuery(const float* q, int64_t T, int64_t H, int64_t dn, int64_t dr, int64_t dv, int64_t r,
                 const void* w_kvb, bool w_bf16, float* qc, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  AbsorbQueryKernel<<<static_cast<unsigned>(T * H), 128, 0, s>>>(q, H, dn, dr, dv, r, w_kvb, w_bf16, qc);
  CheckLaunch("AbsorbQuery");
}

void AbsorbOutput(const float* o_bar, int64_t T, int64_t H, int64_t dn, int64_t dv, int64_t r, const void* w_kvb,
                  bool w_bf16, float* o, cudaStream_t s) {
  if (T == 0 || H == 0) return;
  AbsorbOutputKernel<<<static_cast<unsigned>(T * H), 128, 0, s>>>(o_bar, H, dn, dv, r, w_kvb, w_bf16, o);
  CheckLaunch("AbsorbOutput");
}

}  // namespace kimirt::cuda
