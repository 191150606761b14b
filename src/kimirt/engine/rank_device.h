// Which GPU a rank of a process group takes (docs/distributed.md): its local rank — rank r of a
// host's group takes device r of those CUDA_VISIBLE_DEVICES shows, as torchrun and vLLM place
// ranks. A device that is not there is an error naming the rank, the device index and how many
// GPUs are visible, checked before anything waits on that rank (so never a hang).
#pragma once

#include "kimirt/core/status.h"

namespace kimirt {

// `local_rank` as given by the launcher (LOCAL_RANK; nullptr when unset): the device index of
// rank `rank`, or an error when it is not a device of the `visible` ones. With RanksShareGpu(),
// device 0 for every rank (LOCAL_RANK still checked).
Result<int> RankCudaDevice(int rank, const char* local_rank, int visible);

// Before starting `ranks` ranks of one host (ranks 0..ranks-1 on devices 0..ranks-1): OK when
// every one has its GPU, else the error of the first rank without one. With RanksShareGpu(), OK
// when one GPU is visible.
Status CheckGpusForRanks(int ranks, int visible);

// KIMIRT_RANKS_SHARE_GPU=1: every process rank of a host on GPU 0, for checking the -tp path's
// correctness where one GPU is lent (docs/distributed.md "Ranks sharing one GPU"): the ranks'
// communicators then run the peer all-reduce alone (NCCL refuses two ranks on one device), and
// their kernels take turns on the GPU, so it says nothing about speed. -tp N, and -pp 2 at most.
bool RanksShareGpu();

}  // namespace kimirt
