// Kernel bench of the fused KDA decode step (cuda::KdaDecode, kernels.h): µs per layer and the
// bandwidth it reaches, at batch 1 and 256, H = 32 and 96, K = V = 128, W = 4 (K3: gate lower
// bound). scripts/gpu_check.sh kdabench runs it beside FLA's fused_recurrent_kda
// (bench/kda_decode_fla.py), which adds speedup_vs_fla to this program's JSON.
//
// Every kernel variant (cuda::KdaDecodeVariant, kernels.h) is timed at every shape in the same
// process; the production one (cuda::kKdaDecodeProduction, what the CUDA backend runs) gives the
// point's top-level JSON fields (us_graph, state_tbps_graph, ...), each variant its entry in
// "variants".
//
// Timing (CUDA events, median of many reps): "eager" brackets each single launch with events;
// "graph" captures G launches, over distinct layers, in one CUDA graph and divides a replay's
// time by G, which leaves out launch gaps (the number that matters for batch-1 decode, where a
// real step launches every layer back to back from a graph). Each layer has its own state pool,
// and there are enough layers that their states are >= 3x the L2 cache, so every launch reads
// its state from HBM as a real decode step does.
//
// Bytes per launch: the state read + written (B·H·K·K·4 each way), the row inputs (q, k, v, f,
// gate [B, P], beta [B, H], slots), the output [B, P], the three windows read + written, and the
// layer's weights once. TB/s = bytes / time, reported against --peak-tbps (default 4.8, the
// H200's datasheet HBM bandwidth).
//
// Usage: kda_decode_bench [--json PATH] [--peak-tbps X] [--reps N]
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kimirt/backend/cuda/kernels.h"

namespace {

#define CUDA_CHECK(call)                                                                              \
  do {                                                                                                \
    if (cudaError_t e_ = (call); e_ != cudaSuccess) {                                                 \
      std::fprintf(stderr, "kda_decode_bench: %s failed: %s (%s:%d)\n", #call, cudaGetErrorString(e_), \
                   __FILE__, __LINE__);                                                               \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

// Uniform values in [offset - scale, offset + scale) from a hash of the index (never zeros:
// METHOD.md, zeros can run faster than real data and hide unwritten outputs).
__global__ void FillKernel(float* x, int64_t n, uint64_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t{blockDim.x} + threadIdx.x; i < n; i += int64_t{gridDim.x} * blockDim.x) {
    uint64_t z = seed + static_cast<uint64_t>(i) * 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    x[i] = offset + scale * (static_cast<float>(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
  }
}

float* Alloc(int64_t n, uint64_t seed, float scale, float offset = 0.0f) {
  float* p = nullptr;
  CUDA_CHECK(cudaMalloc(&p, sizeof(float) * static_cast<size_t>(n)));
  FillKernel<<<1024, 256>>>(p, n, seed, scale, offset);
  CUDA_CHECK(cudaGetLastError());
  return p;
}

double Median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

using kimirt::cuda::KdaDecodeVariant;

struct VariantTime {
  KdaDecodeVariant variant;
  double us_eager, us_graph;
};

struct Point {
  int64_t B, H, K, W, layers, graph_launches;
  std::vector<VariantTime> times;  // in kKdaDecodeVariants' order
  double state_bytes, total_bytes;
  const VariantTime& Of(KdaDecodeVariant v) const {
    return *std::find_if(times.begin(), times.end(), [v](const VariantTime& t) { return t.variant == v; });
  }
};

Point Run(int64_t B, int64_t H, int reps, size_t l2_bytes) {
  const int64_t K = kimirt::cuda::kKdaDecodeHeadDim, W = 4, P = H * K;
  const double state_layer = 4.0 * static_cast<double>(B * H * K * K);
  const int64_t layers = std::max<int64_t>(2, static_cast<int64_t>(std::ceil(3.0 * l2_bytes / state_layer)));
  const int64_t graph_launches = std::max<int64_t>(20, layers);
  uint64_t seed = 1000 * static_cast<uint64_t>(B) + static_cast<uint64_t>(H);

  // The step's inputs and the layer weights are shared by the layers (they are small and, in a
  // real step, fresh in L2 from the projections); the state pools are per layer.
  kimirt::KdaDecodeArgs a;
  a.rows = B, a.heads = H, a.head_dim = K, a.conv_taps = W;
  a.q = Alloc(B * P, ++seed, 1.0f), a.k = Alloc(B * P, ++seed, 1.0f), a.v = Alloc(B * P, ++seed, 1.0f);
  a.beta_logits = Alloc(B * H, ++seed, 1.0f), a.f = Alloc(B * P, ++seed, 2.0f), a.gate = Alloc(B * P, ++seed, 1.0f);
  a.conv_q = Alloc(P * W, ++seed, 0.5f), a.conv_k = Alloc(P * W, ++seed, 0.5f), a.conv_v = Alloc(P * W, ++seed, 0.5f);
  a.a_log = Alloc(H, ++seed, 0.5f), a.dt_bias = Alloc(P, ++seed, 0.5f), a.o_norm = Alloc(K, ++seed, 0.2f, 1.0f);
  a.norm_eps = 1e-5f, a.has_lower_bound = true, a.lower_bound = -5.0f;
  // Slots: a permutation of the pool (b -> 7b + 3 mod B, 7 coprime to B), so rows do not walk
  // the pool in order.
  std::vector<int32_t> slots(static_cast<size_t>(B));
  std::iota(slots.begin(), slots.end(), 0);
  if (B % 7 != 0) {
    for (int64_t b = 0; b < B; ++b) slots[static_cast<size_t>(b)] = static_cast<int32_t>((b * 7 + 3) % B);
  }
  int32_t* d_slots = nullptr;
  CUDA_CHECK(cudaMalloc(&d_slots, sizeof(int32_t) * slots.size()));
  CUDA_CHECK(cudaMemcpy(d_slots, slots.data(), sizeof(int32_t) * slots.size(), cudaMemcpyHostToDevice));
  a.slots = d_slots, a.slot_count = B;
  float* out = nullptr;
  CUDA_CHECK(cudaMalloc(&out, sizeof(float) * static_cast<size_t>(B * P)));
  a.out = out;
  std::vector<kimirt::KdaDecodeArgs> layer(static_cast<size_t>(layers), a);
  for (auto& l : layer) {
    l.recurrent = Alloc(B * H * K * K, ++seed, 0.1f);
    l.window_q = Alloc(B * (W - 1) * P, ++seed, 1.0f);
    l.window_k = Alloc(B * (W - 1) * P, ++seed, 1.0f);
    l.window_v = Alloc(B * (W - 1) * P, ++seed, 1.0f);
  }
  CUDA_CHECK(cudaDeviceSynchronize());  // the fills ran on the legacy stream, which `s` does not wait for
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  // Per-layer time of G launches captured in one graph.
  auto graph_us = [&](KdaDecodeVariant v) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int64_t i = 0; i < graph_launches; ++i) {
      kimirt::cuda::KdaDecode(layer[static_cast<size_t>(i % layers)], s, v);
    }
    CUDA_CHECK(cudaStreamEndCapture(s, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphLaunch(exec, s));
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> times;
    for (int r = 0; r < 30; ++r) {
      CUDA_CHECK(cudaEventRecord(e0, s));
      CUDA_CHECK(cudaGraphLaunch(exec, s));
      CUDA_CHECK(cudaEventRecord(e1, s));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      times.push_back(t);
    }
    CUDA_CHECK(cudaGraphExecDestroy(exec));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return 1e3 * Median(times) / static_cast<double>(graph_launches);
  };
  std::vector<VariantTime> times;
  std::vector<float> host(static_cast<size_t>(B * P));
  for (KdaDecodeVariant v : kimirt::cuda::kKdaDecodeVariants) {
    for (int64_t i = 0; i < 2 * layers; ++i) kimirt::cuda::KdaDecode(layer[static_cast<size_t>(i % layers)], s, v);
    CUDA_CHECK(cudaStreamSynchronize(s));
    std::vector<float> ms;
    for (int r = 0; r < reps; ++r) {
      CUDA_CHECK(cudaEventRecord(e0, s));
      kimirt::cuda::KdaDecode(layer[static_cast<size_t>(r % layers)], s, v);
      CUDA_CHECK(cudaEventRecord(e1, s));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float t = 0;
      CUDA_CHECK(cudaEventElapsedTime(&t, e0, e1));
      ms.push_back(t);
    }
    const double us_eager = 1e3 * Median(ms);
    // Poisoned, then rewritten by the graph's launches: it must be written and finite after all
    // those steps (a NaN here means the variant is broken, and its timings mean nothing).
    CUDA_CHECK(cudaMemsetAsync(out, 0xff, sizeof(float) * host.size(), s));
    times.push_back({v, us_eager, graph_us(v)});
    CUDA_CHECK(cudaMemcpy(host.data(), out, sizeof(float) * host.size(), cudaMemcpyDeviceToHost));
    for (float x : host) {
      if (!std::isfinite(x)) {
        std::fprintf(stderr, "kda_decode_bench: non-finite output of %s at B=%lld H=%lld\n",
                     kimirt::cuda::KdaDecodeVariantName(v), static_cast<long long>(B), static_cast<long long>(H));
        std::exit(1);
      }
    }
  }

  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  CUDA_CHECK(cudaStreamDestroy(s));
  for (auto& l : layer) {
    CUDA_CHECK(cudaFree(l.recurrent));
    CUDA_CHECK(cudaFree(l.window_q));
    CUDA_CHECK(cudaFree(l.window_k));
    CUDA_CHECK(cudaFree(l.window_v));
  }
  for (const float* p : {a.q, a.k, a.v, a.beta_logits, a.f, a.gate, a.conv_q, a.conv_k, a.conv_v, a.a_log,
                         a.dt_bias, a.o_norm, static_cast<const float*>(out)}) {
    CUDA_CHECK(cudaFree(const_cast<float*>(p)));
  }
  CUDA_CHECK(cudaFree(d_slots));

  const double state_bytes = 2.0 * state_layer;
  const double row_bytes = 4.0 * static_cast<double>(B * (5 * P + H + P + 6 * (W - 1) * P) + B);
  const double weight_bytes = 4.0 * static_cast<double>(3 * P * W + P + H + K);
  return {B, H, K, W, layers, graph_launches, times, state_bytes, state_bytes + row_bytes + weight_bytes};
}

}  // namespace

int main(int argc, char** argv) {
  std::string json;
  double peak_tbps = 4.8;
  int reps = 200;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else if (arg == "--peak-tbps" && i + 1 < argc) {
      peak_tbps = std::atof(argv[++i]);
    } else if (arg == "--reps" && i + 1 < argc) {
      reps = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: kda_decode_bench [--json PATH] [--peak-tbps X] [--reps N]\n");
      return 2;
    }
  }
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::vector<Point> points;
  for (int64_t B : {1, 256}) {
    for (int64_t H : {32, 96}) points.push_back(Run(B, H, B == 1 ? reps : std::max(20, reps / 4),
                                                    static_cast<size_t>(prop.l2CacheSize)));
  }
  const KdaDecodeVariant prod = kimirt::cuda::kKdaDecodeProduction;
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "kda_decode_bench: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f,
                 "{\n  \"bench\": \"kda_decode\",\n  \"device\": \"%s\",\n  \"peak_tbps\": %g,\n"
                 "  \"production\": \"%s\",\n  \"points\": [\n",
                 prop.name, peak_tbps, kimirt::cuda::KdaDecodeVariantName(prod));
    for (size_t i = 0; i < points.size(); ++i) {
      const Point& p = points[i];
      const VariantTime& t = p.Of(prod);
      const double eager_tbps = p.total_bytes / (t.us_eager * 1e6), graph_tbps = p.total_bytes / (t.us_graph * 1e6);
      std::fprintf(f,
                   "    {\"batch\": %lld, \"heads\": %lld, \"head_dim\": %lld, \"conv_taps\": %lld, "
                   "\"layers\": %lld, \"graph_launches\": %lld, \"variant\": \"%s\", \"us_eager\": %.3f, "
                   "\"us_graph\": %.3f, \"us_graph_3blocks_per_sm\": %.3f, "
                   "\"state_bytes\": %.0f, \"total_bytes\": %.0f, \"tbps_eager\": %.4f, \"tbps_graph\": %.4f, "
                   "\"state_tbps_graph\": %.4f, \"frac_peak_graph\": %.4f,\n     \"variants\": [",
                   static_cast<long long>(p.B), static_cast<long long>(p.H), static_cast<long long>(p.K),
                   static_cast<long long>(p.W), static_cast<long long>(p.layers),
                   static_cast<long long>(p.graph_launches), kimirt::cuda::KdaDecodeVariantName(prod), t.us_eager,
                   t.us_graph, p.Of(KdaDecodeVariant::kColumn3).us_graph, p.state_bytes, p.total_bytes, eager_tbps,
                   graph_tbps, p.state_bytes / (t.us_graph * 1e6), graph_tbps / peak_tbps);
      for (size_t j = 0; j < p.times.size(); ++j) {
        const VariantTime& v = p.times[j];
        std::fprintf(f,
                     "%s\n       {\"name\": \"%s\", \"us_eager\": %.3f, \"us_graph\": %.3f, "
                     "\"tbps_graph\": %.4f, \"state_tbps_graph\": %.4f}",
                     j == 0 ? "" : ",", kimirt::cuda::KdaDecodeVariantName(v.variant), v.us_eager, v.us_graph,
                     p.total_bytes / (v.us_graph * 1e6), p.state_bytes / (v.us_graph * 1e6));
      }
      std::fprintf(f, "]}%s\n", i + 1 < points.size() ? "," : "");
    }
    std::fprintf(f, "  ]\n}\n");
    std::fclose(f);
  }
  // The table last: every variant at every shape, the production one starred.
  std::printf("%-20s %-15s %7s %10s %10s %10s %12s %8s\n", "shape", "variant", "layers", "eager_us", "graph_us",
              "graph_TB/s", "state_TB/s", "of_peak");
  for (const Point& p : points) {
    char shape[64];
    std::snprintf(shape, sizeof(shape), "B=%lld H=%lld K=%lld", static_cast<long long>(p.B),
                  static_cast<long long>(p.H), static_cast<long long>(p.K));
    for (const VariantTime& v : p.times) {
      const double tbps = p.total_bytes / (v.us_graph * 1e6);
      std::printf("%-20s %-14s%s %7lld %10.2f %10.2f %10.3f %12.3f %8.3f\n", shape,
                  kimirt::cuda::KdaDecodeVariantName(v.variant), v.variant == prod ? "*" : " ",
                  static_cast<long long>(p.layers), v.us_eager, v.us_graph, tbps, p.state_bytes / (v.us_graph * 1e6),
                  tbps / peak_tbps);
    }
  }
  return 0;
}
