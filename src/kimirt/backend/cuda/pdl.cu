// The capture-side rules of a programmatic dependent launch (pdl.cuh).
#include "kimirt/backend/cuda/pdl.cuh"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>

namespace kimirt::cuda {
namespace {

const char* NodeTypeName(cudaGraphNodeType t) {
  switch (t) {
    case cudaGraphNodeTypeKernel: return "kernel";
    case cudaGraphNodeTypeMemcpy: return "memcpy";
    case cudaGraphNodeTypeMemset: return "memset";
    case cudaGraphNodeTypeHost: return "host";
    case cudaGraphNodeTypeGraph: return "child graph";
    case cudaGraphNodeTypeEmpty: return "empty";
    case cudaGraphNodeTypeWaitEvent: return "event wait";
    case cudaGraphNodeTypeEventRecord: return "event record";
    case cudaGraphNodeTypeMemAlloc: return "mem alloc";
    case cudaGraphNodeTypeMemFree: return "mem free";
    default: return "other";
  }
}

// The nodes a launch on the capturing stream `s` would depend on, as "kernel, memcpy, ..."; sets
// *all_kernels. Empty (and *all_kernels true) when `s` is not capturing.
std::string CaptureDependencies(cudaStream_t s, bool* all_kernels) {
  *all_kernels = true;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  size_t n = 0;
  if (cudaStreamGetCaptureInfo(s, &status, nullptr, nullptr, &deps, nullptr, &n) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive) {
    return {};
  }
  std::string names;
  for (size_t i = 0; i < n; ++i) {
    cudaGraphNodeType t = cudaGraphNodeTypeCount;
    (void)cudaGraphNodeGetType(deps[i], &t);
    if (t != cudaGraphNodeTypeKernel) *all_kernels = false;
    names += (i == 0 ? "" : ", ");
    names += NodeTypeName(t);
  }
  return names.empty() ? std::string("none") : names;
}

}  // namespace

bool PdlAllowedOn(cudaStream_t s, const char* what) {
  if (!PdlEnabled()) return false;
  // KIMIRT_PDL_CAPTURE_GUARD=0: every PDL launch keeps its attribute in a capture too, to see what
  // the driver does with a programmatic edge from a non-kernel node (gpu_check capdiag2).
  static const bool guard = EnvSwitchOn("KIMIRT_PDL_CAPTURE_GUARD");
  if (!guard) return true;
  bool all_kernels = true;
  const std::string deps = CaptureDependencies(s, &all_kernels);
  if (!all_kernels) {
    static const bool log = std::getenv("KIMIRT_PDL_CAPTURE_LOG") != nullptr;
    if (log) std::fprintf(stderr, "kimirt: %s captured without PDL: it follows %s\n", what, deps.c_str());
  }
  return all_kernels;
}

void LaunchRefused(const char* what, cudaError_t e, cudaStream_t s) {
  bool all_kernels = true;
  const std::string deps = CaptureDependencies(s, &all_kernels);
  std::fprintf(stderr, "kimirt: CUDA kernel %s failed to launch: %s%s%s (pid %d)\n", what, cudaGetErrorString(e),
               deps.empty() ? "" : "; the stream is capturing, the launch would follow: ", deps.c_str(),
               static_cast<int>(getpid()));
  std::abort();
}

}  // namespace kimirt::cuda
