#include "kimirt/engine/runner_rank.h"

#include <algorithm>
#include <limits>

#include "kimirt/engine/kda_snapshot_budget.h"

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

}  // namespace kimirt::runner
