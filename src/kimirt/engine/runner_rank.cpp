#include "kimirt/engine/runner_rank.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <string>

#include "kimirt/engine/kda_snapshot_budget.h"
#include "kimirt/model/module_context.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt::runner {

Result<CacheSizes> SizeCaches(Model& model, const RunnerOptions& o) {
  auto probe = model.MakeKvCache(0, o.block_size, o.kv_cache_dtype, false);
  CacheSizes z;
  z.snapshot_bytes = model.MakeKdaStates(1)->SlotBytes();
  if (o.num_kv_blocks > 0) {
    z.blocks = o.num_kv_blocks;
    z.snapshots = o.max_kda_snapshots;
    return z;
  }
  if (o.kv_cache_bytes == 0) return InvalidArgument("give the runner num_kv_blocks or kv_cache_bytes");
  if (o.kda_snapshot_fraction < 0 || o.kda_snapshot_fraction >= 1) {
    return InvalidArgument("the KDA snapshot fraction must be in [0, 1)");
  }
  // A model without KDA layers snapshots nothing: no limit. (`kimirt plan` counts the same.)
  z.snapshots = z.snapshot_bytes == 0 ? std::numeric_limits<int64_t>::max()
                                      : KdaSnapshotsFor(o.kv_cache_bytes, o.kda_snapshot_fraction, z.snapshot_bytes);
  z.blocks = static_cast<int64_t>((o.kv_cache_bytes - (z.snapshot_bytes == 0 ? 0 : static_cast<uint64_t>(z.snapshots) * z.snapshot_bytes)) /
                                  std::max<uint64_t>(1, probe->block_bytes()));
  return z;
}

Result<bool> SizeFromGpuMemory(Backend& backend, RunnerOptions* o) {
  if (o->gpu_memory_utilization <= 0 || o->num_kv_blocks != 0) return false;
  const std::optional<Backend::MemoryInfo> mem = backend.DeviceMemory();
  if (!mem) return false;
  const double budget = o->gpu_memory_utilization * static_cast<double>(mem->total);
  const double in_use = static_cast<double>(mem->total - mem->free);
  if (budget <= in_use) {
    return ResourceExhausted("--gpu-memory-utilization " + std::to_string(o->gpu_memory_utilization) +
                             " leaves no room for the latent cache: " + std::to_string(in_use / 1073741824.0) +
                             " GiB of the GPU's " + std::to_string(mem->total / 1073741824.0) +
                             " GiB are in use after loading the weights");
  }
  o->kv_cache_bytes = static_cast<uint64_t>(budget - in_use);
  return true;
}

uint64_t MinOverRanks(Communicator& comm, Backend& backend, uint64_t bytes) {
  // In MiB: exact in a float up to 16 TiB.
  const float least = kimirt::MinOverRanks(comm, backend, static_cast<float>(bytes >> 20));
  return static_cast<uint64_t>(least) << 20;
}

}  // namespace kimirt::runner
