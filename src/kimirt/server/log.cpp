// Leveled log lines (log.h).
#include "kimirt/server/log.h"

#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <ctime>
#include <string>

namespace kimirt {
namespace {

std::atomic<LogLevel> g_level{LogLevel::kInfo};

const char* Name(LogLevel level) {
  switch (level) {
    case LogLevel::kDebug: return "DEBUG";
    case LogLevel::kInfo: return "INFO";
    case LogLevel::kWarning: return "WARNING";
    case LogLevel::kError: return "ERROR";
  }
  return "INFO";
}

}  // namespace

Result<LogLevel> ParseLogLevel(std::string_view name) {
  std::string l(name);
  for (char& c : l) c = static_cast<char>(c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c);
  if (l == "debug") return LogLevel::kDebug;
  if (l == "info") return LogLevel::kInfo;
  if (l == "warning" || l == "warn") return LogLevel::kWarning;
  if (l == "error" || l == "critical") return LogLevel::kError;
  return InvalidArgument("--log-level: expected debug, info, warning or error, got \"" + std::string(name) + "\"");
}

void SetLogLevel(LogLevel level) { g_level.store(level); }

bool LogEnabled(LogLevel level) { return level >= g_level.load(); }

void Log(LogLevel level, const char* format, ...) {
  if (!LogEnabled(level)) return;
  char message[2048];
  va_list args;
  va_start(args, format);
  std::vsnprintf(message, sizeof(message), format, args);
  va_end(args);
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char stamp[32];
  std::strftime(stamp, sizeof(stamp), "%m-%d %H:%M:%S", &tm);
  std::fprintf(stderr, "%s %s %s\n", Name(level), stamp, message);
}

}  // namespace kimirt
