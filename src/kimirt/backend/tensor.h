// Tensor: a contiguous, row-major block of elements on one device, shared by reference
// (copying a Tensor copies the handle, not the data). Backends allocate them (Backend::Empty);
// the CPU backend's tensors live in host memory and can be read with data<T>().
//
// Deliberately small: no strides, no broadcasting, no autograd. Views (Rows, Reshape) share the
// buffer. Thread safety: as for a raw buffer — concurrent readers fine, writers need ownership.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kimirt/core/check.h"
#include "kimirt/core/dtype.h"
#include "kimirt/core/shape.h"

namespace kimirt {

enum class Device : uint8_t { kCpu, kCuda };

class Tensor {
 public:
  Tensor() = default;
  // Wraps a buffer the caller allocated; `owner` keeps it alive (and frees it).
  Tensor(std::shared_ptr<void> owner, void* data, Shape shape, DType dtype, Device device)
      : owner_(std::move(owner)), data_(data), shape_(std::move(shape)), dtype_(dtype), device_(device) {}

  // A zero-filled host tensor.
  static Tensor Host(Shape shape, DType dtype = DType::kF32);

  bool defined() const { return data_ != nullptr || NumElements(shape_) == 0; }
  const Shape& shape() const { return shape_; }
  int64_t dim(int i) const { return shape_[static_cast<size_t>(i < 0 ? static_cast<int>(shape_.size()) + i : i)]; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t numel() const { return NumElements(shape_); }
  DType dtype() const { return dtype_; }
  Device device() const { return device_; }
  size_t nbytes() const { return static_cast<size_t>(numel()) * DTypeSize(dtype_); }
  void* raw() { return data_; }
  const void* raw() const { return data_; }

  // Host float access (the CPU backend's activations and weights are F32).
  float* f32() {
    KIMIRT_CHECK(dtype_ == DType::kF32 && device_ == Device::kCpu);
    return static_cast<float*>(data_);
  }
  const float* f32() const {
    KIMIRT_CHECK(dtype_ == DType::kF32 && device_ == Device::kCpu);
    return static_cast<const float*>(data_);
  }
  int32_t* i32() {
    KIMIRT_CHECK(dtype_ == DType::kI32 && device_ == Device::kCpu);
    return static_cast<int32_t*>(data_);
  }
  const int32_t* i32() const {
    KIMIRT_CHECK(dtype_ == DType::kI32 && device_ == Device::kCpu);
    return static_cast<const int32_t*>(data_);
  }

  // Rows [begin, begin + count) along dim 0, sharing the buffer.
  Tensor Rows(int64_t begin, int64_t count) const;
  // The same elements with another shape of equal element count, sharing the buffer.
  Tensor Reshape(Shape shape) const;

  std::string ToString() const;  // "F32[3, 4]"

 private:
  std::shared_ptr<void> owner_;
  void* data_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::kF32;
  Device device_ = Device::kCpu;
};

// A tensor seen as a matrix: dim 0 rows (a scalar is one row) of numel / rows elements each.
inline int64_t Rows(const Tensor& t) { return t.rank() == 0 ? 1 : t.dim(0); }
inline int64_t Cols(const Tensor& t) { return Rows(t) == 0 ? 0 : t.numel() / Rows(t); }

}  // namespace kimirt
