// How many bytes in flight an SM needs to read a layer's latent rows near HBM speed through TMA
// (docs/cuda.md "Which half sets a tile's time": the MLA decode split's cp.async ring, two tiles of
// 36 KB in flight, moved the whole op's latent bytes at 1.65-2.5 TB/s by itself on an H100). A pool shaped like the 48B's
// latent cache at batch 8 and 32K (262,144 rows of 576 BF16, 302 MB: far past L2) is streamed once
// per call by one block an SM, each walking its contiguous run of tiles (32 or 64 rows, nine
// 128-byte-swizzled panels each: the split's tiles) through `stages` buffers: thread 0 loads a
// tile by TMA onto the stage's barrier (tma.cuh) and, once all 128 threads have read it and
// arrived on the stage's second barrier, loads the next into it. Nothing is computed; each thread
// folds one 16-byte word a tile into a sink.
//
// Usage: tma_stream_bench [--json FILE] [--peak-gbps 4800] [--reps 20]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"
#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/tma.cuh"
#include "kimirt/backend/cuda/tma.h"

namespace {

constexpr int64_t kRows = 262144, kCols = 576, kPanels = kCols / 64;
constexpr int kThreads = 128;

template <int kTileRows, int kStages>
__global__ void __launch_bounds__(kThreads) StreamKernel(const __grid_constant__ CUtensorMap map, uint32_t* sink) {
  using namespace kimirt::cuda;
  constexpr uint32_t kPanelBytes = kTileRows * 128, kTileBytes = kPanelBytes * kPanels;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = SharedAddress(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t full = base + kStages * kTileBytes, empty = full + 8 * kStages;  // barriers, 8 bytes each
  const int64_t tiles = kRows / kTileRows;
  const int64_t t0 = tiles * blockIdx.x / gridDim.x, n = tiles * (blockIdx.x + 1) / gridDim.x - t0;
  auto load = [&](int64_t i) {  // tile t0 + i into stage i mod kStages
    const uint32_t st = base + (i % kStages) * kTileBytes, bar = full + 8 * (i % kStages);
    tma::MbarArriveExpectTx(bar, kTileBytes);
    for (int p = 0; p < kPanels; ++p) {
      tma::Load2D(st + p * kPanelBytes, &map, bar, 64 * p, static_cast<int32_t>((t0 + i) * kTileRows));
    }
  };
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) tma::MbarInit(full + 8 * s, 1), tma::MbarInit(empty + 8 * s, kThreads);
    tma::FenceMbarInit();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int64_t i = 0; i < kStages && i < n; ++i) load(i);
  }
  uint32_t x = 0;
  const unsigned char* smem = smem_raw + (base - raw);
  for (int64_t i = 0; i < n; ++i) {
    const int s = static_cast<int>(i % kStages);
    const uint32_t parity = static_cast<uint32_t>(i / kStages) & 1u;
    tma::MbarWait(full + 8 * s, parity);
    const uint4 v = *reinterpret_cast<const uint4*>(smem + s * kTileBytes + threadIdx.x * 16);
    x ^= v.x ^ v.y ^ v.z ^ v.w;
    tma::MbarArrive(empty + 8 * s);
    if (threadIdx.x == 0 && i + kStages < n) {
      tma::MbarWait(empty + 8 * s, parity);  // every thread is done with tile i
      load(i + kStages);
    }
  }
  sink[blockIdx.x * kThreads + threadIdx.x] = x;
}

struct Point {
  int tile_rows, stages;
  double ms, gbps;
};

}  // namespace

int main(int argc, char** argv) {
  kimirt::bench::StreamBenchFlags flags;
  if (!kimirt::bench::ParseStreamBenchFlags(argc, argv, "tma_stream_bench", &flags)) return 2;
  const int64_t bytes = kRows * kCols * 2;
  void* pool = nullptr;
  uint32_t* sink = nullptr;
  int sms = 0;
  BENCH_CUDA_OK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  BENCH_CUDA_OK(cudaMalloc(&pool, bytes));
  BENCH_CUDA_OK(cudaMalloc(&sink, static_cast<size_t>(sms) * kThreads * sizeof(uint32_t)));
  kimirt::bench::Fill(pool, nullptr, bytes / 2, 11, 1.0f);
  cudaStream_t s;
  BENCH_CUDA_OK(cudaStreamCreate(&s));
  std::vector<Point> points;
  auto run = [&](int tile_rows, int stages, auto kernel) {
    CUtensorMap map;
    std::string error;
    if (!kimirt::cuda::MakeTensorMapBf16Swizzled(&map, pool, kRows, kCols, kCols * 2, static_cast<uint32_t>(tile_rows),
                                                 &error)) {
      std::fprintf(stderr, "tma_stream_bench: %s\n", error.c_str());
      std::exit(1);
    }
    const size_t smem = static_cast<size_t>(stages) * tile_rows * 128 * kPanels + 16 * stages + 1024;
    BENCH_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)));
    const double ms = kimirt::bench::TimeMs(s, 3, flags.reps, [&](int) {
      kernel<<<sms, kThreads, smem, s>>>(map, sink);
    });
    BENCH_CUDA_OK(cudaStreamSynchronize(s));
    points.push_back({tile_rows, stages, ms, bytes / (ms * 1e-3) / 1e9});
    std::printf("tiles of %2d rows, %d stages (%6.1f KB in flight an SM) %8.3f ms %8.1f GB/s %6.3f of peak\n", tile_rows,
                stages, stages * tile_rows * 1152 / 1024.0, ms, points.back().gbps, points.back().gbps / flags.peak_gbps);
  };
  run(32, 1, StreamKernel<32, 1>);
  run(32, 2, StreamKernel<32, 2>);
  run(32, 3, StreamKernel<32, 3>);
  run(32, 4, StreamKernel<32, 4>);
  run(32, 5, StreamKernel<32, 5>);
  run(32, 6, StreamKernel<32, 6>);
  run(64, 1, StreamKernel<64, 1>);
  run(64, 2, StreamKernel<64, 2>);
  run(64, 3, StreamKernel<64, 3>);
  if (!flags.json.empty()) {
    std::ofstream f(flags.json);
    f << "{\n  \"bench\": \"tma_stream\",\n  \"device\": \"cuda\",\n  \"bytes\": " << bytes << ",\n  \"peak_gb_per_s\": " << flags.peak_gbps
      << ",\n  \"points\": [\n";
    for (size_t i = 0; i < points.size(); ++i) {
      f << "    {\"tile_rows\": " << points[i].tile_rows << ", \"stages\": " << points[i].stages << ", \"ms\": " << points[i].ms
        << ", \"gb_per_s\": " << points[i].gbps << ", \"bandwidth_fraction\": " << points[i].gbps / flags.peak_gbps << "}"
        << (i + 1 < points.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
  }
  return 0;
}
