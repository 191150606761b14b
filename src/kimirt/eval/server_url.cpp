#include "kimirt/eval/server_url.h"

#include <cerrno>
#include <cstdlib>

namespace kimirt::eval {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

Status Bad(std::string_view url, std::string_view why) {
  return InvalidArgument("--url \"" + std::string(url) + "\": " + std::string(why) +
                         " (expected http://host:port or http://host:port/v1)");
}

}  // namespace

std::string ServerUrl::Origin() const {
  const bool v6 = host.find(':') != std::string::npos;
  return scheme + "://" + (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string ServerUrl::ApiPath(std::string_view endpoint) const {
  return api_path + "/" + std::string(endpoint);
}

std::string ServerUrl::ApiUrl(std::string_view endpoint) const { return Origin() + ApiPath(endpoint); }

std::string ServerUrl::RootPath(std::string_view path) const { return root_path + std::string(path); }

std::string EndpointPathFor(std::string_view endpoint_flag) {
  return endpoint_flag == "chat" ? "chat/completions" : "completions";
}

Result<ServerUrl> ParseServerUrl(std::string_view url) {
  ServerUrl u;
  std::string_view rest = url;
  if (rest.empty()) return Bad(url, "empty URL");
  const size_t sep = rest.find("://");
  if (sep != std::string_view::npos) {
    u.scheme = std::string(rest.substr(0, sep));
    rest.remove_prefix(sep + 3);
  }
  if (u.scheme != "http" && u.scheme != "https") return Bad(url, "the scheme must be http or https");
  u.port = u.scheme == "https" ? 443 : 80;

  const size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  std::string_view path = slash == std::string_view::npos ? std::string_view() : rest.substr(slash);
  if (authority.find('@') != std::string_view::npos) return Bad(url, "credentials in the URL are not supported");
  std::string_view port_text;
  if (!authority.empty() && authority[0] == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return Bad(url, "unclosed '[' in the host");
    u.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') return Bad(url, "unexpected text after the host");
      port_text = after.substr(1);
    }
  } else {
    const size_t colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (u.host.empty()) return Bad(url, "no host");
  if (!port_text.empty()) {
    errno = 0;
    char* end = nullptr;
    const std::string p(port_text);
    const long v = std::strtol(p.c_str(), &end, 10);
    if (end != p.c_str() + p.size() || errno != 0 || v < 1 || v > 65535) return Bad(url, "bad port \"" + p + "\"");
    u.port = static_cast<int>(v);
  }
  if (path.find_first_of("?#") != std::string_view::npos) return Bad(url, "query strings are not supported");

  std::string p(path);
  while (!p.empty() && p.back() == '/') p.pop_back();
  // lm-eval and vLLM take full endpoint URLs; accept them for copy-and-paste convenience.
  for (std::string_view endpoint : {"/chat/completions", "/completions"}) {
    if (EndsWith(p, endpoint)) {
      p.resize(p.size() - endpoint.size());
      break;
    }
  }
  if (p.empty()) p = "/v1";
  if (!EndsWith(p, "/v1")) return Bad(url, "the path must be empty or end in /v1");
  u.api_path = p;
  u.root_path = p.substr(0, p.size() - 3);
  return u;
}

}  // namespace kimirt::eval
