// What the CUDA kernel benches (bench/*_bench.cu) share: a checked CUDA call, random fills (a
// hash, never zeros: METHOD.md) and the median of event-timed calls.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define BENCH_CUDA_OK(expr)                                                                           \
  do {                                                                                                \
    const cudaError_t bench_e = (expr);                                                               \
    if (bench_e != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #expr, cudaGetErrorString(bench_e)); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace kimirt::bench {

// splitmix64 of (seed, i).
__device__ inline uint64_t Hash(uint64_t seed, int64_t i) {
  uint64_t z = seed + static_cast<uint64_t>(i) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Random values of about a unit normal's scale times `scale`, as BF16 codes and/or F32 (either
// may be null); `f32_as_bf16`: the F32 copy holds the BF16-rounded values (the same numbers as
// the BF16 copy), else the unrounded ones.
__global__ void FillKernel(uint16_t* bf16, float* f32, int64_t n, uint64_t seed, float scale, bool f32_as_bf16) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    const float v = scale * (static_cast<float>(Hash(seed, i) >> 40) * 0x1.0p-24f * 2.0f - 1.0f) * 1.7f;
    const __nv_bfloat16 b = __float2bfloat16_rn(v);
    if (bf16 != nullptr) bf16[i] = __bfloat16_as_ushort(b);
    if (f32 != nullptr) f32[i] = f32_as_bf16 ? __bfloat162float(b) : v;
  }
}

inline void Fill(void* bf16, float* f32, int64_t n, uint64_t seed, float scale, bool f32_as_bf16 = false) {
  FillKernel<<<4096, 256>>>(static_cast<uint16_t*>(bf16), f32, n, seed, scale, f32_as_bf16);
  BENCH_CUDA_OK(cudaGetLastError());
}

inline double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.size() % 2 ? v[v.size() / 2] : 0.5 * (v[v.size() / 2 - 1] + v[v.size() / 2]);
}

// Times `fn(i)` (which enqueues on `s`; i counts the calls from 0, warm-up included): the median
// over `reps` of event-timed calls after `warmup`, in ms.
template <typename Fn>
double TimeMs(cudaStream_t s, int warmup, int reps, Fn fn) {
  for (int i = 0; i < warmup; ++i) fn(i);
  std::vector<cudaEvent_t> ev(2 * static_cast<size_t>(reps));
  for (auto& e : ev) BENCH_CUDA_OK(cudaEventCreate(&e));
  for (int i = 0; i < reps; ++i) {
    BENCH_CUDA_OK(cudaEventRecord(ev[2 * i], s));
    fn(warmup + i);
    BENCH_CUDA_OK(cudaEventRecord(ev[2 * i + 1], s));
  }
  BENCH_CUDA_OK(cudaStreamSynchronize(s));
  BENCH_CUDA_OK(cudaGetLastError());
  std::vector<float> ms(static_cast<size_t>(reps));
  for (int i = 0; i < reps; ++i) BENCH_CUDA_OK(cudaEventElapsedTime(&ms[i], ev[2 * i], ev[2 * i + 1]));
  for (auto& e : ev) BENCH_CUDA_OK(cudaEventDestroy(e));
  return Median(ms);
}

// The median time of one call of `fn`, from replays of a graph of `calls` calls (enqueued by
// fn(i) on `s`): launch costs as a decode step's graph pays them.
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

// The flags of the HBM streaming benches (hbm_read_bench, tma_stream_bench): --json FILE,
// --peak-gbps GB/s, --reps N. False, saying which, on any other flag.
struct StreamBenchFlags {
  std::string json;
  double peak_gbps = 4800;
  int reps = 20;
};
inline bool ParseStreamBenchFlags(int argc, char** argv, const char* bench, StreamBenchFlags* f) {
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--json")) f->json = argv[i + 1];
    else if (!std::strcmp(argv[i], "--peak-gbps")) f->peak_gbps = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--reps")) f->reps = std::atoi(argv[i + 1]);
    else {
      std::fprintf(stderr, "%s: unknown flag %s\n", bench, argv[i]);
      return false;
    }
  }
  return true;
}

}  // namespace kimirt::bench
