// The built-in demo model: a small Kimi-K3-architecture model (every module: KDA, gated MLA,
// LatentMoE with MXFP4 experts, dense MLP, Block AttnRes) with deterministic random weights and
// the built-in BPE tokenizer learned from GSM8K (assets/builtin). `kimirt serve` without --model
// serves it, so a fresh checkout runs end to end with no download. Its outputs are word salad:
// it exercises the engine, not language.
#pragma once

#include <cstdint>
#include <string>

#include "kimirt/core/status.h"

namespace kimirt {

// The built-in model's directory (config.json, safetensors, tiktoken.model,
// tokenizer_config.json), written under `cache_dir` (default: $XDG_CACHE_HOME or ~/.cache, then
// /tmp, + "/kimirt/builtin-<version>") on first use and reused afterwards.
Result<std::string> EnsureBuiltinModel(const std::string& cache_dir = "");

// The seed of the built-in model's random weights (make-checkpoint --random --seed): `serve
// --config <its config.json> --random-weights --seed kBuiltinWeightsSeed` serves the same model.
inline constexpr uint64_t kBuiltinWeightsSeed = 20261130;

// The served name of the built-in model.
inline constexpr const char* kBuiltinModelName = "kimirt-builtin";

}  // namespace kimirt
