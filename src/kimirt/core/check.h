// KIMIRT_CHECK: aborts with file:line on a broken invariant. For programmer errors only;
// anything a user can cause returns a Status instead (DESIGN.md principle 6).
#pragma once

namespace kimirt::detail {
[[noreturn]] void CheckFailed(const char* file, int line, const char* expr, const char* msg);
}  // namespace kimirt::detail

#define KIMIRT_CHECK(cond)                                                   \
  do {                                                                       \
    if (!(cond)) ::kimirt::detail::CheckFailed(__FILE__, __LINE__, #cond, ""); \
  } while (0)
#define KIMIRT_CHECK_MSG(cond, msg)                                           \
  do {                                                                        \
    if (!(cond)) ::kimirt::detail::CheckFailed(__FILE__, __LINE__, #cond, msg); \
  } while (0)
