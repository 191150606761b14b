// The softmax's exponential for the MLA prefill kernels (mla_prefill_kernels.cu,
// mla_prefill_wgmma.cu). Its own header: the host emulations of the kernels that include
// ldmatrix_mma.cuh turn that file into host C++ and take no inline PTX they do not replace.
#pragma once

namespace kimirt::cuda {

// 2^x by the SFU alone (ex2.approx.ftz: ~2 ulp, results below 2^-126 flushed to zero, -inf → +0),
// for the attention kernels' softmax: exp2f wraps the same instruction in a rescaling for
// subnormal results (four more instructions a value), which probabilities that small never need.
// Every kernel of a family uses this one, so they keep each other's bits.
__device__ __forceinline__ float Exp2Ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

}  // namespace kimirt::cuda
