// Status and Result<T>: errors as values at the edges (DESIGN.md principle 6).
// A Status names what went wrong (file, tensor or field) in its message; callers add context
// with WithContext() as the error travels up. KIMIRT_CHECK (check.h) is for programmer errors only.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

namespace kimirt {

enum class ErrorCode : uint8_t {
  kOk = 0,
  kInvalidArgument,   // a bad flag, request or config value
  kNotFound,          // a missing file, tensor or field
  kIo,                // the OS refused (open, read, mmap, write)
  kCorrupt,           // a file that breaks its format's promises
  kUnsupported,       // valid input we do not handle (yet)
  kOutOfRange,        // an index or size beyond a limit
  kResourceExhausted, // memory, queue or cache full
  kInternal,          // a bug
};

std::string_view ErrorCodeName(ErrorCode code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status Ok() { return Status(); }
  bool ok() const { return code_ == ErrorCode::kOk; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }

  // "context: message"; a no-op on OK.
  Status WithContext(std::string_view context) const;
  // "<code name>: message", for logs.
  std::string ToString() const;

 private:
  ErrorCode code_ = ErrorCode::kOk;
  std::string message_;
};

inline Status InvalidArgument(std::string m) { return {ErrorCode::kInvalidArgument, std::move(m)}; }
inline Status NotFound(std::string m) { return {ErrorCode::kNotFound, std::move(m)}; }
inline Status IoError(std::string m) { return {ErrorCode::kIo, std::move(m)}; }
inline Status Corrupt(std::string m) { return {ErrorCode::kCorrupt, std::move(m)}; }
inline Status Unsupported(std::string m) { return {ErrorCode::kUnsupported, std::move(m)}; }
inline Status OutOfRange(std::string m) { return {ErrorCode::kOutOfRange, std::move(m)}; }
inline Status ResourceExhausted(std::string m) { return {ErrorCode::kResourceExhausted, std::move(m)}; }
inline Status Internal(std::string m) { return {ErrorCode::kInternal, std::move(m)}; }

// A value or an error. Accessing value() of an error is a programmer error (aborts).
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}                 // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) { CheckNotOk(); }  // NOLINT

  bool ok() const { return v_.index() == 0; }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<1>(v_);
  }
  T& value() & { CheckOk(); return std::get<0>(v_); }
  const T& value() const& { CheckOk(); return std::get<0>(v_); }
  T&& value() && { CheckOk(); return std::get<0>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void CheckOk() const;
  void CheckNotOk() const;
  std::variant<T, Status> v_;
};

[[noreturn]] void AbortBadResultAccess(const Status& status);
[[noreturn]] void AbortOkStatusInResult();

template <typename T>
void Result<T>::CheckOk() const {
  if (!ok()) AbortBadResultAccess(std::get<1>(v_));
}
template <typename T>
void Result<T>::CheckNotOk() const {
  if (ok() || std::get<1>(v_).ok()) AbortOkStatusInResult();
}

}  // namespace kimirt

#define KIMIRT_CONCAT_INNER_(a, b) a##b
#define KIMIRT_CONCAT_(a, b) KIMIRT_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is an error.
#define KIMIRT_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::kimirt::Status _kimirt_status = (expr);        \
    if (!_kimirt_status.ok()) return _kimirt_status; \
  } while (0)

// `lhs = value of expr` or return its Status. `lhs` may be a declaration (`auto x`).
#define KIMIRT_ASSIGN_OR_RETURN(lhs, expr) \
  KIMIRT_ASSIGN_OR_RETURN_IMPL_(KIMIRT_CONCAT_(_kimirt_result_, __LINE__), lhs, expr)
#define KIMIRT_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return tmp.status();                 \
  lhs = std::move(tmp).value()
