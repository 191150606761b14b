// The server's log lines on stderr, in vLLM's shape so that log scrapers carry over:
//   INFO 12-01 02:03:04 POST /v1/chat/completions 200 12.3 ms request_id=…
// `--log-level` picks the least severe level written.
//
// Thread safety: Log may be called from any thread (one line per fprintf); SetLogLevel before
// serving.
#pragma once

#include <cstdint>
#include <string_view>

#include "kimirt/core/status.h"

namespace kimirt {

enum class LogLevel : uint8_t { kDebug, kInfo, kWarning, kError };

// debug, info, warning, error (vLLM's names, any case; "warn" too).
Result<LogLevel> ParseLogLevel(std::string_view name);
void SetLogLevel(LogLevel level);
bool LogEnabled(LogLevel level);
// printf-style; the line ends with a newline.
void Log(LogLevel level, const char* format, ...) __attribute__((format(printf, 2, 3)));

}  // namespace kimirt
