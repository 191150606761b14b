// The --dtype flag of serve and bench model (vLLM's name): how GEMM weights are held on the
// device. auto: BF16 on CUDA (the checkpoint's own values, half the bytes of F32), F32 on the
// CPU (the reference backend computes with F32 weights). The math is F32 either way.
#pragma once

#include <string>

#include "kimirt/core/dtype.h"
#include "kimirt/core/status.h"

namespace kimirt {

// "auto", "float32"/"f32"/"fp32", "bfloat16"/"bf16"; anything else is an InvalidArgument naming
// the flag.
Result<DType> ParseDtypeFlag(const std::string& value, const std::string& device);

}  // namespace kimirt
