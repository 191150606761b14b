// MLA prefill attention's wgmma kernel (mla_prefill_wgmma.cu): variant 2 of kernels.h
// MlaPrefillAttention, which dispatches to it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kimirt/backend/cuda/kernels.h"

namespace kimirt::cuda {

// Query rows of one thread block (PlanMlaPrefill's tile for these variants).
int64_t MlaPrefillWgmmaTileRows();
// The attention of `a` at these widths (MlaPrefillAttention checks them and the grid; built for
// the widths MlaPrefillSupported names).
template <int DN, int DR, int DV>
void MlaPrefillWgmma(const MlaPrefillArgs& a, cudaStream_t s);

}  // namespace kimirt::cuda
