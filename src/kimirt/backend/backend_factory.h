// Backends by device name, for the CLI and the tests: "cpu" always; "cuda" when the build has
// the CUDA backend (-DKIMIRT_CUDA=ON) and a GPU is visible.
#pragma once

#include <memory>
#include <string_view>

#include "kimirt/backend/backend.h"
#include "kimirt/core/status.h"

namespace kimirt {

// Errors: an unknown name (InvalidArgument); "cuda" in a build without it, or with no usable
// GPU (Unsupported, saying which).
Result<std::unique_ptr<Backend>> MakeBackend(std::string_view device, int device_index = 0);
bool CudaBackendBuilt();
// GPUs this process sees (under CUDA_VISIBLE_DEVICES); 0 in a build without the CUDA backend.
int VisibleCudaDevices();
// The cudaStream_t a CUDA backend issues its ops on (nullptr for other backends): a
// communicator reducing its tensors must issue on it (nccl_communicator.h NcclOptions::stream).
void* BackendStream(Backend& backend);

}  // namespace kimirt
