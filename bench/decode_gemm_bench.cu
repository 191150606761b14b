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
// Grouped rows (cuda::DecodeGemmGroup, CudaBackend::LinearGroup): the projections a Kimi-Linear-48B
// layer reads from one input — KDA q, k, v, b, f_a, g_a of x; KDA f_b, g_b; MLA q, kv_a; the shared
// expert's gate, up — timed in a graph as one grouped call and as the same problems called one by
// one (the path before grouping), with the ratio separate / grouped.
//
// --l2-resident: one copy of each weight, not rotated, so after the first call L2 serves what of
// it fits (~50 MB on an H200): how fast a GEMM could read a weight asked into L2 ahead of it
// (Backend::PrefetchWeights), against the HBM-served default.
//
// --tiled: the weights in the decode-tiled layout (cuda::TileWeightForDecode) where their shape
// allows it; each shape's and group's outputs are first checked bit for bit against the row-major
// weights' at 1 and the most rows.
//
// Usage: decode_gemm_bench [--rows 1,8,32,64] [--reps N] [--warmup N] [--l2-resident] [--tiled] [--json PATH]
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
using kimirt::bench::GraphMsPerCall;
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

// A group's problems: which x (problems of one x read the same buffer), n, k.
struct GroupProblem {
  int x;
  int64_t n, k;
};
struct Group {
  const char* name;
  std::vector<GroupProblem> problems;
};

const Group kGroups[] = {
    {"kl48.kda_x", {{0, 4096, 2304}, {0, 4096, 2304}, {0, 4096, 2304}, {0, 32, 2304}, {0, 128, 2304}, {0, 128, 2304}}},
    {"kl48.kda_fb_gb", {{0, 4096, 128}, {1, 4096, 128}}},
    {"kl48.mla_q_kv_a", {{0, 6144, 2304}, {0, 576, 2304}}},
    {"kl48.shared_gate_up", {{0, 1024, 2304}, {0, 1024, 2304}}},
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

struct GroupPoint {
  std::string name;
  int64_t m, problems;
  double weight_mb, ms_separate, ms_grouped;
};

// --tiled: w (row-major, n × k) replaced by its decode-tiled copy. Before that, for m = 1 and
// max_m, DecodeGemm over both must give the same bytes (the layout moves loads, not sums); a
// mismatch ends the bench.
uint16_t* TileChecked(uint16_t* w, int64_t n, int64_t k, const float* x, int64_t max_m, cudaStream_t s,
                      const char* name) {
  uint16_t* t = nullptr;
  BENCH_CUDA_OK(cudaMalloc(&t, static_cast<size_t>(n * k) * sizeof(uint16_t)));
  kimirt::cuda::TileWeightForDecode(w, t, n, k, s);
  for (int64_t m : {int64_t{1}, max_m}) {
    float *a = nullptr, *b = nullptr;
    void* scratch = nullptr;
    const size_t bytes = static_cast<size_t>(m * n) * sizeof(float);
    BENCH_CUDA_OK(cudaMalloc(&a, bytes));
    BENCH_CUDA_OK(cudaMalloc(&b, bytes));
    BENCH_CUDA_OK(cudaMalloc(&scratch, kimirt::cuda::DecodeGemmScratchBytes(m, n, k)));
    kimirt::cuda::DecodeGemm(x, w, a, m, n, k, scratch, s);
    kimirt::cuda::DecodeGemm(x, t, b, m, n, k, scratch, s, true);
    std::vector<float> ha(static_cast<size_t>(m * n)), hb(ha.size());
    BENCH_CUDA_OK(cudaMemcpyAsync(ha.data(), a, bytes, cudaMemcpyDeviceToHost, s));
    BENCH_CUDA_OK(cudaMemcpyAsync(hb.data(), b, bytes, cudaMemcpyDeviceToHost, s));
    BENCH_CUDA_OK(cudaStreamSynchronize(s));
    if (std::memcmp(ha.data(), hb.data(), bytes) != 0) {
      std::fprintf(stderr, "%s: tiled weights gave other bits than row-major at m=%lld\n", name,
                   static_cast<long long>(m));
      std::exit(1);
    }
    BENCH_CUDA_OK(cudaFree(a));
    BENCH_CUDA_OK(cudaFree(b));
    BENCH_CUDA_OK(cudaFree(scratch));
  }
  BENCH_CUDA_OK(cudaFree(w));
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> rows = {1, 8, 32, 64};
  int reps = 100, warmup = 10;
  std::string json;
  bool l2_resident = false, tiled = false;
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
    } else if (a == "--tiled") {
      tiled = true;
    } else if (a == "--l2-resident") {
      l2_resident = true;
    } else {
      std::fprintf(stderr, "usage: %s [--rows 1,8,32,64] [--reps N] [--warmup N] [--l2-resident] [--tiled] [--json PATH]\n",
                   argv[0]);
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
    const int copies = l2_resident ? 1 : static_cast<int>((rotate_bytes + w_bytes - 1) / w_bytes);
    std::vector<uint16_t*> w(static_cast<size_t>(copies));
    for (int c = 0; c < copies; ++c) {
      BENCH_CUDA_OK(cudaMalloc(&w[c], w_bytes));
      Fill(w[c], nullptr, sh.n * sh.k, 100 + static_cast<uint64_t>(c), 0.05f);
    }
    float *x = nullptr, *y = nullptr;
    BENCH_CUDA_OK(cudaMalloc(&x, static_cast<size_t>(max_m * sh.k) * sizeof(float)));
    BENCH_CUDA_OK(cudaMalloc(&y, static_cast<size_t>(max_m * sh.n) * sizeof(float)));
    Fill(nullptr, x, max_m * sh.k, 7, 1.0f);
    const bool tile = tiled && kimirt::cuda::DecodeGemmTileable(sh.n, sh.k);
    if (tile) {
      for (uint16_t*& p : w) p = TileChecked(p, sh.n, sh.k, x, max_m, s, sh.name);
    }
    for (int64_t m : rows) {
      void* scratch = nullptr;
      BENCH_CUDA_OK(cudaMalloc(&scratch, kimirt::cuda::DecodeGemmScratchBytes(m, sh.n, sh.k)));
      const auto call = [&](int i) {
        kimirt::cuda::DecodeGemm(x, w[static_cast<size_t>(i % copies)], y, m, sh.n, sh.k, scratch, s, tile);
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

  // The groups: per call from graph replays, each problem's DecodeGemm in turn vs one DecodeGemmGroup.
  std::vector<GroupPoint> group_points;
  for (const Group& g : kGroups) {
    int xs = 0;
    size_t w_bytes = 0;
    for (const GroupProblem& p : g.problems) {
      xs = std::max(xs, p.x + 1);
      w_bytes += static_cast<size_t>(p.n * p.k) * sizeof(uint16_t);
    }
    const size_t rotate_bytes = std::max<size_t>(4 * static_cast<size_t>(prop.l2CacheSize), 2 * w_bytes);
    const int copies = l2_resident ? 1 : static_cast<int>((rotate_bytes + w_bytes - 1) / w_bytes);
    const size_t count = g.problems.size();
    std::vector<uint16_t*> w(static_cast<size_t>(copies) * count);  // copy c, problem i: w[c * count + i]
    std::vector<float*> x(static_cast<size_t>(xs)), y(count);
    for (size_t j = 0; j < w.size(); ++j) {
      const GroupProblem& p = g.problems[j % count];
      BENCH_CUDA_OK(cudaMalloc(&w[j], static_cast<size_t>(p.n * p.k) * sizeof(uint16_t)));
      Fill(w[j], nullptr, p.n * p.k, 300 + static_cast<uint64_t>(j), 0.05f);
    }
    for (size_t i = 0; i < count; ++i) {
      const GroupProblem& p = g.problems[i];
      if (x[static_cast<size_t>(p.x)] == nullptr) {
        BENCH_CUDA_OK(cudaMalloc(&x[static_cast<size_t>(p.x)], static_cast<size_t>(max_m * p.k) * sizeof(float)));
        Fill(nullptr, x[static_cast<size_t>(p.x)], max_m * p.k, 11 + static_cast<uint64_t>(p.x), 1.0f);
      }
      BENCH_CUDA_OK(cudaMalloc(&y[i], static_cast<size_t>(max_m * p.n) * sizeof(float)));
    }
    std::vector<bool> tile(count);
    for (size_t j = 0; j < w.size(); ++j) {
      const GroupProblem& p = g.problems[j % count];
      tile[j % count] = tiled && kimirt::cuda::DecodeGemmTileable(p.n, p.k);
      if (tile[j % count]) w[j] = TileChecked(w[j], p.n, p.k, x[static_cast<size_t>(p.x)], max_m, s, g.name);
    }
    for (int64_t m : rows) {
      std::vector<void*> scratch(count);
      for (size_t i = 0; i < count; ++i) {
        BENCH_CUDA_OK(cudaMalloc(&scratch[i], kimirt::cuda::DecodeGemmScratchBytes(m, g.problems[i].n, g.problems[i].k)));
      }
      std::vector<kimirt::cuda::DecodeGemmProblem> dp(count);
      const auto problems_of = [&](int c) {
        for (size_t i = 0; i < count; ++i) {
          const GroupProblem& p = g.problems[i];
          dp[i] = {x[static_cast<size_t>(p.x)], w[static_cast<size_t>(c) * count + i], y[i], p.n, p.k, tile[i]};
        }
      };
      problems_of(0);
      void* group_scratch = nullptr;
      BENCH_CUDA_OK(cudaMalloc(&group_scratch, kimirt::cuda::DecodeGemmGroupScratchBytes(m, dp.data(), static_cast<int>(count))));
      const int calls = std::max(20, copies);
      const double ms_separate = GraphMsPerCall(s, reps, calls, [&](int c) {
        problems_of(c % copies);
        for (size_t i = 0; i < count; ++i) {
          kimirt::cuda::DecodeGemm(dp[i].x, dp[i].w, dp[i].y, m, dp[i].n, dp[i].k, scratch[i], s, dp[i].w_tiled);
        }
      });
      const double ms_grouped = GraphMsPerCall(s, reps, calls, [&](int c) {
        problems_of(c % copies);
        kimirt::cuda::DecodeGemmGroup(m, dp.data(), static_cast<int>(count), group_scratch, s);
      });
      for (void* p : scratch) BENCH_CUDA_OK(cudaFree(p));
      BENCH_CUDA_OK(cudaFree(group_scratch));
      group_points.push_back({g.name, m, static_cast<int64_t>(count), static_cast<double>(w_bytes) / 1e6, ms_separate,
                              ms_grouped});
    }
    for (uint16_t* p : w) BENCH_CUDA_OK(cudaFree(p));
    for (float* p : x) BENCH_CUDA_OK(cudaFree(p));
    for (float* p : y) BENCH_CUDA_OK(cudaFree(p));
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
  // The groups (graph, per call): separate calls vs one grouped call, and the weight bytes' GB/s.
  std::printf("\n%-20s %3s %4s %8s %9s %9s %6s %6s\n", "group", "m", "gemm", "MB", "sep_us", "group_us", "ratio",
              "GB/s");
  for (const GroupPoint& p : group_points) {
    std::printf("%-20s %3lld %4lld %8.2f %9.2f %9.2f %6.2f %6.0f\n", p.name.c_str(), static_cast<long long>(p.m),
                static_cast<long long>(p.problems), p.weight_mb, p.ms_separate * 1e3, p.ms_grouped * 1e3,
                p.ms_separate / p.ms_grouped, p.weight_mb / 1e3 / (p.ms_grouped * 1e-3));
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\"device\": \"%s\", \"peak_gbps\": %.0f, \"copy_gbps\": %.1f, \"reps\": %d, "
                 "\"l2_resident\": %s, \"tiled\": %s, \"points\": [",
                 prop.name, kPeakGbps, copy_gbps, reps, l2_resident ? "true" : "false", tiled ? "true" : "false");
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
    std::fprintf(f, "\n], \"groups\": [");
    for (size_t i = 0; i < group_points.size(); ++i) {
      const GroupPoint& p = group_points[i];
      std::fprintf(f,
                   "%s\n  {\"name\": \"%s\", \"m\": %lld, \"problems\": %lld, \"weight_mb\": %.3f, "
                   "\"us_separate_graph\": %.3f, \"us_grouped_graph\": %.3f, \"ratio\": %.3f, "
                   "\"gbps_grouped_graph\": %.1f}",
                   i ? "," : "", p.name.c_str(), static_cast<long long>(p.m), static_cast<long long>(p.problems),
                   p.weight_mb, p.ms_separate * 1e3, p.ms_grouped * 1e3, p.ms_separate / p.ms_grouped,
                   p.weight_mb / 1e3 / (p.ms_grouped * 1e-3));
    }
    std::fprintf(f, "\n]}\n");
    std::fclose(f);
  }
  return 0;
}
