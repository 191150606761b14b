// DType: the element types of safetensors checkpoints and of our tensors, with their
// safetensors names and byte sizes. Value conversions live in dtype_convert.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kimirt {

enum class DType : uint8_t {
  kBool,
  kU8,
  kI8,
  kU16,
  kI16,
  kF16,
  kBF16,
  kU32,
  kI32,
  kF32,
  kU64,
  kI64,
  kF64,
  kF8E4M3,  // OCP FP8 E4M3 ("fn": no infinities, 0x7F/0xFF = NaN), safetensors "F8_E4M3"
  kF8E5M2,  // OCP FP8 E5M2 (IEEE-like), "F8_E5M2"
  kF8E8M0,  // OCP MX scale: 2^(code-127), 0xFF = NaN, "F8_E8M0"
};

inline constexpr int kNumDTypes = 16;

// Bytes per element.
size_t DTypeSize(DType t);
// The safetensors spelling ("BF16", "F8_E4M3", ...).
std::string_view DTypeName(DType t);
// Parses a safetensors dtype name; nullopt for names we do not know (including the sub-byte
// "F4"/"F6_*" types, which no Kimi checkpoint uses).
std::optional<DType> ParseDType(std::string_view name);

}  // namespace kimirt
