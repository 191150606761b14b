// Server: the OpenAI-compatible HTTP front end of one Engine.
//
//   GET  /v1/models             the served model (ServerOptions::served_model_name)
//   POST /v1/completions        completions_handler.h
//   POST /v1/chat/completions   chat_handler.h
//   GET  /health                200 {"status":"ok"}; 503 once shutdown began
//   GET  /metrics               Prometheus text (metrics.h)
// Every error is OpenAI error JSON with its status (errors.h); a handler that throws becomes a
// 500, never a crash.
//
// Lifecycle, for the CLI:
//   auto server = Server::Create(options, engine, tokenizer, family);  // engine, tokenizer outlive it
//   server->Start();                 // listens on a background thread; port() is the bound port
//   ... SIGTERM/SIGINT ...
//   server->Stop(grace);             // new requests → 503; in-flight ones get `grace` to finish,
//                                    // then are aborted; returns when every HTTP thread is done
//   engine->Shutdown(/*drain=*/true);
//
// Thread safety: Create/Start/Stop from one thread; handlers run on the HTTP pool threads.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kimirt/core/status.h"
#include "kimirt/model/config.h"

namespace kimirt {

class Engine;
class Tokenizer;

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                   // 0: an ephemeral port (tests); see Server::port()
  std::string served_model_name;     // "" → "kimirt-builtin"; see DefaultServedModelName
  int64_t max_model_len = 0;         // 0: the engine's options().max_model_len
  size_t max_body_bytes = 8u << 20;  // larger request bodies get 413
  int http_threads = 64;             // handler threads started up front; more start on demand
  int32_t max_logprobs = 20;         // top logprobs per token a request may ask for
};

// The name `--served-model-name` defaults to: the model directory's last path component, or
// "kimirt-builtin" when there is none (the built-in model).
std::string DefaultServedModelName(std::string_view model_dir);

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                                                ModelFamily family);
  ~Server();  // Stop(0)
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds host:port and serves on a background thread. Errors: the address cannot be bound.
  Status Start();
  int port() const;
  // Accepting connections. False after Stop, or when the accept loop died on a socket error: the
  // CLI's wait loop can then exit non-zero instead of idling behind a dead listener.
  bool serving() const;
  // Graceful: refuses new requests (503) at once, waits up to `grace` for in-flight requests,
  // aborts the engine requests still running, closes the listener and joins the HTTP threads.
  // Idempotent.
  void Stop(std::chrono::milliseconds grace = std::chrono::seconds(30));
  bool stopping() const;

  const ServerOptions& options() const;

 private:
  struct Impl;
  explicit Server(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimirt
