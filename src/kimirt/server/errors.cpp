// The one switch from ApiErrorKind to HTTP status and OpenAI error type (errors.h).
#include "kimirt/server/errors.h"

#include <nlohmann/json.hpp>

namespace kimirt {
namespace {

struct KindInfo {
  int status;
  const char* type;
  const char* default_code;  // nullptr → JSON null
};

// OpenAI's own API answers an unknown model with 404 + invalid_request_error + model_not_found;
// the other type strings follow llama.cpp's server, which OpenAI clients accept (they dispatch on
// the HTTP status, not the type).
KindInfo Info(ApiErrorKind kind) {
  switch (kind) {
    case ApiErrorKind::kInvalidRequest: return {400, "invalid_request_error", nullptr};
    case ApiErrorKind::kUnauthorized: return {401, "authentication_error", "invalid_api_key"};
    case ApiErrorKind::kModelNotFound: return {404, "invalid_request_error", "model_not_found"};
    case ApiErrorKind::kNotFound: return {404, "not_found_error", nullptr};
    case ApiErrorKind::kMethodNotAllowed: return {405, "invalid_request_error", "method_not_allowed"};
    case ApiErrorKind::kPayloadTooLarge: return {413, "invalid_request_error", "request_too_large"};
    case ApiErrorKind::kQueueFull: return {429, "rate_limit_error", "queue_full"};
    case ApiErrorKind::kClientClosed: return {499, "client_closed_request", nullptr};
    case ApiErrorKind::kInternal: return {500, "server_error", nullptr};
    case ApiErrorKind::kNotImplemented: return {501, "not_supported_error", "not_implemented"};
    case ApiErrorKind::kShuttingDown: return {503, "unavailable_error", "shutting_down"};
  }
  return {500, "server_error", nullptr};
}

}  // namespace

int HttpStatusOf(ApiErrorKind kind) { return Info(kind).status; }

ErrorReply RenderError(const ApiError& error) {
  const KindInfo info = Info(error.kind);
  nlohmann::json e = nlohmann::json::object();
  e["message"] = error.message;
  e["type"] = info.type;
  e["param"] = error.param.empty() ? nlohmann::json(nullptr) : nlohmann::json(error.param);
  if (!error.code.empty()) {
    e["code"] = error.code;
  } else if (info.default_code != nullptr) {
    e["code"] = info.default_code;
  } else {
    e["code"] = nullptr;
  }
  nlohmann::json body = {{"error", std::move(e)}};
  // `replace`: a message quoting user bytes that are not UTF-8 must not make dump() throw.
  return {info.status, body.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)};
}

ApiError ApiErrorFromStatus(const Status& status, bool shutting_down, std::string param) {
  ApiErrorKind kind = ApiErrorKind::kInternal;
  switch (status.code()) {
    case ErrorCode::kInvalidArgument:
    case ErrorCode::kOutOfRange:
    case ErrorCode::kUnsupported:
    case ErrorCode::kNotFound:
      kind = ApiErrorKind::kInvalidRequest;
      break;
    case ErrorCode::kResourceExhausted:
      kind = shutting_down ? ApiErrorKind::kShuttingDown : ApiErrorKind::kQueueFull;
      break;
    case ErrorCode::kOk:
    case ErrorCode::kIo:
    case ErrorCode::kCorrupt:
    case ErrorCode::kInternal:
      kind = ApiErrorKind::kInternal;
      break;
  }
  return {kind, status.message(), std::move(param), {}};
}

}  // namespace kimirt
