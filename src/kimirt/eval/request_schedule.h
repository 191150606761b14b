// When `kimirt bench serve` sends each request, as `vllm bench serve` schedules them
// (vllm-project/vllm:vllm/benchmarks/serve.py get_request, burstiness 1): with a finite
// --request-rate R the gaps are exponential with mean 1/R, drawn by np.random.gamma(1, 1/R)
// after np.random.seed(seed); their running sums are then rescaled so that the last arrival is
// at exactly N/R seconds (vLLM does this to steady throughput across seeds). An infinite rate
// sends everything at time 0. Same seed, same schedule as vLLM's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kimirt::eval {

// Arrival offsets in seconds from the benchmark's start, one per request, non-decreasing.
// `rate` <= 0 or infinite: all zero.
std::vector<double> PoissonArrivals(size_t n, double rate, uint32_t seed);

}  // namespace kimirt::eval
