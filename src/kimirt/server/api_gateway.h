// ApiGateway: what every route does around its handler, as vLLM's API server does it —
//   - API key: with --api-key (or $KIMIRT_API_KEY / $VLLM_API_KEY) set, requests to /v1/*
//     must carry `Authorization: Bearer KEY`, else 401 (OpenAI's invalid_api_key). /health,
//     /metrics, /version, /tokenize and /detokenize stay open, as in vLLM.
//   - X-Request-Id: the request's own header is echoed; without one a fresh id is sent.
//   - CORS (--allowed-origins, default "*" like vLLM's): Access-Control-Allow-Origin on every
//     answer to a request with an allowed Origin, and OPTIONS preflights answered 200 with the
//     allowed methods and headers (Preflight, routed by the Server for every path).
//   - one log line per request (off with --disable-log-requests): method, path, status, time.
//
// Thread safety: const after construction; Wrap's handlers run on any HTTP thread.
#pragma once

#include <string>
#include <utility>
#include <string_view>
#include <vector>

#include "kimirt/server/http_server.h"

namespace kimirt {

struct GatewayOptions {
  std::string api_key;                               // "" → no key needed
  std::vector<std::string> allowed_origins = {"*"};  // exact origins or "*"; empty: no CORS
  bool log_requests = true;
};

class ApiGateway {
 public:
  explicit ApiGateway(GatewayOptions options) : options_(std::move(options)) {}

  HttpHandler Wrap(HttpHandler inner) const;
  // The answer to `OPTIONS path` (a CORS preflight).
  HttpResponse Preflight(const HttpRequest& request) const;

  // True when `request` may reach `path` (the key matches, or none is needed there).
  bool Authorized(const HttpRequest& request) const;

 private:
  // The Access-Control-Allow-Origin value for the request's Origin, or "" when not allowed.
  std::string AllowedOrigin(const HttpRequest& request) const;
  void AddCommonHeaders(const HttpRequest& request, const std::string& request_id, HttpResponse* response) const;

  GatewayOptions options_;
};

}  // namespace kimirt
