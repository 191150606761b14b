// The backends a test binary runs its device-parameterized tests on: "cpu" always, and the CUDA
// variants in a -DKIMIRT_CUDA=ON build (KIMIRT_TEST_CUDA). A CUDA build's tests need a GPU: a
// backend that cannot be made is a failure there, never a skip.
#pragma once

#include <string>
#include <vector>

namespace kimirt::testing {

inline std::vector<std::string> BuiltDevices(std::vector<std::string> cuda_variants = {"cuda"}) {
  std::vector<std::string> devices = {"cpu"};
  if (KIMIRT_TEST_CUDA) devices.insert(devices.end(), cuda_variants.begin(), cuda_variants.end());
  return devices;
}

}  // namespace kimirt::testing
