// The --prefill-chunk flag of serve and bench model: the fixed chunk a prompt is prefilled in
// (batch invariance: the chunk grid never depends on the load; docs/architecture.md).
//
// 0 (the default) picks by device. CPU: 256, the reference's long-standing grid. CUDA: 1024. On
// the H200 the whole Kimi-Linear-48B-A3B prefills a 2,048-token prompt at 6,173 tok/s in chunks of
// 256, 16,991 in 1024 and 23,825 in 2048, decode unchanged (bench/results/
// 2026-12-01-h200-bench-model-48b-full-prompt2048-chunk*.json): each chunk re-reads most routed
// experts, so small chunks are weight-bound. 1024 rather than 2048 because the prefix cache
// resumes only at chunk boundaries (KDA snapshots; docs/prefix-caching.md): a shared prefix
// shorter than one chunk gets no hit.
#pragma once

#include <string>

#include "kimirt/core/status.h"

namespace kimirt {

// The chunk for a flag value (0: the device's default) and --device; negative values are an
// InvalidArgument naming the flag.
Result<int> ResolvePrefillChunk(int flag_value, const std::string& device);

}  // namespace kimirt
