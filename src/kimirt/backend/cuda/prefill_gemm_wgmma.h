// The prefill GEMM's tile kernel on wgmma (prefill_gemm_wgmma.cu), which prefill_gemm.cu runs
// after rounding x to BF16.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kimirt::cuda {

// y [m, n] (F32, or BF16 with bf16_out) = xb [m, kp] · w [n, kp]ᵀ, BF16 rows padded to kp (a
// multiple of 8) and 16-byte aligned. w_tiled (F32 out only): w decode-tiled (decode_tiled.cuh),
// kp = its k.
void PrefillGemmWgmmaTiles(const uint16_t* xb, int64_t m, int64_t kp, const uint16_t* w, int64_t n, void* y,
                           bool bf16_out, cudaStream_t s, bool w_tiled = false);

}  // namespace kimirt::cuda
