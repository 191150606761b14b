// kimirt's version, as `kimirt --version` prints it and GET /version answers.
#pragma once

#include <string_view>

namespace kimirt {

inline constexpr std::string_view kKimirtVersion = "0.1.0";

}  // namespace kimirt
