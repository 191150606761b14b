// WeightSource: where the loader (weights.h) reads each tensor's stored values from, one slice at
// a time — a safetensors checkpoint on disk, or random weights made on the spot
// (random_weights.h; `bench model` / `serve` --random-weights, vLLM's --load-format dummy). The
// loader asks for exactly the rank's slice, so a random source makes only that slice, and never
// more than one tensor is in host memory: a 96 GB model loads on a 128 GB host.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "kimirt/backend/tensor.h"
#include "kimirt/core/status.h"
#include "kimirt/io/safetensors.h"
#include "kimirt/model/layout.h"

namespace kimirt {

class WeightSource {
 public:
  virtual ~WeightSource() = default;

  // OK when every tensor of `layout` is there, shaped and typed as the layout says; the error
  // names the offenders.
  virtual Status Check(const Layout& layout) const = 0;
  // The dtype `t` is stored in: t.dtype, or t.alt_dtype where a checkpoint stores that (spec §15.3).
  virtual DType StoredDType(const TensorSpec& t) const = 0;
  // Indices [begin, begin + length) along `dim` of `t` as stored (dim -1: the whole tensor): a
  // host tensor shaped like `t` with dim `dim` cut to `length`, in StoredDType(t). It may view
  // memory the source owns (a mapped checkpoint): valid while the source lives, not to be kept.
  virtual Result<Tensor> Read(const TensorSpec& t, int dim, int64_t begin, int64_t length) const = 0;
};

// A checkpoint's tensors (mapped; whole tensors are views of the mapping, slices are copied).
// `checkpoint` must outlive the source.
std::unique_ptr<WeightSource> CheckpointWeightSource(const Checkpoint& checkpoint);

// The random weights `kimirt make-checkpoint --random --seed <seed>` would write for `config`
// (random_weights.h), each slice made on the ParallelFor pool. `config` must outlive the source.
std::unique_ptr<WeightSource> RandomWeightSource(const ModelConfig& config, uint64_t seed);

}  // namespace kimirt
