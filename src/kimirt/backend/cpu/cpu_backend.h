// The CPU backend: FP32 everywhere (weights widened on load), GEMMs through OpenBLAS, the
// rest in plain loops. It is the reference every golden test pins and every other backend is
// checked against, so clarity and determinism come before speed.
#pragma once

#include <memory>

#include "kimirt/backend/backend.h"

namespace kimirt {

std::unique_ptr<Backend> MakeCpuBackend();

// Threads the CPU backend uses (its ParallelFor loops: GEMM blocks, heads); 0 leaves
// the defaults (all cores). Call before the first forward.
void SetCpuBackendThreads(int threads);

}  // namespace kimirt
