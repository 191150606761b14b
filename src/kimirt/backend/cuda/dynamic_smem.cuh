// Opting a kernel into more than the 48 KB of dynamic shared memory a launch gets by default, for
// every kernel that needs it (decode GEMM x staging, MLA decode rings, chunked KDA, MLA prefill,
// the staged GEMV): one place for the attribute calls and the error.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace kimirt::cuda {

// Lets `kernel` take `bytes` of dynamic shared memory and, with `max_carveout`, asks for all of
// the SM's unified L1/shared memory as shared memory (for kernels that need two or more such
// blocks an SM). The attributes belong to the current device, so `configured` (one bit a device
// id, owned by the caller per kernel: a static next to the launch) records where they are set;
// null, or device ids ≥ 64, set them on every call (a microsecond). Aborts, naming `what`, if
// the device refuses.
template <class Kernel>
void AllowDynamicSmem(Kernel kernel, size_t bytes, bool max_carveout, const char* what,
                      std::atomic<uint64_t>* configured) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  const uint64_t bit = e == cudaSuccess && dev < 64 ? uint64_t{1} << dev : 0;
  if (configured != nullptr && bit != 0 && (configured->load(std::memory_order_acquire) & bit) != 0) return;
  if (e == cudaSuccess) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
  }
  if (e == cudaSuccess && max_carveout) {
    e = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared);
  }
  if (e != cudaSuccess) {
    std::fprintf(stderr, "kimirt: %s: %zu bytes of shared memory refused: %s\n", what, bytes, cudaGetErrorString(e));
    std::abort();
  }
  if (configured != nullptr) configured->fetch_or(bit, std::memory_order_acq_rel);
}

}  // namespace kimirt::cuda
