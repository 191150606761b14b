// The pieces io/'s error messages are built from, one definition for the safetensors reader,
// the writer and Checkpoint: names in double quotes, errno as text. Internal to io/.
#pragma once

#include <string>
#include <string_view>
#include <system_error>

namespace kimirt::io_internal {

// `s` in double quotes, the way messages name a tensor, field or file: "a.0.weight".
inline std::string Quote(std::string_view s) { return "\"" + std::string(s) + "\""; }

// The C library's text for errno `err`, e.g. "No such file or directory".
inline std::string ErrnoString(int err) {
  return std::error_code(err, std::generic_category()).message();
}

}  // namespace kimirt::io_internal
