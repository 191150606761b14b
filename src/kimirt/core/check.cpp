#include "kimirt/core/check.h"

#include <cstdio>
#include <cstdlib>

namespace kimirt::detail {
void CheckFailed(const char* file, int line, const char* expr, const char* msg) {
  std::fprintf(stderr, "kimirt: check failed at %s:%d: %s %s\n", file, line, expr, msg);
  std::abort();
}
}  // namespace kimirt::detail
