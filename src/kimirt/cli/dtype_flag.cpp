// ParseDtypeFlag (dtype_flag.h).
#include "kimirt/cli/dtype_flag.h"

namespace kimirt {

Result<DType> ParseDtypeFlag(const std::string& value, const std::string& device) {
  if (value == "auto") return device == "cpu" ? DType::kF32 : DType::kBF16;
  if (value == "float32" || value == "f32" || value == "fp32") return DType::kF32;
  if (value == "bfloat16" || value == "bf16") return DType::kBF16;
  return InvalidArgument("--dtype: expected auto, float32 or bfloat16, got \"" + value + "\"");
}

}  // namespace kimirt
