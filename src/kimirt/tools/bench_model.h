// `kimirt bench model`: the engine in-process (no HTTP) on a model directory, or on a config with
// random weights: for each batch size B, B requests of `prompt_len` tokens run to `decode_tokens`
// outputs; reported are prefill tokens/s (all prompts) and the decode step time with B sequences
// running. On CPU this measures the reference backend; the GPU adds HBM-roofline fields later.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

struct BenchModelOptions {
  std::string model_dir;       // or
  std::string config_path;     // with random weights
  uint64_t seed = 0;
  int tp = 1;
  std::vector<int> batch_sizes = {1, 8};
  int64_t prompt_len = 128;
  int64_t decode_tokens = 16;
  int prefill_chunk = 256;
};

struct BenchModelPoint {
  int batch = 0;
  double prefill_seconds = 0, prefill_tokens_per_s = 0;
  double decode_seconds = 0, decode_step_ms = 0, decode_tokens_per_s = 0;
};

struct BenchModelReport {
  std::string model;
  int tp = 1;
  int64_t prompt_len = 0, decode_tokens = 0;
  std::vector<BenchModelPoint> points;
  std::string ToText() const;
  std::string ToJson() const;
};

Result<BenchModelReport> RunBenchModel(const BenchModelOptions& options);

}  // namespace kimirt
