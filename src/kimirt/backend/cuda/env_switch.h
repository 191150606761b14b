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

// A choice the code makes unless the variable forces it: "1" on, "0" off, anything else (or unset)
// the code's own.
enum class EnvForce { kAuto, kOn, kOff };
inline EnvForce EnvForced(const char* name) {
  const char* v = std::getenv(name);
  if (v != nullptr && std::strcmp(v, "1") == 0) return EnvForce::kOn;
  if (v != nullptr && std::strcmp(v, "0") == 0) return EnvForce::kOff;
  return EnvForce::kAuto;
}

}  // namespace kimirt::cuda
