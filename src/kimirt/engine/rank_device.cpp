// RankCudaDevice, CheckGpusForRanks (rank_device.h).
#include "kimirt/engine/rank_device.h"

#include <cstdlib>
#include <string>

namespace kimirt {
namespace {

Status NoSuchDevice(int rank, int device, int visible) {
  const char* shown = std::getenv("CUDA_VISIBLE_DEVICES");
  return InvalidArgument("rank " + std::to_string(rank) + " needs CUDA device " + std::to_string(device) +
                         " (its local rank), but " + std::to_string(visible) + " GPU" + (visible == 1 ? " is" : "s are") +
                         " visible" + (shown != nullptr ? std::string(" (CUDA_VISIBLE_DEVICES=") + shown + ")" : "") +
                         ": -tp N on one host takes N GPUs");
}

}  // namespace

bool RanksShareGpu() {
  const char* v = std::getenv("KIMIRT_RANKS_SHARE_GPU");
  return v != nullptr && std::string(v) == "1";
}

Result<int> RankCudaDevice(int rank, const char* local_rank, int visible) {
  if (local_rank == nullptr) return InvalidArgument("rank " + std::to_string(rank) + ": LOCAL_RANK is not set");
  char* end = nullptr;
  const long device = std::strtol(local_rank, &end, 10);
  if (*local_rank == '\0' || *end != '\0' || device < 0 || device > 1 << 20) {
    return InvalidArgument("rank " + std::to_string(rank) + ": LOCAL_RANK is \"" + local_rank +
                           "\", not a device index");
  }
  if (RanksShareGpu()) {
    if (visible < 1) return NoSuchDevice(rank, 0, visible);
    return 0;
  }
  if (device >= visible) return NoSuchDevice(rank, static_cast<int>(device), visible);
  return static_cast<int>(device);
}

Status CheckGpusForRanks(int ranks, int visible) {
  if (visible >= (RanksShareGpu() ? 1 : ranks)) return Status::Ok();
  return NoSuchDevice(visible, visible, visible);
}

}  // namespace kimirt
