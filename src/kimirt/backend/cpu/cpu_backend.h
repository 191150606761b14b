// The CPU backend: FP32 everywhere (weights widened on load), GEMMs through OpenBLAS, the
// rest in plain loops. It is the reference every golden test pins and every other backend is
// checked against, so clarity and determinism come before speed.
#pragma once

#include <memory>

#include "kimirt/backend/backend.h"

namespace kimirt {

std::unique_ptr<Backend> MakeCpuBackend();

// Threads the CPU backend's GEMMs use (OpenBLAS); 0 leaves the library's default (all cores).
void SetCpuBackendThreads(int threads);

}  // namespace kimirt
