// Shape: the dimensions of a tensor, outermost first, as safetensors headers and our tensors
// (backend/tensor.h) both use them. Here in core so that the backend and io layers share it
// without either knowing the other.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace kimirt {

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar, shape []). The shape must be valid
// (non-negative dims, product fits in int64), as every parsed header's shapes are.
int64_t NumElements(const Shape& shape);
// "[12288, 1, 4]"
std::string ShapeToString(const Shape& shape);

}  // namespace kimirt
