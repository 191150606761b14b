// ParallelFor: runs fn(i) for i in [0, n) on a process-wide pool of worker threads plus the
// caller. For the CPU backend's per-head loops ("threads for the rest" beside OpenBLAS's GEMMs):
// each index must write only its own outputs, so results do not depend on scheduling or on the
// number of threads. Several threads (tensor-parallel ranks) may call it at once.
#pragma once

#include <cstdint>
#include <functional>

namespace kimirt {

void ParallelFor(int64_t n, const std::function<void(int64_t)>& fn);

// Worker threads of the pool (0: everything runs on the caller). Default: cores - 1.
// Set before the first ParallelFor (e.g. from --threads); later calls are ignored.
void SetParallelForThreads(int threads);

}  // namespace kimirt
