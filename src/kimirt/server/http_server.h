// HttpServer: the HTTP/1.1 transport, with Boost.Beast/Asio sealed inside http_server.cpp behind a
// pimpl (style-examples.md, after llama.cpp's server-http.h), so no other file includes Boost.
//
// A handler maps a plain HttpRequest to an HttpResponse and must not throw; if one does anyway,
// the exception becomes a 500 built by the error-body callback (the process never dies of it).
// A streamed body is an HttpStream the transport pulls from on the handler's thread.
//
// No client can starve another (issue 11; docs/server.md, "Transport"): one I/O thread serves
// every connection event-driven, so an idle or slow connection holds no thread, and deadlines
// (HttpServerOptions) drop clients that trickle their headers or body. Requests are read whole
// (Content-Length or chunked, both under max_body_bytes) before a handler runs; pipelined
// requests on a keep-alive connection are answered in order.
//
// Threads: each request being handled holds one handler thread (a pool that starts with
// `threads` and grows on demand up to `max_active_requests`), so a handler may block (e.g.
// waiting for a non-streamed generation) and a stream holds its thread until it ends, while
// /health beside them gets a thread of its own. Route() must be called before Start();
// Start/Stop/port from one owner thread.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

// An HTTP header as received or to send. Names compare case-insensitively (RFC 9110 §5.1).
struct HttpHeader {
  std::string name;
  std::string value;
};

struct HttpRequest {
  std::string method;  // "GET", "POST"
  std::string path;    // without the query string
  std::string query;   // what follows '?' in the target, without it ("" when none)
  std::string body;
  std::vector<HttpHeader> headers;
  // The first header named `name` (any case), or nullptr.
  const std::string* Header(std::string_view name) const;
  // True once the client has hung up (its socket read EOF or failed; a client that only shut
  // down its sending side counts, as in vLLM) or the server is stopping. The transport watches
  // the socket while the handler runs, so this is one atomic load. For handlers that work a long
  // time before answering. Empty in tests that build requests by hand: treat as "still there".
  std::function<bool()> client_gone;
};

// A response body produced piece by piece (server-sent events).
class HttpStream {
 public:
  enum class Poll : uint8_t {
    kData,  // `out` holds bytes to send; call again
    kIdle,  // nothing yet within `wait`; the transport checks the client is still there
    kEnd,   // the body is complete (`out` may hold a last piece)
  };
  virtual ~HttpStream() = default;
  virtual Poll Next(std::string* out, std::chrono::milliseconds wait) = 0;
  // Called exactly once, when the transport is done with the stream: `complete` is false when
  // the client went away or a write failed before kEnd (cancel the work behind the stream).
  virtual void Close(bool complete) = 0;
};

struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;                     // ignored when `stream` is set
  std::vector<HttpHeader> headers;      // extra headers (Content-Type comes from content_type)
  std::shared_ptr<HttpStream> stream;   // chunked transfer; status and headers go out first
};

using HttpHandler = std::function<HttpResponse(const HttpRequest&)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                           // 0: an ephemeral port, see port()
  size_t max_body_bytes = 8u << 20;       // larger bodies get 413 before a handler runs, chunked or not
  size_t max_header_bytes = 64u << 10;    // a larger request line + headers gets 431
  int threads = 64;                       // handler threads started up front (see "Threads" above)
  int max_active_requests = 4096;         // handlers running at once; more wait for a thread
  int max_connections = 10000;            // open connections; more are closed on accept
  // Deadlines; a client that misses one is disconnected (it never holds a thread meanwhile).
  std::chrono::milliseconds idle_timeout{30000};    // waiting for a request's first byte (keep-alive)
  std::chrono::milliseconds header_timeout{10000};  // first byte to the end of the headers (slowloris)
  std::chrono::milliseconds body_timeout{30000};    // end of the headers to the end of the body
  std::chrono::milliseconds write_timeout{30000};   // one write to a client that stopped reading
  std::chrono::milliseconds stream_poll{50};        // how often an idle stream checks its client
};

class HttpServer {
 public:
  // Builds the body of responses the transport makes itself: 404 (no route), 405 (route exists
  // for another method), 413 (body too large), 431 (headers too large), 411 (a POST without
  // Content-Length or chunked body), 400 (unparseable HTTP), and 500 for a handler that threw
  // (`detail` = what()). Must not throw.
  using ErrorBodyFn = std::function<HttpResponse(int status, std::string_view detail)>;
  // Called once per answered request (streams: after they ended), from the I/O thread, for
  // metrics; also for requests the transport refused (the request has what was parsed of it).
  // Must be quick and must not throw.
  using ResponseObserver = std::function<void(const HttpRequest&, int status)>;

  HttpServer(HttpServerOptions options, ErrorBodyFn error_body, ResponseObserver observer = nullptr);
  ~HttpServer();  // Stop()s
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void Route(std::string_view method, std::string path, HttpHandler handler);

  // Binds host:port (listen backlog SOMAXCONN), then serves on a background thread. Errors: the
  // address cannot be bound. Process-wide: sets SIGPIPE to ignored (a client closing its socket
  // mid-stream must be a failed write, never the death of the process) and raises the soft
  // descriptor limit toward the hard one (each connection is a descriptor).
  Status Start();
  int port() const;  // the bound port (the ephemeral one when options.port was 0); 0 before Start
  // Started and still serving (false after Stop, or if the I/O thread ended).
  bool serving() const;
  // Closes the listener and ends open connections (handlers see client_gone; streams stop at
  // their next piece); returns when the I/O thread and every handler thread have exited, so the
  // handlers must return (the Server aborts their generations first). Idempotent.
  void Stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kimirt
