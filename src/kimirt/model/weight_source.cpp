// The two weight sources (weight_source.h): a mapped safetensors checkpoint, and counter-based
// random weights (random_weights.h).
#include "kimirt/model/weight_source.h"

#include <cstdlib>
#include <cstring>

#include "kimirt/model/random_weights.h"

namespace kimirt {
namespace {

// `t`'s shape with dim `dim` cut to `length` (the whole shape for dim -1).
Shape SliceShape(const TensorSpec& t, int dim, int64_t length) {
  Shape s = t.shape;
  if (dim >= 0) s[static_cast<size_t>(dim)] = length;
  return s;
}

// A host tensor left unfilled: the sources write every byte, so a zero fill first (Tensor::Host)
// would only double the memory traffic of the largest loads.
Tensor UnfilledHost(const Shape& shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  KIMIRT_CHECK_MSG(p != nullptr, "host allocation failed");
  return Tensor(std::shared_ptr<void>(p, [](void* q) { std::free(q); }), p, shape, dtype, Device::kCpu);
}

Status CheckRange(const TensorSpec& t, int dim, int64_t begin, int64_t length) {
  if (dim < 0) return Status::Ok();
  if (dim >= static_cast<int>(t.shape.size()) || begin < 0 || length < 0 ||
      begin + length > t.shape[static_cast<size_t>(dim)]) {
    return Internal(t.name + ": slice [" + std::to_string(begin) + ", " + std::to_string(begin + length) +
                    ") along dim " + std::to_string(dim) + " is outside " + ShapeToString(t.shape));
  }
  return Status::Ok();
}

class CheckpointSource final : public WeightSource {
 public:
  explicit CheckpointSource(const Checkpoint& ckpt) : ckpt_(ckpt) {}

  Status Check(const Layout& layout) const override {
    return CheckCheckpoint(layout, ckpt_).ToStatus(ckpt_.dir());
  }

  DType StoredDType(const TensorSpec& t) const override {
    const Checkpoint::Entry* e = ckpt_.Find(t.name);
    return e != nullptr ? e->info->dtype : t.dtype;
  }

  Result<Tensor> Read(const TensorSpec& t, int dim, int64_t begin, int64_t length) const override {
    KIMIRT_RETURN_IF_ERROR(CheckRange(t, dim, begin, length));
    const Checkpoint::Entry* e = ckpt_.Find(t.name);
    if (e == nullptr) return NotFound(t.name + ": not in the checkpoint");
    if (e->info->shape != t.shape) {
      return Corrupt(t.name + ": stored as " + ShapeToString(e->info->shape) + ", expected " + ShapeToString(t.shape));
    }
    KIMIRT_ASSIGN_OR_RETURN(std::span<const uint8_t> bytes, ckpt_.Data(t.name));
    const DType dtype = e->info->dtype;
    if (dim < 0 || (begin == 0 && length == t.shape[static_cast<size_t>(dim)])) {
      // The whole tensor: a view of the mapping, no copy.
      return Tensor(nullptr, const_cast<uint8_t*>(bytes.data()), t.shape, dtype, Device::kCpu);
    }
    int64_t outer = 1, inner = 1;
    for (int i = 0; i < dim; ++i) outer *= t.shape[static_cast<size_t>(i)];
    for (size_t i = static_cast<size_t>(dim) + 1; i < t.shape.size(); ++i) inner *= t.shape[i];
    const size_t es = DTypeSize(dtype);
    const size_t run = static_cast<size_t>(length * inner) * es;
    const int64_t size = t.shape[static_cast<size_t>(dim)];
    Tensor out = UnfilledHost(SliceShape(t, dim, length), dtype);
    uint8_t* dst = static_cast<uint8_t*>(out.raw());
    for (int64_t o = 0; o < outer; ++o) {
      std::memcpy(dst + static_cast<size_t>(o) * run, bytes.data() + static_cast<size_t>((o * size + begin) * inner) * es,
                  run);
    }
    return out;
  }

 private:
  const Checkpoint& ckpt_;
};

class RandomSource final : public WeightSource {
 public:
  RandomSource(const ModelConfig& config, uint64_t seed) : config_(config), seed_(seed) {}

  Status Check(const Layout&) const override { return Status::Ok(); }  // made to the layout
  DType StoredDType(const TensorSpec& t) const override { return t.dtype; }

  Result<Tensor> Read(const TensorSpec& t, int dim, int64_t begin, int64_t length) const override {
    KIMIRT_RETURN_IF_ERROR(CheckRange(t, dim, begin, length));
    Tensor out = UnfilledHost(SliceShape(t, dim, length), t.dtype);
    RandomTensorSlice(config_, t, seed_, dim, begin, length, static_cast<uint8_t*>(out.raw()));
    return out;
  }

 private:
  const ModelConfig& config_;
  uint64_t seed_;
};

}  // namespace

std::unique_ptr<WeightSource> CheckpointWeightSource(const Checkpoint& checkpoint) {
  return std::make_unique<CheckpointSource>(checkpoint);
}

std::unique_ptr<WeightSource> RandomWeightSource(const ModelConfig& config, uint64_t seed) {
  return std::make_unique<RandomSource>(config, seed);
}

}  // namespace kimirt
