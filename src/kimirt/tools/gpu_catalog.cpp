#include "kimirt/tools/gpu_catalog.h"

#include <algorithm>
#include <cctype>

namespace kimirt {
namespace {
constexpr uint64_t kGiB = uint64_t{1} << 30;
constexpr uint64_t kMiB = uint64_t{1} << 20;
}  // namespace

const std::vector<GpuSpec>& GpuCatalog() {
  static const std::vector<GpuSpec> k = {
      {"MI355X", "288 GB HBM3E", 288 * kGiB, "sold capacity read as GiB, as the seed does", 8.0, 8},
      {"MI300X", "192 GB HBM3", 192 * kGiB, "sold capacity read as GiB (seed convention)", 5.3, 8},
      {"MI325X", "256 GB HBM3E", 256 * kGiB, "sold capacity read as GiB (seed convention)", 6.0, 8},
      {"H100", "80 GB HBM3 (SXM)", 81559 * kMiB, "nvidia-smi total memory, H100 SXM", 3.35, 8},
      {"H200", "141 GB HBM3e", 143771 * kMiB, "nvidia-smi total memory, H200 SXM", 4.8, 8},
      {"B200", "180 GB HBM3e", 183359 * kMiB, "nvidia-smi total memory, B200", 8.0, 8},
      {"B300", "288 GB HBM3e", 288 * kGiB, "sold capacity read as GiB (not measured)", 8.0, 8},
      {"GB300", "288 GB HBM3e", 288 * kGiB, "sold capacity read as GiB (not measured)", 8.0, 72},
  };
  return k;
}

std::optional<GpuSpec> FindGpu(std::string_view name) {
  std::string want(name);
  std::transform(want.begin(), want.end(), want.begin(), [](unsigned char ch) { return std::toupper(ch); });
  for (const GpuSpec& g : GpuCatalog()) {
    if (g.name == want) return g;
  }
  return std::nullopt;
}

std::string GpuCatalogNames() {
  std::string s;
  for (const GpuSpec& g : GpuCatalog()) s += (s.empty() ? "" : ", ") + g.name;
  return s;
}

}  // namespace kimirt
