// SmCount (kernels.h): the device's multiprocessors, asked once a process — the chunked KDA's
// block widths and the persistent MLA decode split's block count are sized by it.
#include "kimirt/backend/cuda/kernels.h"

namespace kimirt::cuda {

int SmCount() {
  static const int count = [] {
    int dev = 0, n = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess) {
      return 132;
    }
    return n;
  }();
  return count;
}

}  // namespace kimirt::cuda
