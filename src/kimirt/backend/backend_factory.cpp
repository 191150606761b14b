// MakeBackend (backend_factory.h).
#include "kimirt/backend/backend_factory.h"

#include <string>

#include "kimirt/backend/cpu/cpu_backend.h"
#if KIMIRT_HAVE_CUDA
#include "kimirt/backend/cuda/cuda_backend.h"
#endif

namespace kimirt {

bool CudaBackendBuilt() { return KIMIRT_HAVE_CUDA != 0; }

int VisibleCudaDevices() {
#if KIMIRT_HAVE_CUDA
  return CudaDeviceCount();
#else
  return 0;
#endif
}

void* BackendStream(Backend& backend) {
#if KIMIRT_HAVE_CUDA
  return CudaBackendStream(backend);
#else
  (void)backend;
  return nullptr;
#endif
}

Result<std::unique_ptr<Backend>> MakeBackend(std::string_view device, int device_index) {
  if (device == "cpu") return MakeCpuBackend();
  if (device == "cuda") {
#if KIMIRT_HAVE_CUDA
    return MakeCudaBackend(device_index);
#else
    (void)device_index;
    return Unsupported("this kimirt was built without the CUDA backend (configure with -DKIMIRT_CUDA=ON)");
#endif
  }
  return InvalidArgument("unknown device '" + std::string(device) + "' (cpu or cuda)");
}

}  // namespace kimirt
