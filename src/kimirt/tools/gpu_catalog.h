// GpuSpec: the accelerators `kimirt plan --gpu NAME` knows, with the capacity as sold and the
// capacity the planner divides by. Vendors sell HBM in "GB" that are really stack capacities
// (binary); the seed treats MI355X's "288 GB" as 288 GiB, so AMD parts use the sold number as
// GiB. NVIDIA parts use what nvidia-smi reports as total memory where that is known.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kimirt {

struct GpuSpec {
  std::string name;          // "H200"
  std::string sold_as;       // "141 GB HBM3e"
  uint64_t capacity_bytes;   // what the planner compares against
  std::string basis;         // where capacity_bytes comes from
  double hbm_tb_per_s;       // peak HBM bandwidth (decimal TB/s), for roofline notes
  int scale_up_domain;       // GPUs one tensor-parallel group may span (NVLink / xGMI domain)
};

const std::vector<GpuSpec>& GpuCatalog();
// Case-insensitive; "h200", "H200", "mi355x".
std::optional<GpuSpec> FindGpu(std::string_view name);
// "MI355X, MI300X, ..." for error messages.
std::string GpuCatalogNames();

}  // namespace kimirt
