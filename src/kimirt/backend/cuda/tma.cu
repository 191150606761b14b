// Tensor maps and the TMA test copy (tma.h).
#include "kimirt/backend/cuda/tma.h"

#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <atomic>

#include "kimirt/backend/cuda/cp_async.cuh"
#include "kimirt/backend/cuda/dynamic_smem.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/tma.cuh"

namespace kimirt::cuda {

bool MakeTensorMapBf16Swizzled(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint64_t row_bytes,
                               uint32_t box_rows, std::string* error) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (encode == nullptr) {
    *error = "the CUDA driver has no cuTensorMapEncodeTiled (TMA needs a Hopper-capable driver)";
    return false;
  }
  const cuuint64_t dims[2] = {cols, rows};      // innermost first
  const cuuint64_t strides[1] = {row_bytes};    // of every dimension but the innermost, in bytes
  const cuuint32_t box[2] = {64, box_rows};     // 64 BF16 = the swizzle's 128 bytes
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims, strides, box,
                            element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    *error = "cuTensorMapEncodeTiled refused a " + std::to_string(rows) + " x " + std::to_string(cols) +
             " BF16 matrix with rows " + std::to_string(row_bytes) + " bytes apart in boxes of " +
             std::to_string(box_rows) + " x 64 (CUresult " + std::to_string(static_cast<int>(r)) + ")";
    return false;
  }
  return true;
}

namespace {

__global__ void TmaLoadPanelsKernel(const __grid_constant__ CUtensorMap map, int32_t y, int panels, uint32_t box_rows,
                                    uint16_t* out) {
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const uint32_t raw = SharedAddress(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle lines up with 1,024-byte address bits
  const uint32_t bar = base + panels * box_rows * 128u;
  const uint32_t panel_bytes = box_rows * 128u;
  if (threadIdx.x == 0) {
    tma::MbarInit(bar, 1);
    tma::FenceMbarInit();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    tma::MbarArriveExpectTx(bar, panels * panel_bytes);
    for (int p = 0; p < panels; ++p) tma::Load2D(base + p * panel_bytes, &map, bar, 64 * p, y);
  }
  tma::MbarWait(bar, 0);
  const unsigned char* from = smem_raw + (base - raw);
  const uint32_t words = panels * panel_bytes / 2;
  for (uint32_t i = threadIdx.x; i < words; i += blockDim.x) out[i] = reinterpret_cast<const uint16_t*>(from)[i];
}

}  // namespace

void TmaLoadPanelsForTest(const CUtensorMap& map, int32_t y, int panels, uint32_t box_rows, uint16_t* out, cudaStream_t s) {
  const size_t bytes = static_cast<size_t>(panels) * box_rows * 128 + 8 + 1024;
  static std::atomic<uint64_t> configured{0};
  AllowDynamicSmem(TmaLoadPanelsKernel, bytes, true, "TMA test copy", &configured);
  TmaLoadPanelsKernel<<<1, 128, bytes, s>>>(map, y, panels, box_rows, out);
  CheckLaunch("TMA test copy");
}

}  // namespace kimirt::cuda
