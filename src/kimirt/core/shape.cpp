// Shape helpers (shape.h).
#include "kimirt/core/shape.h"

#include "kimirt/core/check.h"

namespace kimirt {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    KIMIRT_CHECK_MSG(d >= 0, "negative dimension");
    KIMIRT_CHECK_MSG(!__builtin_mul_overflow(n, d, &n), "element count overflows int64");
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  s += "]";
  return s;
}

}  // namespace kimirt
