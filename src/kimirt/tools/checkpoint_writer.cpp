#include "kimirt/tools/checkpoint_writer.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "kimirt/io/safetensors.h"
#include "kimirt/model/random_weights.h"

namespace kimirt {

std::vector<uint8_t> RandomTensorBytes(const Layout& layout, const TensorSpec& t, uint64_t seed) {
  std::vector<uint8_t> bytes(static_cast<size_t>(t.nbytes()));
  RandomTensorSlice(layout.config(), t, seed, /*dim=*/-1, 0, 0, bytes.data());
  return bytes;
}

Result<CheckpointWriteSummary> WriteCheckpoint(const Layout& layout, const std::string& out_dir,
                                               const CheckpointWriteOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) return IoError(out_dir + ": cannot create directory: " + ec.message());

  const uint64_t total = layout.total_bytes();
  int shards = options.shards;
  if (shards <= 0) {
    const uint64_t per = uint64_t{16} << 30;
    shards = static_cast<int>(std::max<uint64_t>(1, (total + per - 1) / per));
  }
  if (static_cast<size_t>(shards) > layout.size()) shards = static_cast<int>(layout.size());

  // Fill shards in layout order; shard k ends once the running total passes (k+1)/shards of
  // the bytes, so shards are near-equal in size, as HF's writer makes them.
  std::vector<std::pair<std::string, std::string>> weight_map;
  weight_map.reserve(layout.size());
  const std::vector<TensorSpec>& tensors = layout.tensors();
  size_t next = 0;
  uint64_t written = 0;
  CheckpointWriteSummary summary;
  for (int k = 0; k < shards; ++k) {
    char fname[64];
    std::snprintf(fname, sizeof(fname), "model-%05d-of-%05d.safetensors", k + 1, shards);
    const uint64_t target = static_cast<uint64_t>(
        static_cast<long double>(total) * (k + 1) / static_cast<long double>(shards));
    SafetensorsWriter writer;
    writer.SetMetadata("format", "pt");
    std::vector<std::vector<uint8_t>> buffers;
    // Leave at least one tensor for each remaining shard.
    const size_t must_leave = static_cast<size_t>(shards - k - 1);
    while (next < tensors.size() && tensors.size() - next > must_leave &&
           (writer.size() == 0 || written < target || k == shards - 1)) {
      const TensorSpec& t = tensors[next++];
      if (options.fill == CheckpointFill::kRandom) {
        buffers.push_back(RandomTensorBytes(layout, t, options.seed));
        writer.Add(t.name, t.dtype, t.shape, buffers.back());
      } else {
        writer.Add(t.name, t.dtype, t.shape);
      }
      weight_map.emplace_back(t.name, fname);
      written += t.nbytes();
    }
    KIMIRT_RETURN_IF_ERROR(
        writer.Write(out_dir + "/" + fname, options.fill == CheckpointFill::kSparse));
    summary.tensors += static_cast<int64_t>(writer.size());
    if (options.progress) options.progress(k + 1, shards);
  }
  KIMIRT_RETURN_IF_ERROR(WriteSafetensorsIndex(out_dir, weight_map, total));
  if (!options.config_json.empty()) {
    std::ofstream cfg(out_dir + "/config.json", std::ios::binary);
    cfg << options.config_json;
    if (!cfg) return IoError(out_dir + "/config.json: write failed");
  }
  summary.shards = shards;
  summary.bytes = total;
  return summary;
}

}  // namespace kimirt
