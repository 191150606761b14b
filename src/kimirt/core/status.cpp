#include "kimirt/core/status.h"

#include <cstdio>
#include <cstdlib>

namespace kimirt {

std::string_view ErrorCodeName(ErrorCode code) {
  switch (code) {
    case ErrorCode::kOk: return "ok";
    case ErrorCode::kInvalidArgument: return "invalid argument";
    case ErrorCode::kNotFound: return "not found";
    case ErrorCode::kIo: return "i/o error";
    case ErrorCode::kCorrupt: return "corrupt";
    case ErrorCode::kUnsupported: return "unsupported";
    case ErrorCode::kOutOfRange: return "out of range";
    case ErrorCode::kResourceExhausted: return "resource exhausted";
    case ErrorCode::kInternal: return "internal error";
  }
  return "unknown";
}

Status Status::WithContext(std::string_view context) const {
  if (ok()) return *this;
  return Status(code_, std::string(context) + ": " + message_);
}

std::string Status::ToString() const {
  if (ok()) return "ok";
  return std::string(ErrorCodeName(code_)) + ": " + message_;
}

void AbortBadResultAccess(const Status& status) {
  std::fprintf(stderr, "kimirt: value() of an error Result: %s\n", status.ToString().c_str());
  std::abort();
}

void AbortOkStatusInResult() {
  std::fprintf(stderr, "kimirt: a Result was built from an OK Status\n");
  std::abort();
}

}  // namespace kimirt
