// The --url of `kimirt eval` and `kimirt bench`: a server's base URL as users write it,
// "http://host:port" or "http://host:port/v1" (a trailing '/' and a full endpoint URL such as
// lm-eval's base_url=http://host:port/v1/completions are accepted too).
#pragma once

#include <string>
#include <string_view>

#include "kimirt/core/status.h"

namespace kimirt::eval {

struct ServerUrl {
  std::string scheme = "http";  // http or https
  std::string host;             // without brackets for IPv6 literals
  int port = 80;
  std::string api_path = "/v1";  // where /completions, /chat/completions and /models live
  std::string root_path;         // api_path without its trailing "/v1": /metrics lives here

  // "http://host:port" (IPv6 hosts bracketed).
  std::string Origin() const;
  // The full URL of an API endpoint ("completions" → "http://host:port/v1/completions"), for
  // messages; `ApiPath` is the request path alone.
  std::string ApiUrl(std::string_view endpoint) const;
  std::string ApiPath(std::string_view endpoint) const;
  std::string RootPath(std::string_view path) const;  // "/metrics" → root_path + "/metrics"
};

Result<ServerUrl> ParseServerUrl(std::string_view url);

// The API endpoint of an --endpoint value: "chat" → "chat/completions", else "completions".
std::string EndpointPathFor(std::string_view endpoint_flag);

}  // namespace kimirt::eval
