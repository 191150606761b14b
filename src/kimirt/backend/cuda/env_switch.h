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

// A trial's switch, off until it has been timed: on only if the variable is "1"
// (KIMIRT_MOE_X_STAGE, KIMIRT_MOE_CODE_AHEAD in moe_kernels.cu).
inline bool EnvTrialOn(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, "1") == 0;
}

}  // namespace kimirt::cuda
