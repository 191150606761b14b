// Which chat format the served model speaks. The CLI picks it from the model's config; the
// server itself knows nothing of model configs (DESIGN.md "Layers").
#pragma once

#include <cstdint>

namespace kimirt {

enum class ChatFormat : uint8_t {
  kK3,          // K3's XTML (RenderK3Chat); output split by K3CompletionParser
  kKimiLinear,  // Kimi-Linear-48B's K2-style template; output returned as content
};

}  // namespace kimirt
