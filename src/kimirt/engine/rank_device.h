// Which GPU a rank of a process group takes (docs/distributed.md): its local rank — rank r of a
// host's group takes device r of those CUDA_VISIBLE_DEVICES shows, as torchrun and vLLM place
// ranks. A device that is not there is an error naming the rank, the device index and how many
// GPUs are visible, checked before anything waits on that rank (so never a hang).
#pragma once

#include "kimirt/core/status.h"

namespace kimirt {

// `local_rank` as given by the launcher (LOCAL_RANK; nullptr when unset): the device index of
// rank `rank`, or an error when it is not a device of the `visible` ones.
Result<int> RankCudaDevice(int rank, const char* local_rank, int visible);

// Before starting `ranks` ranks of one host (ranks 0..ranks-1 on devices 0..ranks-1): OK when
// every one has its GPU, else the error of the first rank without one.
Status CheckGpusForRanks(int ranks, int visible);

}  // namespace kimirt
