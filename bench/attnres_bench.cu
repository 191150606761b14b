// Block AttnRes's mix (spec §8.2) at K3's width as the decode step runs it: n candidates of T rows
// (K3: attn_res_block_size 12 over 93 layers, so 2 to 9 candidates, two mixes a layer and the
// output's, on every tensor-parallel rank over the whole row), each variant timed as µs a call
// from a graph of back-to-back calls (programmatic dependent launch as in the step):
//   held mix            cuda::AttnResMix, one block a row (the default's mix)
//   held mix, RmsNorm   that and cuda::RmsNorm: two kernels (KIMIRT_ATTNRES_MIX_NORM=0)
//   held mix + norm     cuda::AttnResMixNorm, one kernel (the default for a sub-layer's input)
//   cluster mix (+ norm) cuda::AttnResMixCluster, 8 blocks a row (KIMIRT_ATTNRES_CLUSTER=1)
// and the bytes a call reads from L2 (each candidate twice: scores, then the mix).
//
// Usage: attnres_bench [--json FILE] [--width 7168] [--batches 1,8,32] [--candidates 2,5,9]
//                      [--reps 50]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "kimirt/backend/cuda/kernels.h"

namespace {

namespace kc = kimirt::cuda;

std::vector<int64_t> ParseList(const char* s) {
  std::vector<int64_t> v;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) v.push_back(std::atoll(item.c_str()));
  return v;
}

struct Point {
  int64_t batch, candidates;
  double held_mix, held_mix_then_norm, held_mix_norm, cluster_mix, cluster_mix_norm;  // µs a call
  double l2_mb;
};

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int64_t D = 7168;
  std::vector<int64_t> batches = {1, 8, 32}, candidates = {2, 5, 9};
  int reps = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--json")) json = argv[i + 1];
    else if (!std::strcmp(argv[i], "--width")) D = std::atoll(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--batches")) batches = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--candidates")) candidates = ParseList(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "attnres_bench: unknown flag %s\n", argv[i]);
      return 2;
    }
  }
  if (!kc::AttnResMixNormSupported(D) || !kc::AttnResMixClusterSupported(D)) {
    std::fprintf(stderr, "attnres_bench: width %lld is past the held and cluster kernels' 8,192\n",
                 static_cast<long long>(D));
    return 2;
  }
  cudaDeviceProp prop{};
  BENCH_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  cudaStream_t s;
  BENCH_CUDA_OK(cudaStreamCreate(&s));
  int64_t max_t = 0, max_n = 0;
  for (int64_t t : batches) max_t = t > max_t ? t : max_t;
  for (int64_t n : candidates) max_n = n > max_n ? n : max_n;
  if (max_n < 1 || max_n > kc::kAttnResMaxCandidates || max_t < 1) {
    std::fprintf(stderr, "attnres_bench: 1..%d candidates and batches of 1 or more\n", kc::kAttnResMaxCandidates);
    return 2;
  }
  std::vector<float*> cand(static_cast<size_t>(max_n));
  for (int64_t i = 0; i < max_n; ++i) {
    BENCH_CUDA_OK(cudaMalloc(&cand[static_cast<size_t>(i)], max_t * D * sizeof(float)));
    kimirt::bench::Fill(nullptr, cand[static_cast<size_t>(i)], max_t * D, 100 + static_cast<uint64_t>(i),
                        0.5f + 0.25f * static_cast<float>(i % 5));
  }
  float *proj, *norm, *out_w, *mix, *y;
  BENCH_CUDA_OK(cudaMalloc(&proj, D * sizeof(float)));
  BENCH_CUDA_OK(cudaMalloc(&norm, D * sizeof(float)));
  BENCH_CUDA_OK(cudaMalloc(&out_w, D * sizeof(float)));
  BENCH_CUDA_OK(cudaMalloc(&mix, max_t * D * sizeof(float)));
  BENCH_CUDA_OK(cudaMalloc(&y, max_t * D * sizeof(float)));
  kimirt::bench::Fill(nullptr, proj, D, 1, 0.1f);
  kimirt::bench::Fill(nullptr, norm, D, 2, 1.0f);
  kimirt::bench::Fill(nullptr, out_w, D, 3, 1.0f);
  BENCH_CUDA_OK(cudaDeviceSynchronize());

  std::vector<Point> points;
  constexpr int kCalls = 20;
  const auto us = [&](auto&& call) { return 1e3 * kimirt::bench::GraphMsPerCall(s, reps, kCalls, [&](int) { call(); }); };
  std::printf("%s, width %lld, us a call (graph of %d calls)\n", prop.name, static_cast<long long>(D), kCalls);
  std::printf("%5s %5s %9s %11s %11s %9s %11s %8s\n", "batch", "cands", "held mix", "mix,RmsNorm", "mix+norm",
              "cluster", "cluster+n", "L2 MB");
  for (int64_t T : batches) {
    for (int64_t n : candidates) {
      kc::AttnResCandidates c;
      for (int64_t i = 0; i < n; ++i) c.p[c.n++] = cand[static_cast<size_t>(i)];
      Point p{T, n, 0, 0, 0, 0, 0, 2.0 * static_cast<double>(n * T * D) * sizeof(float) / 1e6};
      p.held_mix = us([&] { kc::AttnResMix(c, proj, norm, 1e-6f, T, D, y, s); });
      p.held_mix_then_norm = us([&] {
        kc::AttnResMix(c, proj, norm, 1e-6f, T, D, mix, s);
        kc::RmsNorm(mix, out_w, 1e-5f, T, D, y, s);
      });
      p.held_mix_norm = us([&] { kc::AttnResMixNorm(c, proj, norm, 1e-6f, out_w, 1e-5f, T, D, y, s); });
      p.cluster_mix = us([&] { kc::AttnResMixCluster(c, proj, norm, 1e-6f, nullptr, 0.0f, T, D, y, s); });
      p.cluster_mix_norm = us([&] { kc::AttnResMixCluster(c, proj, norm, 1e-6f, out_w, 1e-5f, T, D, y, s); });
      points.push_back(p);
      std::printf("%5lld %5lld %9.2f %11.2f %11.2f %9.2f %11.2f %8.2f\n", static_cast<long long>(T),
                  static_cast<long long>(n), p.held_mix, p.held_mix_then_norm, p.held_mix_norm, p.cluster_mix,
                  p.cluster_mix_norm, p.l2_mb);
    }
  }
  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\n  \"device\": \"" << prop.name << "\",\n  \"model\": \"kimi-k3 Block AttnRes mix\",\n  \"width\": " << D
      << ",\n  \"calls_per_graph\": " << kCalls << ",\n  \"points\": [\n";
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      f << "    {\"batch\": " << p.batch << ", \"candidates\": " << p.candidates << ", \"held_mix_us\": " << p.held_mix
        << ", \"held_mix_then_rmsnorm_us\": " << p.held_mix_then_norm << ", \"held_mix_norm_us\": " << p.held_mix_norm
        << ", \"cluster_mix_us\": " << p.cluster_mix << ", \"cluster_mix_norm_us\": " << p.cluster_mix_norm
        << ", \"l2_read_mb\": " << p.l2_mb << "}" << (i + 1 < points.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
  }
  for (float* p : cand) BENCH_CUDA_OK(cudaFree(p));
  for (float* p : {proj, norm, out_w, mix, y}) BENCH_CUDA_OK(cudaFree(p));
  BENCH_CUDA_OK(cudaStreamDestroy(s));
  return 0;
}
