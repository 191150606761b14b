// How the cache budget pays for the prefix cache's KDA snapshots (docs/prefix-caching.md
// "Memory"): one rule for `kimirt serve` (ModelRunner sizes its caches with it) and `kimirt
// plan` (its snapshot row), so the planner counts what serve allocates.
#pragma once

#include <cstdint>

#include "kimirt/model/config.h"

namespace kimirt {

// The share of the cache budget (--cpu-memory-gib, or what --gpu-memory-utilization leaves after
// the weights) that `kimirt serve` gives KDA snapshots when prefix caching is on.
inline constexpr double kServeKdaSnapshotFraction = 0.1;

// Bytes of one snapshot on one of `tp` ranks holding `kda_layers` KDA layers: per layer the FP32
// recurrent state [H/tp, K, K] and the three FP32 conv windows [W - 1, H/tp * K] (spec §5.7;
// model/kda.cpp NewKdaStatePool, what KdaStateSlots::SlotBytes counts).
uint64_t KdaSnapshotBytes(const ModelConfig& c, int tp, int64_t kda_layers);

// How many snapshots of `snapshot_bytes` each fit in `fraction` of `cache_bytes`.
int64_t KdaSnapshotsFor(uint64_t cache_bytes, double fraction, uint64_t snapshot_bytes);

}  // namespace kimirt
