// Server: routes, /v1/models, /health, /metrics and the lifecycle (openai_server.h).
#include "kimirt/server/openai_server.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <utility>

#include <nlohmann/json.hpp>

#include "kimirt/engine/engine.h"
#include "kimirt/server/api_gateway.h"
#include "kimirt/server/chat_handler.h"
#include "kimirt/server/completions_handler.h"
#include "kimirt/server/generation_job.h"
#include "kimirt/server/http_server.h"
#include "kimirt/server/log.h"
#include "kimirt/server/metrics.h"
#include "kimirt/server/serving_context.h"
#include "kimirt/server/tokenize_handler.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

constexpr const char* kModels = "/v1/models";
constexpr const char* kCompletions = "/v1/completions";
constexpr const char* kChat = "/v1/chat/completions";
constexpr const char* kHealth = "/health";
constexpr const char* kMetrics = "/metrics";
constexpr const char* kTokenize = "/tokenize";
constexpr const char* kDetokenize = "/detokenize";
constexpr const char* kVersion = "/version";

HttpResponse TransportError(int status, std::string_view detail) {
  ApiError e;
  switch (status) {
    case 404:
      e = {ApiErrorKind::kNotFound, "No such endpoint. Try /v1/completions, /v1/chat/completions or /v1/models",
           {}, {}};
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

// vLLM's periodic "Avg prompt throughput …" line, from the engine's running totals.
class StatsLogger {
 public:
  StatsLogger(const Engine& engine, std::chrono::milliseconds interval) : engine_(engine), interval_(interval) {}
  ~StatsLogger() { Stop(); }

  void Start() {
    if (interval_.count() <= 0) return;
    thread_ = std::thread([this] { Loop(); });
  }
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Loop() {
    EngineStats last = engine_.Stats();
    auto last_at = std::chrono::steady_clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, interval_, [this] { return stop_; })) {
      const EngineStats now = engine_.Stats();
      const auto now_at = std::chrono::steady_clock::now();
      const double s = std::chrono::duration<double>(now_at - last_at).count();
      // Quiet while idle, like vLLM: a line only when something ran since the last one.
      const bool active = now.running > 0 || now.waiting > 0 || now.prompt_tokens != last.prompt_tokens ||
                          now.generation_tokens != last.generation_tokens;
      if (active && s > 0) {
        const double cache = now.kv_blocks_total > 0 ? 100.0 * static_cast<double>(now.kv_blocks_used) /
                                                           static_cast<double>(now.kv_blocks_total)
                                                     : 0.0;
        Log(LogLevel::kInfo,
            "Avg prompt throughput: %.1f tokens/s, Avg generation throughput: %.1f tokens/s, Running: %lld reqs, "
            "Waiting: %lld reqs, KV cache usage: %.1f%%, State slots: %lld/%lld",
            static_cast<double>(now.prompt_tokens - last.prompt_tokens) / s,
            static_cast<double>(now.generation_tokens - last.generation_tokens) / s,
            static_cast<long long>(now.running), static_cast<long long>(now.waiting), cache,
            static_cast<long long>(now.state_slots_used), static_cast<long long>(now.state_slots_total));
      }
      last = now;
      last_at = now_at;
    }
  }

  const Engine& engine_;
  std::chrono::milliseconds interval_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct Server::Impl {
  ServerOptions options;
  Engine* engine = nullptr;
  const Tokenizer* tokenizer = nullptr;
  ServerMetrics metrics;
  JobRegistry jobs;
  std::atomic<bool> stopping{false};
  ServingContext ctx;
  std::unique_ptr<HttpServer> http;
  std::unique_ptr<ApiGateway> gateway;
  std::unique_ptr<RequestSeeds> seeds;
  std::unique_ptr<StatsLogger> stats;
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
    // A failed model (a process rank died) cannot answer anything: 503, naming the rank.
    if (Status h = engine->Health(); !h.ok()) {
      return ErrorResponse({ApiErrorKind::kShuttingDown, "The model cannot run: " + h.message(), {}, "engine_dead"});
    }
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
                                               ChatFormat format) {
  if (options.served_model_name.empty()) options.served_model_name = "kimirt-builtin";
  if (options.port < 0 || options.port > 65535) {
    return InvalidArgument("--port must be in [0, 65535], got " + std::to_string(options.port));
  }
  if (options.max_body_bytes == 0) return InvalidArgument("max_body_bytes must be positive");
  Json chat_kwargs = Json::object();
  if (!options.default_chat_template_kwargs.empty()) {
    chat_kwargs = Json::parse(options.default_chat_template_kwargs, nullptr, /*allow_exceptions=*/false);
    if (!chat_kwargs.is_object()) {
      return InvalidArgument("--default-chat-template-kwargs must be a JSON object, e.g. '{\"thinking\": false}'; got " +
                             options.default_chat_template_kwargs);
    }
  }
  auto impl = std::make_unique<Impl>();
  Impl* s = impl.get();
  s->options = std::move(options);
  s->engine = &engine;
  s->tokenizer = &tokenizer;
  s->created = UnixSeconds();
  s->seeds = std::make_unique<RequestSeeds>(s->options.seed);
  s->stats = std::make_unique<StatsLogger>(engine, s->options.stats_interval);
  s->gateway = std::make_unique<ApiGateway>(
      GatewayOptions{s->options.api_key, s->options.allowed_origins, s->options.log_requests});
  s->metrics.SetModelName(s->options.served_model_name);

  ServingContext& ctx = s->ctx;
  ctx.engine = &engine;
  ctx.tokenizer = &tokenizer;
  ctx.format = format;
  ctx.seeds = s->seeds.get();
  ctx.default_chat_template_kwargs = std::move(chat_kwargs);
  ctx.metrics = &s->metrics;
  ctx.jobs = &s->jobs;
  ctx.limits.served_model_name = s->options.served_model_name;
  ctx.limits.vocab_size = s->options.model_vocab_size > 0
                              ? std::min(tokenizer.vocab_size(), s->options.model_vocab_size)
                              : tokenizer.vocab_size();
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
  s->metrics.SetKnownEndpoints({kModels, kCompletions, kChat, kHealth, kMetrics, kTokenize, kDetokenize, kVersion});
  const ApiGateway* gw = s->gateway.get();
  auto route = [s, gw](const char* method, const char* path, HttpHandler handler) {
    s->http->Route(method, path, gw->Wrap(std::move(handler)));
    s->http->Route("OPTIONS", path, [gw](const HttpRequest& r) { return gw->Preflight(r); });
  };
  route("GET", kModels, [s](const HttpRequest&) { return s->Models(); });
  route("GET", kHealth, [s](const HttpRequest&) { return s->Health(); });
  route("GET", kMetrics, [s](const HttpRequest&) { return s->Metrics(); });
  route("GET", kVersion, [](const HttpRequest&) { return HandleVersion(); });
  route("POST", kCompletions, [s](const HttpRequest& r) { return HandleCompletions(s->ctx, r); });
  route("POST", kChat, [s](const HttpRequest& r) { return HandleChatCompletions(s->ctx, r); });
  route("POST", kTokenize, [s](const HttpRequest& r) { return HandleTokenize(s->ctx, r); });
  route("POST", kDetokenize, [s](const HttpRequest& r) { return HandleDetokenize(s->ctx, r); });
  return std::unique_ptr<Server>(new Server(std::move(impl)));
}

Status Server::Start() {
  KIMIRT_RETURN_IF_ERROR(impl_->http->Start());
  impl_->stats->Start();
  return Status::Ok();
}

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
  impl_->stats->Stop();
}

}  // namespace kimirt
