// Decode GEMM bandwidth (issue 12): times the path CudaBackend::Linear takes for 1..64 rows with
// BF16-held weights (cuda::DecodeGemm: x split, the tensor-core GEMM, the split-k sum) at the
// projection shapes of Kimi-Linear-48B (configs/kimi-linear-48b-a3b.json: hidden 2304, KDA 32×128,
// MLA 32 heads of 128 + 64, latent 512 + 64, dense MLP 9216, shared expert 1024, vocab 163840) and
// Kimi-K3 (configs/kimi-k3.json: hidden 7168, q_lora 1536, 96 heads, MLP 33792). Reports GB/s of
// weight bytes (each read once per call: the floor) against 4.8 TB/s (the H200's datasheet) and
// against a device-to-device copy measured in the same run.
//
// Each point: CUDA events around every call, the median of --reps after --warmup calls, the
// weight rotated among enough copies that together they are ≥ 4× the L2, so HBM serves it. Also
// timed as replays of a CUDA graph of max(20, copies) calls (the median replay over the calls):
// without the launch gaps, which count for the small shapes (a call is 2-3 kernels), and which a
// decode step captured as a graph will not pay either. Inputs are random (never zeros:
// METHOD.md), and every CUDA call is checked.
//
// Usage: decode_gemm_bench [--rows 1,8,32,64] [--reps N] [--warmup N] [--json PATH]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
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
using kimirt::bench::TimeMs;

struct Shape {
  const char* name;
  int64_t n, k;
};

const Shape kShapes[] = {
    {"kl48.kda_q|k|v", 4096, 2304},   {"kl48.kda_o", 2304, 4096},       {"kl48.mla_q", 6144, 2304},
    {"kl48.mla_kv_a", 576, 2304},     {"kl48.mla_o", 2304, 4096},       {"kl48.mlp_gate|up", 9216, 2304},
    {"kl48.mlp_down", 2304, 9216},    {"kl48.shared_up", 1024, 2304},   {"kl48.lm_head", 163840, 2304},
    {"k3.q_a", 1536, 7168},           {"k3.q_b", 18432, 1536},          {"k3.kv_a", 576, 7168},
    {"k3.o", 7168, 12288},            {"k3.mlp_gate|up", 33792, 7168},  {"k3.mlp_down", 7168, 33792},
    {"k3.lm_head", 163840, 7168},
};

std::vector<int64_t> ParseRows(const char* s) {
  std::vector<int64_t> out;
  for (const char* p = s; *p != '\0';) {
    char* end = nullptr;
    const long v = std::strtol(p, &end, 10);
    if (end == p || v < 1 || v > kimirt::cuda::kGemvMaxRows) {
      std::fprintf(stderr, "--rows: each value must be 1..%lld, got '%s'\n",
                   static_cast<long long>(kimirt::cuda::kGemvMaxRows), s);
      std::exit(2);
    }
    out.push_back(v);
    p = *end == ',' ? end + 1 : end;
  }
  return out;
}

struct Point {
  std::string name;
  int64_t m, n, k, splits;
  double ms, gbps, ms_graph, gbps_graph;
};

// The median time of one call of `fn`, from replays of a graph of `calls` calls.
template <typename Fn>
double GraphMsPerCall(cudaStream_t s, int reps, int calls, Fn fn) {
  cudaGraph_t graph = nullptr;
  BENCH_CUDA_OK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  for (int i = 0; i < calls; ++i) fn(i);
  BENCH_CUDA_OK(cudaStreamEndCapture(s, &graph));
  cudaGraphExec_t exec = nullptr;
  BENCH_CUDA_OK(cudaGraphInstantiate(&exec, graph, 0));
  const double ms = TimeMs(s, 2, std::max(3, reps / 10), [&](int) { BENCH_CUDA_OK(cudaGraphLaunch(exec, s)); });
  BENCH_CUDA_OK(cudaGraphExecDestroy(exec));
  BENCH_CUDA_OK(cudaGraphDestroy(graph));
  return ms / calls;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> rows = {1, 8, 32, 64};
  int reps = 100, warmup = 10;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rows" && i + 1 < argc) {
      rows = ParseRows(argv[++i]);
    } else if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--warmup" && i + 1 < argc) {
      warmup = std::max(0, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: %s [--rows 1,8,32,64] [--reps N] [--warmup N] [--json PATH]\n", argv[0]);
      return 2;
    }
  }
  constexpr double kPeakGbps = 4800.0;
  cudaDeviceProp prop{};
  BENCH_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  BENCH_CUDA_OK(cudaStreamCreate(&s));

  // The copy ceiling: 1 GiB device to device, bytes read + written.
  double copy_gbps = 0;
  {
    const size_t bytes = size_t{1} << 30;
    void *a = nullptr, *b = nullptr;
    BENCH_CUDA_OK(cudaMalloc(&a, bytes));
    BENCH_CUDA_OK(cudaMalloc(&b, bytes));
    Fill(static_cast<uint16_t*>(a), nullptr, static_cast<int64_t>(bytes / 2), 1, 1.0f);
    const double ms = TimeMs(s, 3, 20, [&](int) { BENCH_CUDA_OK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s)); });
    copy_gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
    BENCH_CUDA_OK(cudaFree(a));
    BENCH_CUDA_OK(cudaFree(b));
  }
  std::printf("device %s, L2 %d MB, copy %.0f GB/s (read + write)\n", prop.name, prop.l2CacheSize >> 20, copy_gbps);

  const int64_t max_m = *std::max_element(rows.begin(), rows.end());
  std::vector<Point> points;
  for (const Shape& sh : kShapes) {
    const size_t w_bytes = static_cast<size_t>(sh.n * sh.k) * sizeof(uint16_t);
    const size_t rotate_bytes = std::max<size_t>(4 * static_cast<size_t>(prop.l2CacheSize), 2 * w_bytes);
    const int copies = static_cast<int>((rotate_bytes + w_bytes - 1) / w_bytes);
    std::vector<uint16_t*> w(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      BENCH_CUDA_OK(cudaMalloc(&w[c], w_bytes));
      Fill(w[c], nullptr, sh.n * sh.k, 100 + static_cast<uint64_t>(c), 0.05f);
    }
    float *x = nullptr, *y = nullptr;
    BENCH_CUDA_OK(cudaMalloc(&x, static_cast<size_t>(max_m * sh.k) * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc(&y, static_cast<size_t>(max_m * sh.n) * sizeof(float)));
    Fill(nullptr, x, max_m * sh.k, 7, 1.0f);
    for (int64_t m : rows) {
      void* scratch = nullptr;
      BENCH_CUDA_OK(cudaMalloc(&scratch, kimirt::cuda::DecodeGemmScratchBytes(m, sh.n, sh.k)));
      const auto call = [&](int i) {
        kimirt::cuda::DecodeGemm(x, w[static_cast<size_t>(i % copies)], y, m, sh.n, sh.k, scratch, s);
      };
      const double ms = TimeMs(s, warmup, reps, call);
      const double ms_graph = GraphMsPerCall(s, reps, std::max(20, copies), call);
      BENCH_CUDA_OK(cudaFree(scratch));
      const double gb = static_cast<double>(w_bytes) / 1e9;
      points.push_back({sh.name, m, sh.n, sh.k, kimirt::cuda::DecodeGemmSplits(sh.n, sh.k), ms, gb / (ms * 1e-3),
                        ms_graph, gb / (ms_graph * 1e-3)});
    }
    for (uint16_t* p : w) BENCH_CUDA_OK(cudaFree(p));
    BENCH_CUDA_OK(cudaFree(x));
    BENCH_CUDA_OK(cudaFree(y));
  }

  // Per call (events) and in a graph; fractions of 4.8 TB/s and of the copy.
  std::printf("%-17s %3s %6s %5s %3s %8s %6s %6s %6s %8s %6s %6s\n", "shape", "m", "n", "k", "spl", "ms", "GB/s",
              "of4.8T", "ofcopy", "graph_ms", "GB/s", "of4.8T");
  for (const Point& p : points) {
    std::printf("%-17s %3lld %6lld %5lld %3lld %8.4f %6.0f %6.3f %6.3f %8.4f %6.0f %6.3f\n", p.name.c_str(),
                static_cast<long long>(p.m), static_cast<long long>(p.n), static_cast<long long>(p.k),
                static_cast<long long>(p.splits), p.ms, p.gbps, p.gbps / kPeakGbps, p.gbps / copy_gbps, p.ms_graph,
                p.gbps_graph, p.gbps_graph / kPeakGbps);
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f, "{\"device\": \"%s\", \"peak_gbps\": %.0f, \"copy_gbps\": %.1f, \"reps\": %d, \"points\": [",
                 prop.name, kPeakGbps, copy_gbps, reps);
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      std::fprintf(f,
                   "%s\n  {\"name\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"splits\": %lld, \"ms\": %.5f, "
                   "\"gbps\": %.1f, \"bandwidth_fraction\": %.4f, \"copy_fraction\": %.4f, \"ms_graph\": %.5f, "
                   "\"gbps_graph\": %.1f, \"bandwidth_fraction_graph\": %.4f}",
                   i ? "," : "", p.name.c_str(), static_cast<long long>(p.m), static_cast<long long>(p.n),
                   static_cast<long long>(p.k), static_cast<long long>(p.splits), p.ms, p.gbps, p.gbps / kPeakGbps,
                   p.gbps / copy_gbps, p.ms_graph, p.gbps_graph, p.gbps_graph / kPeakGbps);
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  return 0;
}
