// The CUDA backend: every Backend op (backend.h) on one NVIDIA GPU, in FP32, checked op by op
// against the CPU reference and end to end on the fixtures' goldens (cuda_backend_test.cpp,
// model_golden_test.cpp). Built only with -DKIMIRT_CUDA=ON; callers go through MakeBackend
// (backend_factory.h), which says so when it is not.
//
// Memory: tensors come from a caching pool (size classes a quarter-power of two apart), so a
// forward pass allocates from the pool, not from the driver, once warm. Everything runs on the
// backend's own stream in issue order; Download() waits for it. GEMMs go through cuBLAS in plain
// FP32 (no TF32) or BF16-weight kernels with F32 accumulation, so results stay within rounding of
// the CPU reference.
//
// Weights: F32, or BF16 for the GEMM weights (weights.h LoadOptions), always with F32 math.
// Not yet (docs/cuda.md): batched decode, CUDA graphs, packed MXFP4 experts, the chunked KDA
// form (computed recurrently). One backend per process and GPU: -tp N runs N processes
// (engine/process_ranks_runner.h), collectives over NCCL on CudaBackendStream.
#pragma once

#include <memory>

#include "kimirt/backend/backend.h"
#include "kimirt/core/status.h"

namespace kimirt {

// Errors: no CUDA device with that index, or the driver or cuBLAS could not start.
Result<std::unique_ptr<Backend>> MakeCudaBackend(int device);
// GPUs this process sees (cudaGetDeviceCount, under CUDA_VISIBLE_DEVICES); 0 without a usable
// driver.
int CudaDeviceCount();
// The cudaStream_t `backend` issues every op on, when it is a CUDA backend (else nullptr):
// collectives on its tensors go on it too, so they are ordered with the ops around them.
void* CudaBackendStream(Backend& backend);

}  // namespace kimirt
