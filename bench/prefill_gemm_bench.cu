// Prefill GEMMs on tensor cores (issue 14 item 1 / item 5, issue 13 item 2): the path
// CudaBackend::Linear takes for more than kGemvMaxRows rows with BF16-held weights and
// bf16_prefill on (cuda::PrefillGemm: x rounded to BF16, then the batch-invariant tile kernel),
// and the grouped MoE experts (cuda::MoeGroupByExpert + cuda::MoePrefillExperts, BF16 and MXFP4
// weights), as TFLOP/s and the fraction of 790 TFLOP/s (the dense BF16 rate measured on the
// H200, HOPPER.md). The peer, in the same run on the same shapes: cuBLAS BF16 GEMM
// (cublasGemmEx, BF16 x already rounded, F32 output, F32 compute, the default heuristic —
// free to pick split-K or any kernel per m, i.e. not batch-invariant); and for the MoE the
// CUDA-core kernels the backend ran before (MoeGroupedExperts).
//
// Shapes: Kimi-Linear-48B (configs/kimi-linear-48b-a3b.json: hidden 2304, KDA 32×128, MLA
// 32 heads, dense MLP 9216, shared expert 1024; 256 experts of 1024, top-8) and Kimi-K3
// (configs/kimi-k3.json: hidden 7168, q_lora 1536, 96 heads, MLP 33792; 896 routed experts of
// 3072 into the 3584 latent, top-16), dense at m = 512, 2048, 8192; the MoE at 8192 tokens (48B)
// and 2048 tokens (K3). Each point: the median of --reps event-timed calls after --warmup.
// Inputs are random (never zeros). Our output (NaN-poisoned first) is checked against cuBLAS's
// (relative L2 over the first 512 rows; both sum the same BF16 products in F32, so ~1e-6) at
// every dense point.
//
// Usage: prefill_gemm_bench [--m 512,2048,8192] [--reps N] [--warmup N] [--no-moe] [--json PATH]
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "kimirt/backend/cuda/kernels.h"

namespace {

using kimirt::bench::Fill;
using kimirt::bench::Hash;
using kimirt::bench::TimeMs;

#define BENCH_CUBLAS_OK(expr)                                                                       \
  do {                                                                                              \
    const cublasStatus_t bench_s = (expr);                                                          \
    if (bench_s != CUBLAS_STATUS_SUCCESS) {                                                         \
      std::fprintf(stderr, "%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #expr, int(bench_s)); \
      std::exit(1);                                                                                 \
    }                                                                                               \
  } while (0)

constexpr double kPeakTflops = 790.0;

struct Shape {
  const char* name;
  int64_t n, k;
};
const Shape kShapes[] = {
    {"kl48.kda_q|k|v", 4096, 2304}, {"kl48.kda_o|mla_o", 2304, 4096}, {"kl48.mla_q", 6144, 2304},
    {"kl48.mla_kv_a", 576, 2304},   {"kl48.mlp_gate|up", 9216, 2304}, {"kl48.mlp_down", 2304, 9216},
    {"kl48.shared_up", 1024, 2304}, {"k3.q_a", 1536, 7168},           {"k3.q_b", 18432, 1536},
    {"k3.kv_a", 576, 7168},         {"k3.o", 7168, 12288},            {"k3.mlp_gate|up", 33792, 7168},
    {"k3.mlp_down", 7168, 33792},
};

struct MoeShape {
  const char* name;
  int64_t E, k, T, De, I;
};
const MoeShape kMoeShapes[] = {
    {"kl48.moe", 256, 8, 8192, 2304, 1024},
    {"k3.moe", 896, 16, 2048, 3584, 3072},
};

// MXFP4: random code bytes; scales 2^-9 .. 2^-5 (E8M0 118..122), as the tests use.
__global__ void FillMxfp4Kernel(uint8_t* codes, int64_t n_codes, uint8_t* scales, int64_t n_scales, uint64_t seed) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n_codes; i += int64_t{gridDim.x} * blockDim.x) {
    codes[i] = static_cast<uint8_t>(Hash(seed, i) >> 56);
    if (i < n_scales) scales[i] = static_cast<uint8_t>(118 + Hash(seed + 1, i) % 5);
  }
}
std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v <= kimirt::cuda::kGemvMaxRows) {
      std::fprintf(stderr, "--m: each value must be more than %lld (prefill), got '%s'\n",
                   static_cast<long long>(kimirt::cuda::kGemvMaxRows), s);
      std::exit(2);
    }
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double d = double{got[i]} - want[i];
    num += std::isnan(d) ? INFINITY : d * d;
    den += double{want[i]} * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

struct DensePoint {
  std::string name;
  int64_t m, n, k;
  double ms, cublas_ms, rel_l2;
};
struct MoePoint {
  std::string name, format;
  int64_t E, k, T, De, I;
  double ms, cuda_core_ms;
};
double Tflops(double flop, double ms) { return flop / (ms * 1e-3) / 1e12; }

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> ms_list = {512, 2048, 8192};
  int reps = 20, warmup = 3;
  bool moe = true;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--m" && i + 1 < argc) {
      ms_list = ParseList(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && i + 1 < argc) {
      warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--no-moe") {
      moe = false;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--m 512,2048,8192] [--reps N] [--warmup N] [--no-moe] [--json PATH]\n",
                   argv[0]);
      return 2;
    }
  }
  cudaDeviceProp prop{};
  BENCH_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  BENCH_CUDA_OK(cudaStreamCreate(&s));
  cublasHandle_t blas;
  BENCH_CUBLAS_OK(cublasCreate(&blas));
  BENCH_CUBLAS_OK(cublasSetStream(blas, s));
  std::printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // --- dense ---
  const int64_t max_m = *std::max_element(ms_list.begin(), ms_list.end());
  std::vector<DensePoint> dense;
  for (const Shape& sh : kShapes) {
    uint16_t *w = nullptr, *xb = nullptr;
    float *x = nullptr, *y = nullptr, *y_ref = nullptr;
    BENCH_CUDA_OK(cudaMalloc(&w, static_cast<size_t>(sh.n * sh.k) * 2));
    BENCH_CUDA_OK(cudaMalloc(&x, static_cast<size_t>(max_m * sh.k) * 4));
    BENCH_CUDA_OK(cudaMalloc(&xb, static_cast<size_t>(max_m * sh.k) * 2));
    BENCH_CUDA_OK(cudaMalloc(&y, static_cast<size_t>(max_m * sh.n) * 4));
    BENCH_CUDA_OK(cudaMalloc(&y_ref, static_cast<size_t>(max_m * sh.n) * 4));
    Fill(w, nullptr, sh.n * sh.k, 100, 0.05f);
    Fill(xb, x, max_m * sh.k, 7, 1.0f);  // xb = bf16(x): what cuBLAS gets, what ours rounds x to
    for (int64_t m : ms_list) {
      void* scratch = nullptr;
      BENCH_CUDA_OK(cudaMalloc(&scratch, kimirt::cuda::PrefillGemmScratchBytes(m, sh.n, sh.k, w)));
      const auto ours = [&](int) { kimirt::cuda::PrefillGemm(x, w, y, m, sh.n, sh.k, scratch, s); };
      const float one = 1.0f, zero = 0.0f;
      // Row-major y [m, n] = xb [m, k] · w [n, k]ᵀ, in cuBLAS's column-major terms yᵀ = w · xbᵀ.
      const auto peer = [&](int) {
        BENCH_CUBLAS_OK(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(sh.n), static_cast<int>(m),
                                     static_cast<int>(sh.k), &one, w, CUDA_R_16BF, static_cast<int>(sh.k), xb,
                                     CUDA_R_16BF, static_cast<int>(sh.k), &zero, y_ref, CUDA_R_32F,
                                     static_cast<int>(sh.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      BENCH_CUDA_OK(cudaMemsetAsync(y, 0xff, static_cast<size_t>(m * sh.n) * 4, s));  // NaN poison
      ours(0);
      peer(0);
      BENCH_CUDA_OK(cudaStreamSynchronize(s));
      // The first 512 rows (4 row tiles; the copy and the host sum stay small at K3's widths).
      const int64_t check_rows = std::min<int64_t>(m, 512);
      std::vector<float> got(static_cast<size_t>(check_rows * sh.n)), want(got.size());
      BENCH_CUDA_OK(cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost));
      BENCH_CUDA_OK(cudaMemcpy(want.data(), y_ref, want.size() * 4, cudaMemcpyDeviceToHost));
      const double rel = RelL2(got, want);
      const double t_ours = TimeMs(s, warmup, reps, ours), t_peer = TimeMs(s, warmup, reps, peer);
      BENCH_CUDA_OK(cudaFree(scratch));
      dense.push_back({sh.name, m, sh.n, sh.k, t_ours, t_peer, rel});
      std::fprintf(stderr, "%s m=%lld: %.3f ms (cuBLAS %.3f), rel %.2e\n", sh.name, static_cast<long long>(m), t_ours,
                   t_peer, rel);
    }
    for (void* p : {static_cast<void*>(w), static_cast<void*>(x), static_cast<void*>(xb), static_cast<void*>(y),
                    static_cast<void*>(y_ref)}) {
      BENCH_CUDA_OK(cudaFree(p));
    }
  }

  // --- grouped MoE ---
  std::vector<MoePoint> moes;
  for (const MoeShape& ms : moe ? std::vector<MoeShape>(std::begin(kMoeShapes), std::end(kMoeShapes))
                                : std::vector<MoeShape>{}) {
    const int64_t E = ms.E, k = ms.k, T = ms.T, De = ms.De, I = ms.I, n = T * k, max_active = std::min(E, n);
    // Routing: each token k distinct experts, uniformly (a partial Fisher-Yates per token).
    std::vector<int32_t> idx(static_cast<size_t>(n)), perm(static_cast<size_t>(E));
    uint64_t r = 12345;
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t e = 0; e < E; ++e) perm[static_cast<size_t>(e)] = static_cast<int32_t>(e);
      for (int64_t j = 0; j < k; ++j) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const int64_t pick = j + static_cast<int64_t>((r >> 33) % static_cast<uint64_t>(E - j));
        std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(pick)]);
        idx[static_cast<size_t>(t * k + j)] = perm[static_cast<size_t>(j)];
      }
    }
    int32_t *d_idx = nullptr, *groups = nullptr;
    float *z = nullptr, *grouped = nullptr, *h = nullptr;
    BENCH_CUDA_OK(cudaMalloc(&d_idx, idx.size() * 4));
    BENCH_CUDA_OK(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CUDA_OK(cudaMalloc(&groups, static_cast<size_t>(2 * n + 2 * max_active + 2) * 4));
    BENCH_CUDA_OK(cudaMalloc(&z, static_cast<size_t>(T * De) * 4));
    BENCH_CUDA_OK(cudaMalloc(&grouped, static_cast<size_t>(n * De) * 4));
    BENCH_CUDA_OK(cudaMalloc(&h, static_cast<size_t>(n * I) * 4));
    Fill(nullptr, z, T * De, 3, 1.0f);
    kimirt::cuda::ExpertGroups g;
    g.order = groups;
    g.pos = groups + n;
    g.active = groups + 2 * n;
    g.begin = g.active + max_active;
    g.num_active = g.begin + max_active + 1;
    void* scratch = nullptr;
    BENCH_CUDA_OK(cudaMalloc(&scratch, kimirt::cuda::MoePrefillScratchBytes(T, k, De, I, max_active)));
    for (const bool mxfp4 : {false, true}) {
      // Every expert its own weights (BF16: 59 GB at K3 widths; MXFP4: 15.7 GB), so HBM serves them.
      const int64_t per_byte = mxfp4 ? 2 : 1, elt = mxfp4 ? 1 : 2;
      std::vector<const void*> table(static_cast<size_t>(6 * E), nullptr);
      std::vector<void*> owned;
      for (int m = 0; m < 3; ++m) {
        const int64_t rows = m < 2 ? I : De, cols = m < 2 ? De : I;
        for (int64_t e = 0; e < E; ++e) {
          void* wp = nullptr;
          BENCH_CUDA_OK(cudaMalloc(&wp, static_cast<size_t>(rows * cols / per_byte * elt)));
          owned.push_back(wp);
          table[static_cast<size_t>(m * E + e)] = wp;
          const uint64_t seed = 1000 + static_cast<uint64_t>(m * E + e) * 7;
          if (mxfp4) {
            void* sp = nullptr;
            BENCH_CUDA_OK(cudaMalloc(&sp, static_cast<size_t>(rows * cols / 32)));
            owned.push_back(sp);
            table[static_cast<size_t>((3 + m) * E + e)] = sp;
            FillMxfp4Kernel<<<4096, 256>>>(static_cast<uint8_t*>(wp), rows * cols / 2, static_cast<uint8_t*>(sp),
                                           rows * cols / 32, seed);
            BENCH_CUDA_OK(cudaGetLastError());
          } else {
            Fill(static_cast<uint16_t*>(wp), nullptr, rows * cols, seed, 0.03f);
          }
        }
      }
      void* d_table = nullptr;
      BENCH_CUDA_OK(cudaMalloc(&d_table, table.size() * sizeof(void*)));
      BENCH_CUDA_OK(cudaMemcpy(d_table, table.data(), table.size() * sizeof(void*), cudaMemcpyHostToDevice));
      const void* const* p = static_cast<const void* const*>(d_table);
      const auto sc = [&](int at) { return reinterpret_cast<const uint8_t* const*>(p + at * E); };
      const kimirt::cuda::ExpertPointerTable w{p, p + E, p + 2 * E, sc(3), sc(4), sc(5)};
      const auto ours = [&](int) {
        kimirt::cuda::MoeGroupByExpert(d_idx, n, E, g, s);
        kimirt::cuda::MoePrefillExperts(z, T, k, g, max_active, De, I, w, mxfp4, 1, 4.0f, true, 25.0f, scratch,
                                        grouped, s);
      };
      const auto before = [&](int) {
        kimirt::cuda::MoeGroupByExpert(d_idx, n, E, g, s);
        kimirt::cuda::MoeGroupedExperts(z, k, g, max_active, De, I, w, mxfp4 ? 2 : 1, 1, 4.0f, true, 25.0f, h,
                                        grouped, s);
      };
      const double t_ours = TimeMs(s, warmup, reps, ours);
      const double t_before = TimeMs(s, 1, 3, before);
      moes.push_back({ms.name, mxfp4 ? "mxfp4" : "bf16", E, k, T, De, I, t_ours, t_before});
      std::fprintf(stderr, "%s %s: %.3f ms (CUDA cores %.3f)\n", ms.name, mxfp4 ? "mxfp4" : "bf16", t_ours, t_before);
      BENCH_CUDA_OK(cudaFree(d_table));
      for (void* q : owned) BENCH_CUDA_OK(cudaFree(q));
    }
    for (void* q : {static_cast<void*>(d_idx), static_cast<void*>(groups), static_cast<void*>(z),
                    static_cast<void*>(grouped), static_cast<void*>(h), scratch}) {
      BENCH_CUDA_OK(cudaFree(q));
    }
  }

  // --- table (last) and JSON ---
  std::printf("%-18s %5s %6s %6s %8s %7s %6s %9s %7s %6s %8s\n", "dense", "m", "n", "k", "ms", "TFLOP/s", "of790",
              "cublas_ms", "TFLOP/s", "of790", "relL2");
  for (const DensePoint& d : dense) {
    const double flop = 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k);
    std::printf("%-18s %5lld %6lld %6lld %8.4f %7.1f %6.3f %9.4f %7.1f %6.3f %8.1e\n", d.name.c_str(),
                static_cast<long long>(d.m), static_cast<long long>(d.n), static_cast<long long>(d.k), d.ms,
                Tflops(flop, d.ms), Tflops(flop, d.ms) / kPeakTflops, d.cublas_ms, Tflops(flop, d.cublas_ms),
                Tflops(flop, d.cublas_ms) / kPeakTflops, d.rel_l2);
  }
  std::printf("%-10s %6s %4s %3s %5s %5s %5s %8s %7s %6s %12s\n", "moe", "format", "E", "k", "T", "De", "I", "ms",
              "TFLOP/s", "of790", "cuda_core_ms");
  for (const MoePoint& m : moes) {
    const double flop = 6.0 * static_cast<double>(m.T * m.k) * static_cast<double>(m.De) * static_cast<double>(m.I);
    std::printf("%-10s %6s %4lld %3lld %5lld %5lld %5lld %8.3f %7.1f %6.3f %12.3f\n", m.name.c_str(),
                m.format.c_str(), static_cast<long long>(m.E), static_cast<long long>(m.k),
                static_cast<long long>(m.T), static_cast<long long>(m.De), static_cast<long long>(m.I), m.ms,
                Tflops(flop, m.ms), Tflops(flop, m.ms) / kPeakTflops, m.cuda_core_ms);
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"peak_tflops\": %.0f, \"reps\": %d, \"dense\": [", prop.name, kPeakTflops,
                 reps);
    for (size_t i = 0; i < dense.size(); ++i) {
      const DensePoint& d = dense[i];
      const double flop = 2.0 * static_cast<double>(d.m) * static_cast<double>(d.n) * static_cast<double>(d.k);
      std::fprintf(f,
                   "%s\n  {\"name\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"ms\": %.5f, \"tflops\": %.2f, "
                   "\"peak_fraction\": %.4f, \"cublas_ms\": %.5f, \"cublas_tflops\": %.2f, "
                   "\"cublas_peak_fraction\": %.4f, \"rel_l2_vs_cublas\": %.3e}",
                   i ? "," : "", d.name.c_str(), static_cast<long long>(d.m), static_cast<long long>(d.n),
                   static_cast<long long>(d.k), d.ms, Tflops(flop, d.ms), Tflops(flop, d.ms) / kPeakTflops,
                   d.cublas_ms, Tflops(flop, d.cublas_ms), Tflops(flop, d.cublas_ms) / kPeakTflops, d.rel_l2);
    }
    std::fprintf(f, "\n], \"moe\": [");
    for (size_t i = 0; i < moes.size(); ++i) {
      const MoePoint& m = moes[i];
      const double flop = 6.0 * static_cast<double>(m.T * m.k) * static_cast<double>(m.De) * static_cast<double>(m.I);
      std::fprintf(f,
                   "%s\n  {\"name\": \"%s\", \"format\": \"%s\", \"experts\": %lld, \"top_k\": %lld, \"tokens\": %lld, "
                   "\"De\": %lld, \"I\": %lld, \"ms\": %.5f, \"tflops\": %.2f, \"peak_fraction\": %.4f, "
                   "\"cuda_core_ms\": %.5f}",
                   i ? "," : "", m.name.c_str(), m.format.c_str(), static_cast<long long>(m.E),
                   static_cast<long long>(m.k), static_cast<long long>(m.T), static_cast<long long>(m.De),
                   static_cast<long long>(m.I), m.ms, Tflops(flop, m.ms), Tflops(flop, m.ms) / kPeakTflops,
                   m.cuda_core_ms);
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  BENCH_CUBLAS_OK(cublasDestroy(blas));
  return 0;
}
