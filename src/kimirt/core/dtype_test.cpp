#include "kimirt/core/dtype.h"

#include <gtest/gtest.h>

namespace kimirt {
namespace {

TEST(DType, NamesRoundTripAndSizesMatchSafetensors) {
  for (int i = 0; i < kNumDTypes; ++i) {
    DType t = static_cast<DType>(i);
    std::optional<DType> back = ParseDType(DTypeName(t));
    ASSERT_TRUE(back.has_value()) << DTypeName(t);
    EXPECT_EQ(*back, t);
  }
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kU8), 1u);
  EXPECT_EQ(DTypeSize(DType::kF8E4M3), 1u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_FALSE(ParseDType("bf16").has_value());  // safetensors names are upper case
  EXPECT_FALSE(ParseDType("F4").has_value());
  EXPECT_FALSE(ParseDType("").has_value());
}

}  // namespace
}  // namespace kimirt
