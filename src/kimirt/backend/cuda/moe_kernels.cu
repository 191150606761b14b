// MoE on CUDA (kernels.h; spec §7.2): the router, the grouping of a step's (token, slot) choices
// by expert on the device, the routed experts (each chosen expert's weights read once per call,
// for all its tokens; F32, BF16 or MXFP4 held), and the combine.
// The router follows the CPU reference exactly: sigmoid scores, the correction bias for the
// choice only, top-k by (biased score desc, expert id asc), combine weights from the unbiased
// (or, for Kimi-Linear-48B, biased: spec §15.6) scores, renormalized in top-k order.
#include "kimirt/backend/cuda/kernels.h"

#include <algorithm>
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

__global__ void MoeCombineKernel(const float* grouped, const int32_t* pos, const float* weights, int64_t k, int64_t D,
                                 float* out) {
  const int64_t t = blockIdx.x;
  for (int64_t d = threadIdx.x; d < D; d += blockDim.x) {
    float acc = 0.0f;
    for (int64_t j = 0; j < k; ++j) acc += weights[t * k + j] * grouped[static_cast<int64_t>(pos[t * k + j]) * D + d];
    out[t * D + d] = acc;
  }
}

__device__ float WarpSum(float v) {
  for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ float GluOf(float a, float u, int kind, float b1, bool has_b2, float b2) {
  if (kind == 0) return a * Sigmoid(a) * u;
  const float s = b1 * tanhf(a / b1) * Sigmoid(a);
  return s * (has_b2 ? b2 * tanhf(u / b2) : u);
}

// --- Grouping by expert: a counting sort of the router's choice, on the device --------------
//
// One block. Counts per expert (shared-memory atomics: the counts do not depend on their order),
// an exclusive scan over the experts (each thread a run of consecutive experts, a Hillis-Steele
// scan of the runs), then one warp places the slots 32 at a time in slot order, so a group lists
// its slots ascending (the placement is deterministic; the expert math does not depend on it).
constexpr int kSortThreads = 1024;

__global__ void GroupByExpertKernel(const int32_t* idx, int64_t n, int64_t E, int32_t* order, int32_t* pos,
                                    int32_t* active, int32_t* begin, int32_t* num_active) {
  extern __shared__ int32_t sh[];
  int32_t* count = sh;              // [E]
  int32_t* cursor = sh + E;         // [E]
  int32_t* scan_c = sh + 2 * E;     // [blockDim]
  int32_t* scan_a = scan_c + blockDim.x;
  const int tid = threadIdx.x;
  for (int64_t e = tid; e < E; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int64_t s = tid; s < n; s += blockDim.x) {
    const int32_t e = idx[s];
    if (e < 0 || e >= E) __trap();  // the router only chooses real experts
    atomicAdd(&count[e], 1);
  }
  __syncthreads();
  const int64_t per = (E + blockDim.x - 1) / blockDim.x;
  const int64_t lo = min(E, tid * per), hi = min(E, lo + per);
  int32_t c = 0, a = 0;
  for (int64_t e = lo; e < hi; ++e) {
    c += count[e];
    a += count[e] > 0;
  }
  scan_c[tid] = c;
  scan_a[tid] = a;
  __syncthreads();
  for (int off = 1; off < static_cast<int>(blockDim.x); off <<= 1) {
    const int32_t vc = tid >= off ? scan_c[tid - off] : 0, va = tid >= off ? scan_a[tid - off] : 0;
    __syncthreads();
    scan_c[tid] += vc;
    scan_a[tid] += va;
    __syncthreads();
  }
  int32_t at = scan_c[tid] - c, act = scan_a[tid] - a;  // exclusive
  for (int64_t e = lo; e < hi; ++e) {
    cursor[e] = at;
    if (count[e] > 0) {
      active[act] = static_cast<int32_t>(e);
      begin[act] = at;
      ++act;
    }
    at += count[e];
  }
  if (tid == static_cast<int>(blockDim.x) - 1) {
    begin[act] = static_cast<int32_t>(n);
    *num_active = act;
  }
  __syncthreads();
  if (tid >= 32) return;
  const unsigned below = (1u << tid) - 1u;
  for (int64_t base = 0; base < n; base += 32) {
    const int64_t s = base + tid;
    const int32_t e = s < n ? idx[s] : -1;
    const unsigned peers = __match_any_sync(0xffffffffu, e);
    int32_t g = 0;
    if (s < n) g = cursor[e] + __popc(peers & below);
    __syncwarp();
    if (s < n) {
      order[g] = static_cast<int32_t>(s);
      pos[s] = g;
      if (tid == 31 - __clz(peers)) cursor[e] += __popc(peers);  // the group's highest lane
    }
    __syncwarp();
  }
}

// --- Expert weights, 32 elements at a time --------------------------------------------------
//
// A lane takes elements [base, base + 32) of a weight row, base = 32·lane + 1024·m, and sums
// them in order into each of its tokens' accumulators; the warp's lanes are then summed by a
// fixed butterfly. That order depends on nothing but the row length, so a token's result does
// not depend on the other tokens of its expert, and it is the same for every way the weight is
// held: MXFP4 decodes to exactly the values BF16 holds (E2M1 × 2^(s−127), at most 2 significant
// bits, spec §2.9), so packed and BF16-held experts give the same bits.
enum WeightFormat : int { kF32 = 0, kBf16 = 1, kMxfp4 = 2 };

// E2M1 code (low 4 bits) × E8M0 scale, exactly as DequantizeMxfp4Row: the E2M1 value is built
// from its bits (sign, 2 exponent bits, 1 mantissa bit; exponent 0 is 0 or 0.5) and multiplied
// by 2^(s−127) as a float (s = 0 is the subnormal 2^−127, s = 255 NaN); the product is exact or
// overflows to ±inf.
__device__ __forceinline__ float E8M0Value(unsigned s) {
  if (s == 255u) return __int_as_float(0x7fc00000);
  return s == 0u ? __int_as_float(0x00400000) : __int_as_float(static_cast<int>(s << 23));
}
__device__ __forceinline__ float E2M1Value(unsigned code) {
  const unsigned e = (code >> 1) & 3u, m = code & 1u;
  unsigned bits = e != 0u ? ((e + 126u) << 23) | (m << 22) : (m != 0u ? 0x3f000000u : 0u);
  bits |= (code & 8u) << 28;
  return __uint_as_float(bits);
}

__global__ void DequantizeMxfp4Kernel(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out) {
  const int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x;
  if (i >= n) return;
  const unsigned byte = codes[i / 2];
  out[i] = E2M1Value(i % 2 == 0 ? byte & 0xfu : byte >> 4) * E8M0Value(scales[i / 32]);
}

// 32 consecutive weights of a row as loaded (not yet decoded): MXFP4 16 code bytes + the
// group's scale, BF16 64 bytes, F32 128 bytes. Held raw, so a lane can have the next chunk in
// flight while it computes with this one at few registers; Elem decodes one element.
template <int kFmt>
struct Chunk;
template <>
struct Chunk<kMxfp4> {
  uint4 q;
  float scale;
};
template <>
struct Chunk<kBf16> {
  uint4 q[4];
};
template <>
struct Chunk<kF32> {
  float4 q[8];
};

__device__ __forceinline__ unsigned Word(const uint4& q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }
__device__ __forceinline__ float Comp(const float4& q, int i) { return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w; }

// Element j (a compile-time constant where unrolled) of a chunk, as F32.
__device__ __forceinline__ float Elem(const Chunk<kMxfp4>& c, int j) {
  return E2M1Value(Word(c.q, j / 8) >> (4 * (j % 8))) * c.scale;
}
__device__ __forceinline__ float Elem(const Chunk<kBf16>& c, int j) {
  return __uint_as_float((Word(c.q[j / 8], (j % 8) / 2) >> (16 * (j % 2))) << 16);
}
__device__ __forceinline__ float Elem(const Chunk<kF32>& c, int j) { return Comp(c.q[j / 4], j % 4); }

// Row `r` of a [rows, cols] weight, elements [base, base + 32) (0 past the row).
template <int kFmt>
__device__ __forceinline__ void LoadChunk(const void* wp, const uint8_t* sp, int64_t r, int64_t cols, int64_t base,
                                          Chunk<kFmt>& c) {
  const int64_t at = r * cols + base;
  if constexpr (kFmt == kMxfp4) {
    // cols is a multiple of 32 (a scale group): always whole, 16-byte aligned.
    c.q = *reinterpret_cast<const uint4*>(static_cast<const uint8_t*>(wp) + at / 2);
    c.scale = E8M0Value(sp[at / 32]);
  } else if constexpr (kFmt == kBf16) {
    if (base + 32 <= cols && cols % 8 == 0) {
      const uint4* p = reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(wp) + at);
#pragma unroll
      for (int v = 0; v < 4; ++v) c.q[v] = p[v];
      return;
    }
    const uint16_t* p = static_cast<const uint16_t*>(wp) + at;
    unsigned w[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) {
      const unsigned lo = base + 2 * i < cols ? p[2 * i] : 0u, hi = base + 2 * i + 1 < cols ? p[2 * i + 1] : 0u;
      w[i] = lo | (hi << 16);
    }
#pragma unroll
    for (int v = 0; v < 4; ++v) c.q[v] = make_uint4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
  } else {
    if (base + 32 <= cols && cols % 8 == 0) {
      const float4* p = reinterpret_cast<const float4*>(static_cast<const float*>(wp) + at);
#pragma unroll
      for (int v = 0; v < 8; ++v) c.q[v] = p[v];
      return;
    }
    const float* p = static_cast<const float*>(wp) + at;
    float w[32];
#pragma unroll
    for (int j = 0; j < 32; ++j) w[j] = base + j < cols ? p[j] : 0.0f;
#pragma unroll
    for (int v = 0; v < 8; ++v) c.q[v] = make_float4(w[4 * v], w[4 * v + 1], w[4 * v + 2], w[4 * v + 3]);
  }
}

constexpr int kExpertWarps = 8;   // rows of one expert per block, a warp each
constexpr int kExpertTile = 8;    // tokens per pass over a row: each weight chunk is loaded once per tile

struct GroupArgs {
  const int32_t* order;       // group row -> slot (token = slot / k)
  const int32_t* active;      // [A] chosen experts, ascending
  const int32_t* begin;       // [A + 1] their first group rows
  const int32_t* num_active;  // A
  int64_t k;
};

// For each of up to kExpertTile tokens t < n (inputs x[t], length cols) and each of kMats weight
// rows m: acc[m][t] += Σ_j w_m[r, j] · x[t][j] over this lane's elements j = 32·lane + 1024·i + c,
// c = 0..31, in that order (the order every format shares). The next chunk is loaded before the
// current one is used, so two are in flight per matrix.
template <int kFmt, int kMats>
__device__ __forceinline__ void RowDots(const void* const (&w)[kMats], const uint8_t* const (&s)[kMats], int64_t r,
                                        int64_t cols, const float* const (&x)[kExpertTile], int n,
                                        float (&acc)[kMats][kExpertTile]) {
  const int lane = threadIdx.x & 31;
  int64_t base = 32 * lane;
  if (base >= cols) return;
  Chunk<kFmt> cur[kMats];
#pragma unroll
  for (int m = 0; m < kMats; ++m) LoadChunk<kFmt>(w[m], s[m], r, cols, base, cur[m]);
  for (; base < cols; base += 1024) {
    Chunk<kFmt> next[kMats];
    const bool more = base + 1024 < cols;
    if (more) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) LoadChunk<kFmt>(w[m], s[m], r, cols, base + 1024, next[m]);
    }
    const bool whole = base + 32 <= cols;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      if (whole || base + j < cols) {
        float wv[kMats];
#pragma unroll
        for (int m = 0; m < kMats; ++m) wv[m] = Elem(cur[m], j);
#pragma unroll
        for (int t = 0; t < kExpertTile; ++t) {
          if (t < n) {
            const float xv = x[t][base + j];
#pragma unroll
            for (int m = 0; m < kMats; ++m) acc[m][t] = fmaf(wv[m], xv, acc[m][t]);
          }
        }
      }
    }
    if (more) {
#pragma unroll
      for (int m = 0; m < kMats; ++m) cur[m] = next[m];
    }
  }
}

// h[g, i] = GLU(W1_e[i] · z[t], W3_e[i] · z[t]) for every group row g of expert e (token t).
// Grid: (rows / kExpertWarps, max A).
template <int kFmt>
__global__ void __launch_bounds__(kExpertWarps * 32) ExpertGateUpKernel(
    const float* z, GroupArgs ga, int64_t De, int64_t I, const void* const* w1, const void* const* w3,
    const uint8_t* const* s1, const uint8_t* const* s3, int kind, float b1, bool has_b2, float b2, float* h) {
  const int a = blockIdx.y;
  if (a >= *ga.num_active) return;
  const int64_t i = blockIdx.x * int64_t{kExpertWarps} + threadIdx.x / 32;
  if (i >= I) return;  // whole warps leave together
  const int lane = threadIdx.x & 31;
  const int32_t e = ga.active[a];
  const void* const w[2] = {w1[e], w3[e]};
  const uint8_t* const sc[2] = {kFmt == kMxfp4 ? s1[e] : nullptr, kFmt == kMxfp4 ? s3[e] : nullptr};
  const int32_t g1 = ga.begin[a + 1];
  for (int32_t g0 = ga.begin[a]; g0 < g1; g0 += kExpertTile) {
    const int n = min(kExpertTile, g1 - g0);
    const float* x[kExpertTile];
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) x[t] = z + (t < n ? ga.order[g0 + t] / ga.k : 0) * De;
    float acc[2][kExpertTile] = {};
    RowDots<kFmt, 2>(w, sc, i, De, x, n, acc);
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) {
      if (t < n) {  // n is the same for the whole warp: the butterfly stays full
        const float sg = WarpSum(acc[0][t]), su = WarpSum(acc[1][t]);
        if (lane == 0) h[(g0 + t) * I + i] = GluOf(sg, su, kind, b1, has_b2, b2);
      }
    }
  }
}

// grouped[g, d] = W2_e[d] · h[g] for every group row g of expert e. Grid: (De / kExpertWarps, max A).
template <int kFmt>
__global__ void __launch_bounds__(kExpertWarps * 32) ExpertDownKernel(const float* h, GroupArgs ga, int64_t De,
                                                                      int64_t I, const void* const* w2,
                                                                      const uint8_t* const* s2, float* grouped) {
  const int a = blockIdx.y;
  if (a >= *ga.num_active) return;
  const int64_t d = blockIdx.x * int64_t{kExpertWarps} + threadIdx.x / 32;
  if (d >= De) return;
  const int lane = threadIdx.x & 31;
  const int32_t e = ga.active[a];
  const void* const w[1] = {w2[e]};
  const uint8_t* const sc[1] = {kFmt == kMxfp4 ? s2[e] : nullptr};
  const int32_t g1 = ga.begin[a + 1];
  for (int32_t g0 = ga.begin[a]; g0 < g1; g0 += kExpertTile) {
    const int n = min(kExpertTile, g1 - g0);
    const float* x[kExpertTile];
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) x[t] = h + (t < n ? g0 + t : g0) * I;
    float acc[1][kExpertTile] = {};
    RowDots<kFmt, 1>(w, sc, d, I, x, n, acc);
#pragma unroll
    for (int t = 0; t < kExpertTile; ++t) {
      if (t < n) {
        const float v = WarpSum(acc[0][t]);
        if (lane == 0) grouped[(g0 + t) * De + d] = v;
      }
    }
  }
}

template <int kFmt>
void LaunchExperts(const float* z, const GroupArgs& ga, int64_t max_active, int64_t De, int64_t I,
                   const ExpertPointerTable& w, int kind, float beta, bool has_linear_beta, float linear_beta,
                   float* h, float* grouped, cudaStream_t s) {
  const dim3 block(kExpertWarps * 32);
  const dim3 gate_grid(static_cast<unsigned>((I + kExpertWarps - 1) / kExpertWarps), static_cast<unsigned>(max_active));
  ExpertGateUpKernel<kFmt><<<gate_grid, block, 0, s>>>(z, ga, De, I, w.gate, w.up, w.gate_scales, w.up_scales, kind,
                                                       beta, has_linear_beta, linear_beta, h);
  CheckLaunch("ExpertGateUp");
  const dim3 down_grid(static_cast<unsigned>((De + kExpertWarps - 1) / kExpertWarps),
                       static_cast<unsigned>(max_active));
  ExpertDownKernel<kFmt><<<down_grid, block, 0, s>>>(h, ga, De, I, w.down, w.down_scales, grouped);
  CheckLaunch("ExpertDown");
}

}  // namespace

void MoeGroupByExpert(const int32_t* idx, int64_t n, int64_t E, const ExpertGroups& g, cudaStream_t s) {
  if (n == 0) return;
  const size_t shared = static_cast<size_t>(2 * E + 2 * kSortThreads) * sizeof(int32_t);
  if (shared > 48 * 1024) {
    std::fprintf(stderr, "kimirt: MoE of %lld experts (the CUDA grouping takes up to %d)\n",
                 static_cast<long long>(E), 48 * 1024 / 8 - kSortThreads);
    std::abort();
  }
  GroupByExpertKernel<<<1, kSortThreads, shared, s>>>(idx, n, E, g.order, g.pos, g.active, g.begin, g.num_active);
  CheckLaunch("GroupByExpert");
}

void MoeGroupedExperts(const float* z, int64_t k, const ExpertGroups& g, int64_t max_active, int64_t De, int64_t I,
                       const ExpertPointerTable& w, int format, int kind, float beta, bool has_linear_beta,
                       float linear_beta, float* h, float* grouped, cudaStream_t s) {
  if (max_active == 0) return;
  const GroupArgs ga{g.order, g.active, g.begin, g.num_active, k};
  switch (format) {
    case kF32: LaunchExperts<kF32>(z, ga, max_active, De, I, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s); break;
    case kBf16: LaunchExperts<kBf16>(z, ga, max_active, De, I, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s); break;
    case kMxfp4:
      if (De % 32 != 0 || I % 32 != 0) {
        std::fprintf(stderr, "kimirt: MXFP4 experts of widths %lld x %lld (multiples of 32 needed)\n",
                     static_cast<long long>(De), static_cast<long long>(I));
        std::abort();
      }
      LaunchExperts<kMxfp4>(z, ga, max_active, De, I, w, kind, beta, has_linear_beta, linear_beta, h, grouped, s);
      break;
    default: std::abort();
  }
}

void DequantizeMxfp4(const uint8_t* codes, const uint8_t* scales, int64_t n, float* out, cudaStream_t s) {
  if (n == 0) return;
  DequantizeMxfp4Kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, s>>>(codes, scales, n, out);
  CheckLaunch("DequantizeMxfp4");
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

void MoeCombine(const float* grouped, const int32_t* pos, const float* weights, int64_t T, int64_t k, int64_t D,
                float* out, cudaStream_t s) {
  if (T == 0) return;
  MoeCombineKernel<<<static_cast<unsigned>(T), 128, 0, s>>>(grouped, pos, weights, k, D, out);
  CheckLaunch("MoeCombine");
}

}  // namespace kimirt::cuda
