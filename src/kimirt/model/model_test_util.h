// Helpers shared by the model tests: fixture paths, golden tensors, comparisons.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/io/safetensors.h"
#include "kimirt/model/model.h"
#include "kimirt/testing/devices.h"
#include "kimirt/testing/test_data.h"

namespace kimirt::testing {

// Fails the calling test (ASSERT_*) when a fixture's files are not where the tests look.
#define KIMIRT_REQUIRE_FIXTURE(name) KIMIRT_REQUIRE_FILE(::kimirt::testing::FixtureDir(name) + "/goldens.safetensors")

// The tensors of one goldens.safetensors / debug.safetensors file, as F32 or I32 host tensors.
class Goldens {
 public:
  explicit Goldens(const std::string& path) {
    auto f = SafetensorsFile::Open(path);
    EXPECT_TRUE(f.ok()) << f.status().ToString();
    if (f.ok()) file_ = std::move(f).value();
  }
  bool Has(const std::string& name) const { return file_ && file_->Find(name) != nullptr; }
  Tensor Get(const std::string& name) const {
    const TensorInfo* info = file_->Find(name);
    EXPECT_NE(info, nullptr) << name;
    if (info == nullptr) return Tensor::Host({0});
    Tensor t = Tensor::Host(info->shape, info->dtype);
    auto data = file_->Data(*info);
    EXPECT_TRUE(data.ok());
    std::memcpy(t.raw(), data->data(), data->size());
    return t;
  }
  std::vector<int32_t> Ids(const std::string& name) const {
    Tensor t = Get(name);
    return std::vector<int32_t>(t.i32(), t.i32() + t.numel());
  }

 private:
  std::unique_ptr<SafetensorsFile> file_;
};

inline float MaxAbs(const Tensor& t) {
  float m = 0;
  for (int64_t i = 0; i < t.numel(); ++i) m = std::max(m, std::fabs(t.f32()[i]));
  return m;
}
inline float MaxAbsDiff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  float m = 0;
  for (int64_t i = 0; i < std::min(a.numel(), b.numel()); ++i) m = std::max(m, std::fabs(a.f32()[i] - b.f32()[i]));
  return m;
}
inline double RelL2(const Tensor& got, const Tensor& want) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double d = static_cast<double>(got.f32()[i]) - want.f32()[i];
    num += d * d;
    den += static_cast<double>(want.f32()[i]) * want.f32()[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
// Test names for (fixture, device) parameters: ("tiny-a", "cuda-bf16") → "tiny_a_cuda_bf16".
inline std::string FixtureDeviceName(const ::testing::TestParamInfo<std::tuple<std::string, std::string>>& info) {
  std::string n = std::get<0>(info.param) + "_" + std::get<1>(info.param);
  std::replace(n.begin(), n.end(), '-', '_');
  return n;
}

inline int32_t ArgMax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace kimirt::testing
