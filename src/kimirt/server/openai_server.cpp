// Server: routes, /v1/models, /health, /metrics and the lifecycle (openai_server.h).
#include "kimirt/server/openai_server.h"

#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "kimirt/engine/engine.h"
#include "kimirt/server/chat_handler.h"
#include "kimirt/server/completions_handler.h"
#include "kimirt/server/generation_job.h"
#include "kimirt/server/http_server.h"
#include "kimirt/server/metrics.h"
#include "kimirt/server/serving_context.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

constexpr const char* kModels = "/v1/models";
constexpr const char* kCompletions = "/v1/completions";
constexpr const char* kChat = "/v1/chat/completions";
constexpr const char* kHealth = "/health";
constexpr const char* kMetrics = "/metrics";

HttpResponse TransportError(int status, std::string_view detail) {
  ApiError e;
  switch (status) {
    case 404:
      e = {ApiErrorKind::kNotFound, "No such endpoint. Try /v1/completions, /v1/chat/completions or /v1/models", {}, {}};
      break;
    case 405: e = {ApiErrorKind::kMethodNotAllowed, "This endpoint does not take that method", {}, {}}; break;
    case 413: e = {ApiErrorKind::kPayloadTooLarge, "The request body is too large", {}, {}}; break;
    case 500: e = {ApiErrorKind::kInternal, "Internal error: " + std::string(detail), {}, {}}; break;
    default: e = InvalidRequest("Malformed HTTP request (status " + std::to_string(status) + ")"); break;
  }
  HttpResponse r = ErrorResponse(e);
  if (status != 500 && status != 404 && status != 405 && status != 413) r.status = status;
  return r;
}

}  // namespace

std::string DefaultServedModelName(std::string_view model_dir) {
  while (!model_dir.empty() && model_dir.back() == '/') model_dir.remove_suffix(1);
  const size_t slash = model_dir.rfind('/');
  std::string_view base = slash == std::string_view::npos ? model_dir : model_dir.substr(slash + 1);
  return base.empty() || base == "." || base == ".." ? std::string("kimirt-builtin") : std::string(base);
}

struct Server::Impl {
  ServerOptions options;
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ServerMetrics metrics;
  JobRegistry jobs;
  std::atomic<bool> stopping{false};
  ServingContext ctx;
  std::unique_ptr<HttpServer> http;
  int64_t created = 0;
  bool stopped = false;

  HttpResponse Models() const {
    Json model = Json::object();
    model["id"] = options.served_model_name;
    model["object"] = "model";
    model["created"] = created;
    model["owned_by"] = "kimirt";
    model["root"] = options.served_model_name;
    model["max_model_len"] = ctx.max_model_len > 0 ? Json(ctx.max_model_len) : Json(nullptr);
    Json body = Json::object();
    body["object"] = "list";
    body["data"] = Json::array({std::move(model)});
    return JsonResponse(body);
  }

  HttpResponse Health() const {
    if (stopping) return ErrorResponse({ApiErrorKind::kShuttingDown, "The server is shutting down", {}, {}});
    return JsonResponse(Json{{"status", "ok"}});
  }

  HttpResponse Metrics() const {
    HttpResponse r;
    r.content_type = std::string(kPrometheusContentType);
    r.body = metrics.Render(engine->Stats());
    return r;
  }
};

Server::Server(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Server::~Server() { Stop(std::chrono::milliseconds(0)); }

Result<std::unique_ptr<Server>> Server::Create(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                                               ModelFamily family) {
  if (options.served_model_name.empty()) options.served_model_name = "kimirt-builtin";
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("--port must be in [0, 65535], got " + std::to_string(options.port));
  }
  if (options.max_body_bytes == 0) return InvalidArgument("max_body_bytes must be positive");
  auto impl = std::make_unique<Impl>();
  Impl* s = impl.get();
  s->options = std::move(options);
  s->engine = &engine;
  s->tokenizer = &tokenizer;
  s->created = UnixSeconds();

  ServingContext& ctx = s->ctx;
  ctx.engine = &engine;
  ctx.tokenizer = &tokenizer;
  ctx.family = family;
  ctx.metrics = &s->metrics;
  ctx.jobs = &s->jobs;
  ctx.limits.served_model_name = s->options.served_model_name;
  ctx.limits.vocab_size = tokenizer.vocab_size();
  ctx.limits.max_logprobs = s->options.max_logprobs;
  ctx.max_model_len = s->options.max_model_len > 0 ? s->options.max_model_len : engine.options().max_model_len;
  ctx.shutting_down = &s->stopping;

  HttpServerOptions http;
  http.host = s->options.host;
  http.port = s->options.port;
  http.max_body_bytes = s->options.max_body_bytes;
  http.threads = s->options.http_threads;
  s->http = std::make_unique<HttpServer>(http, TransportError, [s](const HttpRequest& req, int status) {
    s->metrics.CountRequest(req.path, status);
  });
  s->metrics.SetKnownEndpoints({kModels, kCompletions, kChat, kHealth, kMetrics});
  s->http->Route("GET", kModels, [s](const HttpRequest&) { return s->Models(); });
  s->http->Route("GET", kHealth, [s](const HttpRequest&) { return s->Health(); });
  s->http->Route("GET", kMetrics, [s](const HttpRequest&) { return s->Metrics(); });
  s->http->Route("POST", kCompletions, [s](const HttpRequest& r) { return HandleCompletions(s->ctx, r); });
  s->http->Route("POST", kChat, [s](const HttpRequest& r) { return HandleChatCompletions(s->ctx, r); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::Start() { return impl_->http->Start(); }

int Server::port() const { return impl_->http->port(); }

bool Server::serving() const { return impl_->http->serving(); }

bool Server::stopping() const { return impl_->stopping; }

const ServerOptions& Server::options() const { return impl_->options; }

void Server::Stop(std::chrono::milliseconds grace) {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->stopping = true;
  const auto deadline = std::chrono::steady_clock::now() + grace;
  while (impl_->jobs.size() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // What is left ends with kAbort events: streams send a 503 error event and [DONE], waiting
  // non-streamed requests answer 503.
  impl_->jobs.AbortAll();
  const auto drain_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (impl_->jobs.size() > 0 && std::chrono::steady_clock::now() < drain_deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  impl_->http->Stop();
}

}  // namespace kimirt
