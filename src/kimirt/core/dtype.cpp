#include "kimirt/core/dtype.h"

#include <array>

namespace kimirt {
namespace {

struct DTypeInfo {
  DType type;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeInfo, kNumDTypes> kInfo = {{
    {DType::kBool, "BOOL", 1},     {DType::kU8, "U8", 1},         {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},       {DType::kI16, "I16", 2},       {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},     {DType::kU32, "U32", 4},       {DType::kI32, "I32", 4},
    {DType::kF32, "F32", 4},       {DType::kU64, "U64", 8},       {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},       {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
    {DType::kF8E8M0, "F8_E8M0", 1},
}};

}  // namespace

size_t DTypeSize(DType t) { return kInfo[static_cast<size_t>(t)].size; }

std::string_view DTypeName(DType t) { return kInfo[static_cast<size_t>(t)].name; }

std::optional<DType> ParseDType(std::string_view name) {
  for (const DTypeInfo& info : kInfo) {
    if (info.name == name) return info.type;
  }
  return std::nullopt;
}

}  // namespace kimirt
