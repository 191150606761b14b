// API key, X-Request-Id, CORS and the request log around every route (api_gateway.h).
#include "kimirt/server/api_gateway.h"

#include <algorithm>
#include <cctype>
#include <chrono>
#include <utility>

#include "kimirt/server/log.h"
#include "kimirt/server/serving_context.h"

namespace kimirt {
namespace {

constexpr std::string_view kRequestIdHeader = "X-Request-Id";

// Compares without an early exit, so the time taken does not tell how much of a key matched.
bool SameSecret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The client's X-Request-Id, else a fresh one.
std::string RequestIdOf(const HttpRequest& request) {
  const std::string* id = request.Header(kRequestIdHeader);
  return id != nullptr ? *id : NewRequestId("req");
}

bool NeedsKey(std::string_view path) { return path == "/v1" || path.starts_with("/v1/"); }

}  // namespace

bool ApiGateway::Authorized(const HttpRequest& request) const {
  if (options_.api_key.empty() || !NeedsKey(request.path)) return true;
  const std::string* auth = request.Header("Authorization");
  if (auth == nullptr) return false;
  constexpr std::string_view kBearer = "Bearer ";
  std::string_view given(*auth);
  if (given.size() < kBearer.size() ||
      !std::equal(kBearer.begin(), kBearer.end(), given.begin(), [](char x, char y) {
        return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
      })) {
    return false;
  }
  given.remove_prefix(kBearer.size());
  return SameSecret(given, options_.api_key);
}

std::string ApiGateway::AllowedOrigin(const HttpRequest& request) const {
  const std::string* origin = request.Header("Origin");
  if (origin == nullptr) return {};
  for (const std::string& allowed : options_.allowed_origins) {
    if (allowed == "*") return "*";
    if (allowed == *origin) return allowed;
  }
  return {};
}

void ApiGateway::AddCommonHeaders(const HttpRequest& request, const std::string& request_id,
                                  HttpResponse* response) const {
  response->headers.push_back({std::string(kRequestIdHeader), request_id});
  const std::string origin = AllowedOrigin(request);
  if (!origin.empty()) {
    response->headers.push_back({"Access-Control-Allow-Origin", origin});
    if (origin != "*") response->headers.push_back({"Vary", "Origin"});
  }
}

HttpResponse ApiGateway::Preflight(const HttpRequest& request) const {
  HttpResponse r;
  r.status = 200;
  r.content_type = "text/plain";
  r.body = "OK";
  AddCommonHeaders(request, RequestIdOf(request), &r);
  if (!AllowedOrigin(request).empty()) {
    r.headers.push_back({"Access-Control-Allow-Methods", "GET, POST, OPTIONS"});
    // vLLM allows every header; echo what the browser asks for (or a sensible default).
    const std::string* asked = request.Header("Access-Control-Request-Headers");
    r.headers.push_back({"Access-Control-Allow-Headers", asked != nullptr ? *asked : "Authorization, Content-Type"});
    r.headers.push_back({"Access-Control-Max-Age", "600"});
  }
  return r;
}

HttpHandler ApiGateway::Wrap(HttpHandler inner) const {
  return [this, inner = std::move(inner)](const HttpRequest& request) {
    const auto start = std::chrono::steady_clock::now();
    HttpResponse r = Authorized(request)
                         ? inner(request)
                         : ErrorResponse({ApiErrorKind::kUnauthorized,
                                          "Missing or wrong API key: send `Authorization: Bearer <key>` "
                                          "with the key the server was started with (--api-key)",
                                          {}, {}});
    const std::string request_id = RequestIdOf(request);
    AddCommonHeaders(request, request_id, &r);
    if (options_.log_requests && LogEnabled(LogLevel::kInfo)) {
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
      Log(LogLevel::kInfo, "%s %s %d %.1f ms%s request_id=%s", request.method.c_str(), request.path.c_str(),
          r.status, ms, r.stream ? " (streaming)" : "", request_id.c_str());
    }
    return r;
  };
}

}  // namespace kimirt
