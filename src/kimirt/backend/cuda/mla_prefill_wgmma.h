// MLA prefill attention's wgmma kernel (mla_prefill_wgmma.cu): variant 2 of kernels.h
// MlaPrefillAttention, which dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kimirt/backend/cuda/kernels.h"

namespace kimirt::cuda {

// Query rows of one thread block (PlanMlaPrefill's tile for these variants).
int64_t MlaPrefillWgmmaTileRows();
// The attention of `a` at the widths MlaPrefillSupported names.
void MlaPrefillWgmma(const MlaPrefillArgs& a, cudaStream_t s);

}  // namespace kimirt::cuda
