// The paged latent cache's row writes and gathers on CUDA (kernels.h; backend.h KvStorage):
// the same codes as the CPU storage — BF16 by round-to-nearest-even, FP8 E4M3 by RNE with
// saturation after dividing by the token's per-part scale amax / 448.
#include "kimirt/backend/cuda/block_reduce.cuh"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/backend/cuda/pdl.cuh"

#include <cuda_bf16.h>
#include <cuda_fp8.h>

namespace kimirt::cuda {
namespace {

constexpr float kFp8Max = 448.0f;

__device__ int64_t RowOffset(const int32_t* table, int layers, int layer, int block_size, int64_t p, int64_t w) {
  const int64_t block = table[p / block_size];
  return ((block * layers + layer) * block_size + p % block_size) * w;
}

// Row c [r] ‖ ks [dr] into the codes at element offset `off`, by one thread block.
__device__ void WriteRow(const float* c, const float* ks, int64_t r, int64_t dr, int64_t off, int kind, void* values,
                         float* scales) {
  __shared__ float scratch[33];
  const int64_t w = r + dr;
  auto value = [&](int64_t i) { return i < r ? c[i] : ks[i - r]; };
  if (kind == 0) {
    float* dst = static_cast<float*>(values) + off;
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) dst[i] = value(i);
  } else if (kind == 1) {
    __nv_bfloat16* dst = static_cast<__nv_bfloat16*>(values) + off;
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) dst[i] = __float2bfloat16_rn(value(i));
  } else {
    __nv_fp8_storage_t* dst = static_cast<__nv_fp8_storage_t*>(values) + off;
    float amax_c = 0.0f, amax_k = 0.0f;
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
      const float a = fabsf(value(i));
      if (i < r) {
        amax_c = fmaxf(amax_c, a);
      } else {
        amax_k = fmaxf(amax_k, a);
      }
    }
    amax_c = BlockMax(amax_c, scratch);
    amax_k = BlockMax(amax_k, scratch);
    const float sc = amax_c > 0.0f ? amax_c / kFp8Max : 1.0f;
    const float sk = amax_k > 0.0f ? amax_k / kFp8Max : 1.0f;
    for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
      dst[i] = __nv_cvt_float_to_fp8(value(i) / (i < r ? sc : sk), __NV_SATFINITE, __NV_E4M3);
    }
    if (threadIdx.x == 0) {
      scales[off / w * 2] = sc;
      scales[off / w * 2 + 1] = sk;
    }
  }
}

// One block per token.
__global__ void KvWriteKernel(const float* c, const float* ks, int64_t r, int64_t dr, const int32_t* table,
                              int64_t pos, int layers, int layer, int block_size, int kind, void* values,
                              float* scales) {
  const int64_t t = blockIdx.x;
  const int64_t off = RowOffset(table, layers, layer, block_size, pos + t, r + dr);
  WriteRow(c + t * r, ks + t * dr, r, dr, off, kind, values, scales);
}

// One block per sequence of the step: its row b at position context[b] - 1.
__global__ void KvWriteDecodeKernel(const float* c, const float* ks, int64_t r, int64_t dr, const int32_t* context,
                                    const int32_t* table_begin, const int32_t* tables, int layers, int layer,
                                    int block_size, int kind, void* values, float* scales) {
  PdlEnter();  // launched with LaunchPdl: wait for the kernel before, let the next one launch (pdl.cuh)
  const int64_t b = blockIdx.x;
  const int64_t off = RowOffset(tables + table_begin[b], layers, layer, block_size, context[b] - 1, r + dr);
  WriteRow(c + b * r, ks + b * dr, r, dr, off, kind, values, scales);
}

// One block per position.
__global__ void KvGatherKernel(const void* values, const float* scales, int64_t first, int64_t r, int64_t dr,
                               const int32_t* table, int layers, int layer, int block_size, int kind, float* c,
                               float* ks) {
  const int64_t p = blockIdx.x, w = r + dr;
  const int64_t off = RowOffset(table, layers, layer, block_size, first + p, w);
  for (int64_t i = threadIdx.x; i < w; i += blockDim.x) {
    float v;
    if (kind == 0) {
      v = static_cast<const float*>(values)[off + i];
    } else if (kind == 1) {
      v = __bfloat162float(static_cast<const __nv_bfloat16*>(values)[off + i]);
    } else {
      const __half_raw h = __nv_cvt_fp8_to_halfraw(static_cast<const __nv_fp8_storage_t*>(values)[off + i], __NV_E4M3);
      v = __half2float(__half(h)) * scales[off / w * 2 + (i < r ? 0 : 1)];
    }
    if (i < r) {
      c[p * r + i] = v;
    } else {
      ks[p * dr + (i - r)] = v;
    }
  }
}

}  // namespace

void KvWrite(const float* c, const float* ks, int64_t T, int64_t r, int64_t dr, const int32_t* table, int64_t pos,
             int layers, int layer, int block_size, int kind, void* values, float* scales, cudaStream_t s) {
  if (T == 0) return;
  KvWriteKernel<<<static_cast<unsigned>(T), 128, 0, s>>>(c, ks, r, dr, table, pos, layers, layer, block_size, kind,
                                                          values, scales);
  CheckLaunch("KvWrite");
}

void KvWriteDecode(const float* c, const float* ks, int64_t B, int64_t r, int64_t dr, const int32_t* context,
                   const int32_t* table_begin, const int32_t* tables, int layers, int layer, int block_size, int kind,
                   void* values, float* scales, cudaStream_t s) {
  if (B == 0) return;
  LaunchPdl("KvWriteDecode", KvWriteDecodeKernel, dim3(static_cast<unsigned>(B)), dim3(128), 0, s, c, ks, r, dr, context,
            table_begin, tables, layers, layer, block_size, kind, values, scales);
  CheckLaunch("KvWriteDecode");
}

void KvGather(const void* values, const float* scales, int64_t first, int64_t len, int64_t r, int64_t dr,
              const int32_t* table, int layers, int layer, int block_size, int kind, float* c, float* ks,
              cudaStream_t s) {
  if (len <= first) return;
  KvGatherKernel<<<static_cast<unsigned>(len - first), 128, 0, s>>>(values, scales, first, r, dr, table, layers, layer,
                                                                     block_size, kind, c, ks);
  CheckLaunch("KvGather");
}

}  // namespace kimirt::cuda
