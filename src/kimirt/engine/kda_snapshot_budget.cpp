// The KDA snapshot budget (kda_snapshot_budget.h).
#include "kimirt/engine/kda_snapshot_budget.h"

namespace kimirt {

uint64_t KdaSnapshotBytes(const ModelConfig& c, int tp, int64_t kda_layers) {
  const auto H = static_cast<uint64_t>(c.linear_attn.num_heads / tp);
  const auto K = static_cast<uint64_t>(c.linear_attn.head_dim);
  const auto W = static_cast<uint64_t>(c.linear_attn.short_conv_kernel_size);
  const uint64_t per_layer = (H * K * K + 3 * (W - 1) * H * K) * sizeof(float);
  return per_layer * static_cast<uint64_t>(kda_layers);
}

int64_t KdaSnapshotsFor(uint64_t cache_bytes, double fraction, uint64_t snapshot_bytes) {
  if (snapshot_bytes == 0 || !(fraction > 0)) return 0;
  const auto budget = static_cast<uint64_t>(fraction * static_cast<double>(cache_bytes));
  return static_cast<int64_t>(budget / snapshot_bytes);
}

}  // namespace kimirt
