// A switch for A/B runs read from the environment once per process: on unless the variable is
// "0" (KIMIRT_PDL in pdl.cuh, KIMIRT_LINEAR_GROUP in cuda_backend.cu). Read once, so every step
// of a process (and every CUDA graph it captures) takes the same path.
#pragma once

#include <cstdlib>
#include <cstring>

namespace kimirt::cuda {

inline bool EnvSwitchOn(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr || std::strcmp(v, "0") != 0;
}

// The opposite default, for paths not yet measured: off unless the variable is "1".
inline bool EnvOptIn(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace kimirt::cuda
