// What HBM read bandwidth a weight-streaming decode kernel can reach, by access pattern (issue 12:
// the decode GEMMs and experts read their weights at 0.5-0.7 of 4.8 TB/s; is that the pattern or
// the kernels?). A 1.2 GB buffer of BF16 rows as long as the 48B's hidden (2304: 4,608 bytes a
// row, like lm_head's and the experts' rows) is read once per call by warps that each own R rows
// and walk them in rounds of C bytes a row (R·C = 8 KB a warp-round, 16 loads of 16 bytes a
// lane, all in flight together, as DecodeGemm's round), with or without the next two rounds asked
// into L2 (cp.async.bulk.prefetch.L2, as DecodeGemm) or more rounds per request, at the decode kernels' occupancy (4 blocks
// of 4 warps an SM, held by shared memory) or the most that fits; and, for reference, the buffer
// read flat (each warp-round 8 KB contiguous) by a grid of all its chunks or by 528 blocks
// striding. Nothing is computed: the loads' XOR goes to one word per warp.
//
// Usage: hbm_read_bench [--json FILE] [--peak-gbps 4800] [--reps 20]
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "cuda_bench_util.cuh"

namespace {

constexpr int kWarps = 4;
constexpr int64_t kRowBytes = 2304 * 2;
constexpr int64_t kRows = 262144;  // 1.21 GB: far past the 60 MB L2
constexpr int kLoads = 16;         // 16-byte loads a lane a round: 8 KB a warp-round

__device__ __forceinline__ uint4 Load(const char* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void Prefetch(const char* p, uint32_t bytes) {
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
}

// Warp w owns rows [w·R, w·R + R); round i reads bytes [i·C, i·C + C) of each of them, the
// warp's load j covering 512 bytes: 16-byte piece q = 32j + lane of the round, row q / (C/16).
// kPf: 0 none; G > 0 the rounds asked into L2 G at a time (G·C bytes a row in one request), G to
// 2G rounds ahead (G = 1: DecodeGemm's two rounds ahead, one round a request).
template <int kR, int kPf>
__global__ void RowsKernel(const char* __restrict__ buf, uint32_t* sink) {
  constexpr int64_t kC = 8192 / kR;              // bytes a row a round
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t w = int64_t{blockIdx.x} * kWarps + warp;
  const int64_t row0 = w * kR;
  if (row0 >= kRows) return;
  uint32_t x = 0;
  const int64_t rounds = (kRowBytes + kC - 1) / kC;
  auto prefetch = [&](int64_t i) {  // rounds [i, i + kPf)
    if (kPf == 0 || i >= rounds || lane >= kR) return;
    const int64_t at = i * kC, len = kRowBytes - at < kPf * kC ? kRowBytes - at : kPf * kC;
    Prefetch(buf + (row0 + lane) * kRowBytes + at, static_cast<uint32_t>(len));
  };
  prefetch(0);
  prefetch(kPf);
  for (int64_t i = 0; i < rounds; ++i) {
    if (kPf > 0 && i > 0 && i % kPf == 0) prefetch(i + kPf);
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) {
      const int q = j * 32 + lane;
      const int64_t r = q / (kC / 16), c = q % (kC / 16);
      const int64_t at = i * kC + c * 16;
      v[j] = at < kRowBytes ? Load(buf + (row0 + r) * kRowBytes + at) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int j = 0; j < kLoads; ++j) x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (x == 0x12345678u) sink[w] = x;  // never (almost): keeps the loads
}

// The buffer flat: warp-round g reads bytes [8 KB·g, 8 KB·(g + 1)), g = w, w + warps, ...
__global__ void FlatKernel(const char* __restrict__ buf, int64_t bytes, uint32_t* sink) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t w = int64_t{blockIdx.x} * kWarps + warp, warps = int64_t{gridDim.x} * kWarps;
  uint32_t x = 0;
  for (int64_t g = w; g * 8192 < bytes; g += warps) {
    uint4 v[kLoads];
#pragma unroll
    for (int j = 0; j < kLoads; ++j) v[j] = Load(buf + g * 8192 + j * 512 + lane * 16);
#pragma unroll
    for (int j = 0; j < kLoads; ++j) x ^= v[j].x ^ v[j].y ^ v[j].z ^ v[j].w;
  }
  if (x == 0x12345678u) sink[w] = x;
}

struct Point {
  std::string name;
  double ms = 0, gbps = 0;
};

}  // namespace

int main(int argc, char** argv) {
  kimirt::bench::StreamBenchFlags flags;
  if (!kimirt::bench::ParseStreamBenchFlags(argc, argv, "hbm_read_bench", &flags)) return 2;
  const int64_t bytes = kRows * kRowBytes;
  char* buf = nullptr;
  uint32_t* sink = nullptr;
  BENCH_CUDA_OK(cudaMalloc(&buf, bytes));
  BENCH_CUDA_OK(cudaMalloc(&sink, (kRows + 1) * sizeof(uint32_t)));
  kimirt::bench::Fill(buf, nullptr, bytes / 2, 7, 1.0f);
  cudaStream_t s;
  BENCH_CUDA_OK(cudaStreamCreate(&s));
  std::vector<Point> points;
  // 48 KB of shared memory a block holds an SM to 4 blocks (the decode kernels' occupancy).
  const size_t occ4 = 48 * 1024;
  auto run = [&](const std::string& name, auto kernel, unsigned grid, size_t smem, auto... args) {
    if (smem > 0) BENCH_CUDA_OK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
    const double ms = kimirt::bench::TimeMs(s, 3, flags.reps, [&](int) {
      kernel<<<grid, kWarps * 32, smem, s>>>(args...);
    });
    points.push_back({name, ms, bytes / (ms * 1e-3) / 1e9});
    std::printf("%-28s %9.3f ms %9.1f GB/s %6.3f of peak\n", name.c_str(), ms, points.back().gbps,
                points.back().gbps / flags.peak_gbps);
  };
  const unsigned row_grid_base = static_cast<unsigned>(kRows / kWarps);
  for (const size_t smem : {occ4, size_t{0}}) {
    const std::string occ = smem ? "occ4" : "full";
    run("rows32x256 " + occ, RowsKernel<32, 0>, row_grid_base / 32, smem, buf, sink);
    run("rows32x256 pf1 " + occ, RowsKernel<32, 1>, row_grid_base / 32, smem, buf, sink);
    run("rows32x256 pf2 " + occ, RowsKernel<32, 2>, row_grid_base / 32, smem, buf, sink);
    run("rows32x256 pf4 " + occ, RowsKernel<32, 4>, row_grid_base / 32, smem, buf, sink);
    run("rows32x256 pf8 " + occ, RowsKernel<32, 8>, row_grid_base / 32, smem, buf, sink);
    run("rows16x512 " + occ, RowsKernel<16, 0>, row_grid_base / 16, smem, buf, sink);
    run("rows16x512 pf2 " + occ, RowsKernel<16, 2>, row_grid_base / 16, smem, buf, sink);
    run("rows8x1024 " + occ, RowsKernel<8, 0>, row_grid_base / 8, smem, buf, sink);
    run("flat all " + occ, FlatKernel, static_cast<unsigned>(bytes / 8192 / kWarps), smem, buf, bytes, sink);
  }
  if (!flags.json.empty()) {
    std::ofstream f(flags.json);
    f << "{\n  \"device\": \"cuda\",\n  \"bytes\": " << bytes << ",\n  \"peak_gb_per_s\": " << flags.peak_gbps
      << ",\n  \"points\": [\n";
    for (size_t i = 0; i < points.size(); ++i) {
      f << "    {\"pattern\": \"" << points[i].name << "\", \"ms\": " << points[i].ms << ", \"gb_per_s\": "
        << points[i].gbps << ", \"bandwidth_fraction\": " << points[i].gbps / flags.peak_gbps << "}"
        << (i + 1 < points.size() ? ",\n" : "\n");
    }
    f << "  ]\n}\n";
  }
  return 0;
}
