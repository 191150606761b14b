#include "kimirt/backend/tensor.h"

#include <cstdlib>
#include <cstring>

namespace kimirt {

Tensor Tensor::Host(Shape shape, DType dtype) {
  const size_t bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(dtype);
  // 64-byte alignment for vector loads; calloc-style zero fill so reads of unset rows are defined.
  void* p = std::aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
  KIMIRT_CHECK_MSG(p != nullptr, "host allocation failed");
  std::memset(p, 0, bytes);
  std::shared_ptr<void> owner(p, [](void* q) { std::free(q); });
  return Tensor(std::move(owner), p, std::move(shape), dtype, Device::kCpu);
}

Tensor Tensor::Rows(int64_t begin, int64_t count) const {
  KIMIRT_CHECK(!shape_.empty() && begin >= 0 && count >= 0 && begin + count <= shape_[0]);
  Shape s = shape_;
  s[0] = count;
  const size_t row_bytes = shape_[0] == 0 ? 0 : nbytes() / static_cast<size_t>(shape_[0]);
  return Tensor(owner_, static_cast<uint8_t*>(data_) + static_cast<size_t>(begin) * row_bytes, std::move(s),
                dtype_, device_);
}

Tensor Tensor::Reshape(Shape shape) const {
  KIMIRT_CHECK_MSG(NumElements(shape) == numel(), "reshape changes the element count");
  return Tensor(owner_, data_, std::move(shape), dtype_, device_);
}

std::string Tensor::ToString() const { return std::string(DTypeName(dtype_)) + ShapeToString(shape_); }

}  // namespace kimirt
