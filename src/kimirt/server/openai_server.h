// Server: the OpenAI-compatible HTTP front end of one Engine, a drop-in for vLLM's.
//
//   GET  /v1/models             the served model (ServerOptions::served_model_name)
//   POST /v1/completions        completions_handler.h
//   POST /v1/chat/completions   chat_handler.h
//   POST /tokenize, /detokenize tokenize_handler.h
//   GET  /version               {"version": …}
//   GET  /health                200 {"status":"ok"}; 503 once shutdown began
//   GET  /metrics               Prometheus text under vLLM's names (metrics.h)
//   OPTIONS <any of these>      CORS preflight
// Around every route (api_gateway.h): the API key on /v1/*, X-Request-Id, CORS headers and a
// log line per request. Every error is OpenAI error JSON with its status (errors.h); a handler
// that throws becomes a 500, never a crash. While requests run, a stats line (throughput,
// running/waiting, cache use) is logged every ServerOptions::stats_interval.
//
// Lifecycle, for the CLI:
//   auto server = Server::Create(options, engine, tokenizer, format);  // engine, tokenizer outlive it
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
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/server/chat_format.h"

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
  // The model's vocabulary when smaller than the tokenizer's (ids the tokenizer knows but the
  // model does not are refused at the edge, naming the field); 0: the tokenizer's.
  int32_t model_vocab_size = 0;
  std::string api_key;                               // non-empty: /v1/* need `Authorization: Bearer KEY`
  std::vector<std::string> allowed_origins = {"*"};  // CORS: exact origins or "*"; empty: none
  std::optional<uint64_t> seed;      // base of unseeded requests' seeds; unset: random (RequestSeeds)
  bool log_requests = true;          // a log line per request
  std::chrono::milliseconds stats_interval{10000};  // the periodic stats line; 0: none
  std::string default_chat_template_kwargs;  // a JSON object merged under each chat request's; "": none
};

// The name `--served-model-name` defaults to: the model directory's last path component, or
// "kimirt-builtin" when there is none (the built-in model).
std::string DefaultServedModelName(std::string_view model_dir);

class Server {
 public:
  static Result<std::unique_ptr<Server>> Create(ServerOptions options, Engine& engine, const Tokenizer& tokenizer,
                                                ChatFormat format);
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
