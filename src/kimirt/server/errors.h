// Errors the OpenAI-compatible server answers with, and the one place that turns them into an
// HTTP status plus OpenAI error JSON (style-examples.md "Errors", after llama.cpp's
// format_error_response):
//   {"error": {"message": "...", "type": "invalid_request_error", "param": "temperature", "code": null}}
// Handlers build an ApiError and never throw; the HTTP layer sends RenderError's result.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kimirt/core/status.h"

namespace kimirt {

enum class ApiErrorKind : uint8_t {
  kInvalidRequest,    // 400: malformed JSON, wrong type or range, too long for the context
  kUnauthorized,      // 401: --api-key is set and the request did not carry it
  kModelNotFound,     // 404: `model` is not the served model name
  kNotFound,          // 404: no such endpoint
  kMethodNotAllowed,  // 405: the endpoint exists for another method
  kPayloadTooLarge,   // 413: body over ServerOptions::max_body_bytes
  kQueueFull,         // 429: the engine's waiting queue is full
  kClientClosed,      // 499 (nginx's "client closed request"): logged, never read by anyone
  kInternal,          // 500: a bug or an engine failure
  kNotImplemented,    // 501: a feature this build does not have
  kShuttingDown,      // 503: the server stopped accepting requests
};

struct ApiError {
  ApiErrorKind kind = ApiErrorKind::kInternal;
  std::string message;
  std::string param;  // the request field at fault, e.g. "messages[2].content"; "" → null
  std::string code;   // a machine-readable code; "" → the kind's default (often null)
};

inline ApiError InvalidRequest(std::string message, std::string param = {}) {
  return {ApiErrorKind::kInvalidRequest, std::move(message), std::move(param), {}};
}

struct ErrorReply {
  int http_status = 500;
  std::string body;  // the OpenAI error JSON, one line
};

// The single mapping kind → (HTTP status, OpenAI `type`, default `code`).
ErrorReply RenderError(const ApiError& error);
int HttpStatusOf(ApiErrorKind kind);

// A library Status → ApiError: InvalidArgument/OutOfRange/Unsupported → 400,
// ResourceExhausted → 429 (503 when `shutting_down`), NotFound → 400 (a request naming
// something absent, e.g. a chat marker the tokenizer lacks), everything else → 500.
ApiError ApiErrorFromStatus(const Status& status, bool shutting_down = false, std::string param = {});

}  // namespace kimirt
