// Writes the Layout of a config as a real sharded safetensors checkpoint (+ index and
// config.json): the engine behind `kimirt make-checkpoint`. Sparse mode leaves every payload as
// a file hole, so the whole 1.56 TB Kimi-K3 checkpoint exists on a small disk for header-level
// tests; random mode fills configs up to 64 GiB with the counter-based random weights of
// model/random_weights.h (drawn like the reference fixtures: linear N(0, 1/fan_in), norm gains
// 1 + 0.1·N, MXFP4 experts as random codes + scales), made on the ParallelFor pool — the same bits
// `bench model` / `serve` --random-weights make at load, so a checkpoint written here and weights
// made there load to identical models.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kimirt/core/status.h"
#include "kimirt/model/layout.h"

namespace kimirt {

enum class CheckpointFill : uint8_t { kSparse, kRandom };

struct CheckpointWriteOptions {
  CheckpointFill fill = CheckpointFill::kSparse;
  uint64_t seed = 0;
  int shards = 0;  // 0: one shard per started 16 GiB of data
  std::string config_json;  // written verbatim as config.json
  // Called after each shard with (shards written, shards total).
  std::function<void(int, int)> progress;
};

struct CheckpointWriteSummary {
  int shards = 0;
  int64_t tensors = 0;
  uint64_t bytes = 0;
};

Result<CheckpointWriteSummary> WriteCheckpoint(const Layout& layout, const std::string& out_dir,
                                               const CheckpointWriteOptions& options);

// The deterministic values a --random checkpoint stores for tensor `t` (raw bytes in t.dtype;
// RandomTensorSlice of the whole tensor). Exposed so tests can check what was written.
std::vector<uint8_t> RandomTensorBytes(const Layout& layout, const TensorSpec& t, uint64_t seed);

}  // namespace kimirt
