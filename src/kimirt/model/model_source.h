// ModelSource: what a model is loaded from — a model directory (config.json + safetensors
// checkpoint), or a config whose weights are made at load (random_weights.h: `bench model` and
// `serve` --random-weights, vLLM's --load-format dummy), each rank making only its own slices.
// Small and copyable: process ranks send it to their followers (process_ranks_runner.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace kimirt {

struct ModelSource {
  std::string dir;          // a model directory, or
  std::string config_path;  // a config.json (or a directory holding one) with random weights
  uint64_t seed = 0;        // of the random weights (make-checkpoint --random --seed)

  static ModelSource Directory(std::string dir) { return ModelSource{std::move(dir), "", 0}; }
  static ModelSource RandomWeights(std::string config_path, uint64_t seed) {
    return ModelSource{"", std::move(config_path), seed};
  }
  bool random() const { return !config_path.empty(); }
  // For messages: the directory, or "CONFIG (random weights, seed N)".
  std::string ToString() const {
    return random() ? config_path + " (random weights, seed " + std::to_string(seed) + ")" : dir;
  }
};

}  // namespace kimirt
