// Kernel bench of the chunked KDA prefill (cuda::KdaChunked, kernels.h; issue 14 item 2): ms per
// call and TFLOP/s at T = 8192 with H = 96 and 32 (K = V = 128, one sequence) and varlen batches
// (8 × 1024 and 4 × 2048 at H = 96, and mixed lengths), in both operand modes: "f32" (three BF16
// parts per operand, the F32 mode's fused kernel) and "bf16" (the BF16 prefill mode's
// chunk-parallel kernels, one BF16 part per operand), each at its automatic value-block width,
// the BF16 mode at its other widths ("bf16_vb64" etc.), and "bf16_prep": the BF16 mode's
// chunk-parallel kernels alone (KdaChunkPrepOnly; the rest of "bf16" is the state kernel), and
// "bf16_prep_2sm" the same with the prep kernel's 128-register build (2 blocks per SM instead of
// 3, same records): which of the two the prep should be.
// scripts/gpu_check.sh kdachunk runs it beside FLA's chunk_kda (bench/kda_chunk_fla.py), which
// adds fla_ms and speedup_vs_fla to this program's JSON.
//
// Inputs: q, k, v, beta logits uniform in ±1 (never zeros: METHOD.md), α from the K3 gate
// (cuda::KdaLogDecay with lower bound −5 on random f), random incoming states in a pool by slot
// (a permutation). Timing: CUDA events around each call, median of --reps after 3 warm calls
// (kimirt::bench::TimeMs);
// each call continues from the states the previous one left (the time does not depend on them).
//
// FLOPs per token and head (the chunked form's matmuls at chunk C = 64, K = V = 128, counting
// the full C × C score blocks): 2·K·V each for (K̂⊙e^Γ)S, (Q̂⊙e^Γ)S and the state update, 2·C·V
// each for T·Y and Aqk·V', 2·C·K each for the two score matrices: 6KV + 4CV + 4CK = 163,840.
// The tensor cores run 1× (bf16) or 6× (f32) that; TFLOP/s counts the algorithm's FLOPs only.
//
// Usage: kda_chunk_bench [--json PATH] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "kimirt/backend/cuda/kernels.h"

namespace {

// n random values (kimirt::bench::Fill: never zeros) in a new device array.
float* Alloc(int64_t n, uint64_t seed, float scale) {
  float* p = nullptr;
  BENCH_CUDA_OK(cudaMalloc(&p, sizeof(float) * static_cast<size_t>(std::max<int64_t>(n, 1))));
  kimirt::bench::Fill(nullptr, p, n, seed, scale);
  return p;
}

constexpr int64_t kK = kimirt::cuda::kKdaChunkHeadDim;
constexpr double kFlopsPerTokenHead = 6.0 * kK * kK + 4.0 * 64 * kK + 4.0 * 64 * kK;

struct Case {
  std::string name;
  int64_t heads;
  std::vector<int64_t> lens;
};

struct Point {
  Case c;
  std::string mode;
  int64_t tokens;
  int value_block;
  double ms, tflops;
};

std::vector<Point> Run(const Case& c, int reps) {
  const int64_t H = c.heads, B = static_cast<int64_t>(c.lens.size());
  std::vector<int32_t> cu{0};
  for (int64_t n : c.lens) cu.push_back(cu.back() + static_cast<int32_t>(n));
  const int64_t T = cu.back(), n = T * H * kK;
  uint64_t seed = 7 * static_cast<uint64_t>(T) + static_cast<uint64_t>(H);
  kimirt::cuda::KdaChunkArgs a;
  float *q = Alloc(n, ++seed, 1.0f), *k = Alloc(n, ++seed, 1.0f), *v = Alloc(n, ++seed, 1.0f);
  float* beta = Alloc(T * H, ++seed, 1.0f);
  float *f = Alloc(n, ++seed, 2.0f), *a_log = Alloc(H, ++seed, 0.5f), *dt_bias = Alloc(H * kK, ++seed, 0.5f);
  float* alpha = Alloc(n, ++seed, 1.0f);
  float* pool = Alloc(B * H * kK * kK, ++seed, 0.1f);
  float* o = Alloc(n, ++seed, 1.0f);
  BENCH_CUDA_OK(cudaDeviceSynchronize());
  kimirt::cuda::KdaLogDecay(f, T, H, kK, a_log, dt_bias, true, -5.0f, alpha, nullptr);
  std::vector<int32_t> slots(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) slots[static_cast<size_t>(b)] = static_cast<int32_t>((b * 5 + 3) % B);
  if (B % 5 == 0) {
    for (int64_t b = 0; b < B; ++b) slots[static_cast<size_t>(b)] = static_cast<int32_t>(B - 1 - b);
  }
  int32_t* meta = nullptr;
  BENCH_CUDA_OK(cudaMalloc(&meta, sizeof(int32_t) * (cu.size() + slots.size())));
  BENCH_CUDA_OK(cudaMemcpy(meta, cu.data(), sizeof(int32_t) * cu.size(), cudaMemcpyHostToDevice));
  BENCH_CUDA_OK(cudaMemcpy(meta + cu.size(), slots.data(), sizeof(int32_t) * slots.size(), cudaMemcpyHostToDevice));
  BENCH_CUDA_OK(cudaDeviceSynchronize());
  a.q = q, a.k = k, a.v = v, a.beta_logits = beta, a.alpha = alpha;
  a.cu_seqlens = meta, a.slots = meta + cu.size(), a.state = pool, a.o = o;
  a.batch = B, a.heads = H, a.head_dim = kK, a.tokens = T;
  BENCH_CUDA_OK(cudaMalloc(&a.scratch, kimirt::cuda::KdaChunkScratchBytes(T, B, H)));  // the BF16 mode's

  cudaStream_t s;
  BENCH_CUDA_OK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  std::vector<Point> out;
  // The automatic choice in both modes ("bf16", "f32"), then the BF16 mode at the value-block
  // widths it did not choose ("bf16_vb64", ...), so one run shows which width is fastest.
  struct Mode {
    std::string name;
    bool bf16;
    int value_block;     // -1: KdaChunkPrepOnly
    int prep_per_sm = 0;  // KdaChunkPrepOnly's build
  };
  const int auto_vb = kimirt::cuda::KdaChunkValueBlock(B, H, true);
  std::vector<Mode> modes = {{"bf16", true, 0}, {"f32", false, 0}};
  for (int vb : {32, 64, 128}) {
    if (vb != auto_vb) modes.push_back({"bf16_vb" + std::to_string(vb), true, vb});
  }
  modes.push_back({"bf16_prep", true, -1});  // the BF16 mode's map + prep kernels alone
  modes.push_back({"bf16_prep_2sm", true, -1, 2});
  for (const Mode& m : modes) {
    const bool bf16 = m.bf16;
    const double med = kimirt::bench::TimeMs(s, 3, reps, [&](int) {
      if (m.value_block < 0) {
        kimirt::cuda::KdaChunkPrepOnly(a, s, m.prep_per_sm);
      } else {
        kimirt::cuda::KdaChunked(a, s, bf16, m.value_block);
      }
    });
    // The output must be finite after all those calls (a NaN means the kernel is broken, and
    // its timings mean nothing).
    std::vector<float> host(static_cast<size_t>(n));
    BENCH_CUDA_OK(cudaMemcpy(host.data(), o, sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
    for (float x : host) {
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "kda_chunk_bench: non-finite output in case %s\n", c.name.c_str());
        std::exit(1);
      }
    }
    out.push_back({c, m.name, T, m.value_block > 0 ? m.value_block : kimirt::cuda::KdaChunkValueBlock(B, H, bf16), med,
                   kFlopsPerTokenHead * static_cast<double>(T * H) / (med * 1e9)});
  }
  BENCH_CUDA_OK(cudaStreamDestroy(s));
  for (float* p : {q, k, v, beta, f, a_log, dt_bias, alpha, pool, o}) BENCH_CUDA_OK(cudaFree(p));
  BENCH_CUDA_OK(cudaFree(meta));
  BENCH_CUDA_OK(cudaFree(a.scratch));
  return out;
}

std::string Join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) {
    if (i > 0) s.push_back(',');
    s.append(std::to_string(v[i]));
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  int reps = 20;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: kda_chunk_bench [--json PATH] [--reps N]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  BENCH_CUDA_OK(cudaGetDeviceProperties(&prop, 0));
  const std::vector<Case> cases = {
      {"T8192_H96", 96, {8192}},
      {"T8192_H32", 32, {8192}},
      {"varlen_8x1024_H96", 96, std::vector<int64_t>(8, 1024)},
      {"varlen_4x2048_H96", 96, std::vector<int64_t>(4, 2048)},
      {"varlen_mixed_H96", 96, {4096, 2048, 1000, 600, 300, 129, 64, 1}},
  };
  std::vector<Point> points;
  for (const Case& c : cases) {
    for (const Point& p : Run(c, reps)) points.push_back(p);
  }
  std::printf("%-20s %10s %6s %4s %9s %8s\n", "case", "mode", "tokens", "vb", "ms", "TFLOP/s");
  for (const Point& p : points) {
    std::printf("%-20s %10s %6lld %4d %9.3f %8.2f\n", p.c.name.c_str(), p.mode.c_str(), static_cast<long long>(p.tokens),
                p.value_block, p.ms, p.tflops);
  }
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "kda_chunk_bench: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f, "{\n  \"bench\": \"kda_chunk\",\n  \"device\": \"%s\",\n  \"reps\": %d,\n  \"points\": [\n",
                 prop.name, reps);
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      std::fprintf(f,
                   "    {\"case\": \"%s\", \"mode\": \"%s\", \"heads\": %lld, \"head_dim\": %lld, \"lens\": [%s], "
                   "\"tokens\": %lld, \"value_block\": %d, \"ms\": %.4f, \"tflops\": %.3f}%s\n",
                   p.c.name.c_str(), p.mode.c_str(), static_cast<long long>(p.c.heads), static_cast<long long>(kK),
                   Join(p.c.lens).c_str(), static_cast<long long>(p.tokens), p.value_block, p.ms, p.tflops,
                   i + 1 < points.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  return 0;
}
