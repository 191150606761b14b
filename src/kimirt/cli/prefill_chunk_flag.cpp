// ResolvePrefillChunk (prefill_chunk_flag.h).
#include "kimirt/cli/prefill_chunk_flag.h"

namespace kimirt {

Result<int> ResolvePrefillChunk(int flag_value, const std::string& device) {
  if (flag_value < 0) {
    return InvalidArgument("--prefill-chunk: expected a positive token count (or 0: the device's default), got " +
                           std::to_string(flag_value));
  }
  if (flag_value > 0) return flag_value;
  return device == "cuda" ? 1024 : 256;
}

}  // namespace kimirt
