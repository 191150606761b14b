#include "kimirt/core/shape.h"

#include <gtest/gtest.h>

namespace kimirt {
namespace {

TEST(Shape, ElementCountAndText) {
  EXPECT_EQ(NumElements({}), 1);  // a scalar
  EXPECT_EQ(NumElements({12288, 0, 4}), 0);
  EXPECT_EQ(NumElements({12288, 1, 4}), 49152);
  EXPECT_EQ(ShapeToString({}), "[]");
  EXPECT_EQ(ShapeToString({12288, 1, 4}), "[12288, 1, 4]");
}

}  // namespace
}  // namespace kimirt
