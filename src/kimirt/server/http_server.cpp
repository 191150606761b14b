// The Boost.Beast/Asio side of HttpServer (http_server.h). The only file that includes Boost.
//
// One I/O thread runs every socket, event-driven: waiting for a request, reading its header and
// body (Beast's parser, which enforces the header and body limits for chunked bodies too), and
// writing responses. Handlers run on the HandlerPool. While a handler runs, the I/O thread keeps
// watching its connection: bytes that arrive are buffered (pipelined requests, answered in order
// afterwards) and EOF or an error marks the exchange gone, which is what
// HttpRequest::client_gone reports. A stream's pieces are written by the I/O thread; the handler
// thread waits for each write, so a client that stops reading slows only its own stream.
#include "kimirt/server/http_server.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_set>
#include <utility>

#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include "kimirt/server/handler_pool.h"

namespace kimirt {
namespace {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using boost::system::error_code;

// While a handler runs, at most this much of the next pipelined requests is buffered; past it the
// connection is no longer read (TCP flow control holds the client) until the response is out.
constexpr size_t kWatchBufferLimit = 1u << 20;
// After a response that ends the connection, unread request bytes are drained for this long
// before closing: closing with unread data sends a RST, which can destroy the response (a 413
// for a body still arriving) before the client reads it.
constexpr auto kLingerTime = std::chrono::seconds(2);

bool IEquals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) == std::tolower(static_cast<unsigned char>(y));
         });
}

// Header values come from handlers (some echo client input, e.g. a request id): a CR or LF would
// let them write headers of their own, so those bytes are dropped.
void AppendHeader(std::string* out, std::string_view name, std::string_view value) {
  for (std::string_view part : {name, std::string_view(": "), value}) {
    for (char c : part) {
      if (c != '\r' && c != '\n') *out += c;
    }
  }
  *out += "\r\n";
}

struct ResponseHead {
  bool keep_alive = true;
  bool chunked = false;  // a stream to an HTTP/1.1 client
  bool head_only = false;  // HEAD: headers without the body
};

// The status line and headers. The transport owns the framing headers (Content-Length,
// Transfer-Encoding, Connection): a handler's own are dropped.
std::string SerializeHead(const HttpResponse& r, const ResponseHead& how) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " ";
  const std::string_view reason = http::obsolete_reason(static_cast<http::status>(r.status));
  out += reason == "<unknown-status>" ? std::string_view("Unknown") : reason;
  out += "\r\n";
  AppendHeader(&out, "Content-Type", r.content_type);
  bool cache_control = false;
  for (const HttpHeader& h : r.headers) {
    if (IEquals(h.name, "Content-Length") || IEquals(h.name, "Transfer-Encoding") || IEquals(h.name, "Connection") ||
        IEquals(h.name, "Content-Type")) {
      continue;
    }
    cache_control = cache_control || IEquals(h.name, "Cache-Control");
    AppendHeader(&out, h.name, h.value);
  }
  if (r.stream) {
    if (!cache_control) AppendHeader(&out, "Cache-Control", "no-cache");
    if (how.chunked) AppendHeader(&out, "Transfer-Encoding", "chunked");
  } else {
    AppendHeader(&out, "Content-Length", std::to_string(r.body.size()));
  }
  AppendHeader(&out, "Connection", how.keep_alive ? "keep-alive" : "close");
  out += "\r\n";
  return out;
}

std::string Chunk(std::string_view data) {
  char size[20];
  std::snprintf(size, sizeof(size), "%zx\r\n", data.size());
  std::string out = size;
  out += data;
  out += "\r\n";
  return out;
}

// What a connection and the handler thread serving its current request share.
struct Exchange {
  std::atomic<bool> gone{false};  // the client hung up (EOF or error), or the connection closed
  std::mutex mu;
  std::condition_variable cv;
  bool closed = false;       // the connection closed: no write will complete
  bool write_done = false;
  bool write_ok = false;

  void MarkGone(bool connection_closed) {
    gone = true;
    std::lock_guard<std::mutex> lock(mu);
    closed = closed || connection_closed;
    cv.notify_all();
  }
  void WriteDone(bool ok) {
    std::lock_guard<std::mutex> lock(mu);
    write_done = true;
    write_ok = ok;
    cv.notify_all();
  }
};

}  // namespace

const std::string* HttpRequest::Header(std::string_view name) const {
  for (const HttpHeader& h : headers) {
    if (IEquals(h.name, name)) return &h.value;
  }
  return nullptr;
}

struct HttpServer::Impl {
  class Connection;

  HttpServerOptions options;
  ErrorBodyFn error_body;
  ResponseObserver observer;
  std::map<std::string, std::map<std::string, HttpHandler, std::less<>>, std::less<>> routes;  // path → method

  asio::io_context io{1};
  std::optional<asio::executor_work_guard<asio::io_context::executor_type>> work;
  tcp::acceptor acceptor{io};
  asio::steady_timer accept_retry{io};
  std::unordered_set<std::shared_ptr<Connection>> connections;  // I/O thread only
  std::unique_ptr<HandlerPool> pool;
  std::thread io_thread;
  std::atomic<int> port{0};
  std::atomic<bool> accepting{false};
  std::atomic<bool> stopping{false};
  std::atomic<bool> io_done{false};
  std::mutex stop_mu;
  bool started = false;
  bool stopped = false;

  HttpResponse SafeErrorBody(int status, std::string_view detail) {
    try {
      return error_body(status, detail);
    } catch (...) {
      HttpResponse r;
      r.status = status;
      r.body = R"({"error":{"message":"internal error","type":"server_error","param":null,"code":null}})";
      return r;
    }
  }
  void Observe(const HttpRequest& req, int status) {
    if (!observer) return;
    try {
      observer(req, status);
    } catch (...) {
    }
  }
  void Accept();
};

class HttpServer::Impl::Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(Impl& server, tcp::socket socket)
      : s_(server), socket_(std::move(socket)), read_timer_(s_.io), write_timer_(s_.io) {
    error_code ignored;
    socket_.set_option(tcp::no_delay(true), ignored);  // SSE pieces are small and latency-bound
    socket_.non_blocking(true, ignored);                // Watch() reads without blocking
  }

  void Begin() { WaitForRequest(); }

  // Ends the connection now: pending I/O fails, a handler sees client_gone, a stream's next
  // write fails. Idempotent.
  void Close() {
    if (closed_) return;
    closed_ = true;
    if (exchange_) exchange_->MarkGone(/*connection_closed=*/true);
    ++read_gen_;
    ++write_gen_;
    read_timer_.cancel();
    write_timer_.cancel();
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    s_.connections.erase(shared_from_this());
  }

  // From a handler thread: the non-streamed response, or the end of a stream (`bytes` is its
  // last piece, `complete` false when it failed or the client left). `how.keep_alive` false ends
  // the connection after it.
  void PostFinal(std::shared_ptr<HttpRequest> req, int status, std::string bytes, bool complete, ResponseHead how) {
    asio::post(s_.io, [self = shared_from_this(), req = std::move(req), status, bytes = std::move(bytes), complete,
                       how] {
      self->keep_alive_ = self->keep_alive_ && how.keep_alive;
      self->Finish(*req, status, bytes, complete);
    });
  }
  // From a stream's handler thread: writes `bytes` and waits until they are out (or failed).
  bool WriteAndWait(const std::shared_ptr<Exchange>& ex, std::string bytes) {
    {
      std::lock_guard<std::mutex> lock(ex->mu);
      if (ex->closed) return false;
      ex->write_done = false;
    }
    asio::post(s_.io, [self = shared_from_this(), ex, bytes = std::make_shared<std::string>(std::move(bytes))] {
      if (self->closed_) {
        ex->WriteDone(false);
        return;
      }
      self->Write(bytes, [ex](bool ok) { ex->WriteDone(ok); });
    });
    std::unique_lock<std::mutex> lock(ex->mu);
    ex->cv.wait(lock, [&] { return ex->write_done || ex->closed; });
    return ex->write_done && ex->write_ok;
  }

 private:
  // Arms the read deadline; past it the connection is dropped (the slowloris defence).
  void ReadDeadline(std::chrono::milliseconds d) {
    const uint64_t gen = ++read_gen_;
    read_timer_.expires_after(d);
    read_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (!ec && gen == self->read_gen_) self->Close();
    });
  }
  void CancelReadDeadline() {
    ++read_gen_;
    read_timer_.cancel();
  }

  void WaitForRequest() {
    if (closed_) return;
    if (buffer_.size() > 0) return ReadHeader();  // a pipelined request is already here
    if (peer_eof_) return Linger();
    ReadDeadline(s_.options.idle_timeout);
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      if (self->closed_) return;
      if (ec) return self->Close();
      self->ReadHeader();
    });
  }

  void ReadHeader() {
    parser_.emplace();
    parser_->header_limit(static_cast<uint32_t>(std::min<size_t>(s_.options.max_header_bytes, UINT32_MAX)));
    parser_->body_limit(s_.options.max_body_bytes);
    // The header deadline counts from the request's first byte (WaitForRequest saw it).
    ReadDeadline(s_.options.header_timeout);
    http::async_read_header(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      self->OnHeader(ec);
    });
  }

  void OnHeader(error_code ec) {
    if (closed_) return;
    if (ec) return ReadFailed(ec);
    const auto& req = parser_->get();
    const bool needs_length = req.method() == http::verb::post || req.method() == http::verb::put ||
                              req.method() == http::verb::patch;
    if (needs_length && !parser_->chunked() && !parser_->content_length()) {
      return Refuse(411);  // the body's end could only be the connection's (RFC 9112 §6.3)
    }
    if (parser_->is_done()) return Dispatch();
    ReadDeadline(s_.options.body_timeout);
    const auto expect = req.find(http::field::expect);
    if (expect != req.end() && IEquals(expect->value(), "100-continue") && buffer_.size() == 0) {
      // curl and others wait up to 1 s for this before sending a large body.
      auto interim = std::make_shared<std::string>("HTTP/1.1 100 Continue\r\n\r\n");
      Write(interim, [self = shared_from_this()](bool ok) {
        if (ok) self->ReadBody();
      });
      return;
    }
    ReadBody();
  }

  void ReadBody() {
    http::async_read(socket_, buffer_, *parser_, [self = shared_from_this()](error_code ec, size_t) {
      if (self->closed_) return;
      if (ec) return self->ReadFailed(ec);
      self->Dispatch();
    });
  }

  void ReadFailed(error_code ec) {
    if (ec == http::error::body_limit) return Refuse(413);
    if (ec == http::error::header_limit) return Refuse(431);
    if (ec.category() == error_code(http::error::end_of_stream).category() && ec != http::error::end_of_stream &&
        ec != http::error::partial_message && ec != http::error::need_buffer) {
      return Refuse(400);  // unparseable: bad request line, header or Content-Length, bad chunk
    }
    Close();  // EOF, a reset, or a deadline that closed the socket
  }

  // Answers a request the transport refuses itself, then ends the connection (the rest of what
  // the client sends cannot be framed).
  void Refuse(int status) {
    CancelReadDeadline();
    auto req = std::make_shared<HttpRequest>();
    if (parser_ && parser_->is_header_done()) *req = ToRequest(parser_->get(), "");
    keep_alive_ = false;
    head_only_ = false;
    Respond(std::move(req), s_.SafeErrorBody(status, ""));
  }

  static HttpRequest ToRequest(const http::request<http::string_body>& m, std::string body) {
    HttpRequest r;
    r.method = std::string(m.method_string());
    const std::string_view target = m.target();
    const size_t q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    r.body = std::move(body);
    for (const auto& f : m) r.headers.push_back({std::string(f.name_string()), std::string(f.value())});
    return r;
  }

  void Dispatch() {
    CancelReadDeadline();
    http::request<http::string_body> m = parser_->release();
    parser_.reset();
    keep_alive_ = m.keep_alive();
    http11_ = m.version() >= 11;
    head_only_ = m.method() == http::verb::head;
    auto req = std::make_shared<HttpRequest>(ToRequest(m, std::move(m.body())));
    const auto route = s_.routes.find(req->path);
    if (route == s_.routes.end()) return Respond(std::move(req), s_.SafeErrorBody(404, ""));
    const auto handler = route->second.find(req->method);
    if (handler == route->second.end()) return Respond(std::move(req), s_.SafeErrorBody(405, ""));

    exchange_ = std::make_shared<Exchange>();
    req->client_gone = [ex = std::weak_ptr<Exchange>(exchange_)] {
      auto e = ex.lock();
      return !e || e->gone.load();
    };
    Watch();
    ResponseHead how{keep_alive_, http11_, head_only_};
    s_.pool->Submit([self = shared_from_this(), ex = exchange_, req, how, fn = &handler->second] {
      self->RunHandler(ex, req, how, *fn);
    });
  }

  // On a handler thread.
  void RunHandler(const std::shared_ptr<Exchange>& ex, const std::shared_ptr<HttpRequest>& req, ResponseHead how,
                  const HttpHandler& handler) {
    HttpResponse response;
    try {
      response = handler(*req);
    } catch (const std::exception& e) {
      response = s_.SafeErrorBody(500, e.what());
    } catch (...) {
      response = s_.SafeErrorBody(500, "unknown exception");
    }
    if (!response.stream) {
      std::string bytes = SerializeHead(response, how);
      if (!how.head_only) bytes += response.body;
      return PostFinal(req, response.status, std::move(bytes), true, how);
    }
    if (!how.chunked) how.keep_alive = false;  // HTTP/1.0: the body ends with the connection
    const bool complete = RunStream(ex, *response.stream, SerializeHead(response, how), how);
    PostFinal(req, response.status, complete && how.chunked ? "0\r\n\r\n" : "", complete, how);
  }

  // On a handler thread: pulls the stream and writes it. Returns whether it reached kEnd with
  // every piece written; calls the stream's Close exactly once.
  bool RunStream(const std::shared_ptr<Exchange>& ex, HttpStream& stream, std::string head, ResponseHead how) {
    bool complete = WriteAndWait(ex, std::move(head));
    while (complete && !how.head_only) {
      std::string piece;
      HttpStream::Poll p;
      try {
        p = stream.Next(&piece, s_.options.stream_poll);
      } catch (...) {
        complete = false;
        break;
      }
      if (!piece.empty() && !WriteAndWait(ex, how.chunked ? Chunk(piece) : std::move(piece))) complete = false;
      if (p == HttpStream::Poll::kEnd) break;
      // The client left while nothing was sent (a request still queued in the engine), or since.
      if (ex->gone) complete = false;
    }
    try {
      stream.Close(complete);
    } catch (...) {
      // A stream's cleanup must not take a handler thread down.
    }
    return complete;
  }

  // While a handler runs: reads what the client sends (kept for the next request) to see it
  // hang up at once.
  void Watch() {
    if (closed_ || peer_eof_ || buffer_.size() >= kWatchBufferLimit) return;
    watching_ = true;
    socket_.async_wait(tcp::socket::wait_read, [self = shared_from_this()](error_code ec) {
      Connection& c = *self;
      c.watching_ = false;
      if (c.closed_) return;
      if (ec == asio::error::operation_aborted) {  // cancelled: the response is out
        if (std::exchange(c.resume_after_watch_, false)) c.WaitForRequest();
        return;
      }
      if (!ec) {
        const size_t want = std::max<size_t>(4096, std::min<size_t>(c.socket_.available(ec), kWatchBufferLimit));
        const size_t n = c.socket_.read_some(c.buffer_.prepare(want), ec);
        if (!ec) {
          c.buffer_.commit(n);
          return c.Watch();
        }
        if (ec == asio::error::would_block || ec == asio::error::try_again) return c.Watch();
      }
      c.peer_eof_ = true;  // EOF or a socket error: the client is gone
      if (c.exchange_) c.exchange_->MarkGone(/*connection_closed=*/false);
    });
  }

  // On the I/O thread: the handler is done with this exchange.
  void Finish(const HttpRequest& req, int status, const std::string& bytes, bool complete) {
    exchange_.reset();
    s_.Observe(req, status);
    if (closed_) return;
    if (!complete) return Close();
    auto out = std::make_shared<std::string>(bytes);
    Write(out, [self = shared_from_this()](bool ok) {
      if (ok) self->AfterResponse();
    });
  }

  void Respond(std::shared_ptr<HttpRequest> req, const HttpResponse& r) {
    std::string bytes = SerializeHead(r, ResponseHead{keep_alive_, false, head_only_});
    if (!head_only_) bytes += r.body;
    Finish(*req, r.status, bytes, true);
  }

  void AfterResponse() {
    if (!keep_alive_ || peer_eof_) return Linger();
    if (watching_) {
      resume_after_watch_ = true;
      error_code ignored;
      socket_.cancel(ignored);  // only the watch is pending; its handler reads the next request
      return;
    }
    WaitForRequest();
  }

  // Writes `bytes`, then calls done(ok); a client that does not take them within the write
  // timeout is dropped.
  void Write(std::shared_ptr<std::string> bytes, std::function<void(bool)> done) {
    const uint64_t gen = ++write_gen_;
    write_timer_.expires_after(s_.options.write_timeout);
    write_timer_.async_wait([self = shared_from_this(), gen](error_code ec) {
      if (!ec && gen == self->write_gen_) self->Close();
    });
    asio::async_write(socket_, asio::buffer(*bytes),
                      [self = shared_from_this(), bytes, done = std::move(done)](error_code ec, size_t) {
                        ++self->write_gen_;
                        self->write_timer_.cancel();
                        if (ec || self->closed_) {
                          self->Close();
                          return done(false);
                        }
                        done(true);
                      });
  }

  // Ends the connection gracefully: our side is shut, the client's remaining bytes are read and
  // discarded until it closes too or kLingerTime passes.
  void Linger() {
    error_code ignored;
    if (watching_) socket_.cancel(ignored);  // Drain() reads from here on
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    ReadDeadline(std::chrono::duration_cast<std::chrono::milliseconds>(kLingerTime));
    Drain();
  }
  void Drain() {
    auto scratch = std::make_shared<std::array<char, 16384>>();
    socket_.async_read_some(asio::buffer(*scratch), [self = shared_from_this(), scratch](error_code ec, size_t) {
      if (self->closed_) return;
      if (ec) return self->Close();
      self->Drain();
    });
  }

  Impl& s_;
  tcp::socket socket_;
  asio::steady_timer read_timer_;
  asio::steady_timer write_timer_;
  uint64_t read_gen_ = 0;
  uint64_t write_gen_ = 0;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::shared_ptr<Exchange> exchange_;  // the request a handler is working on
  bool keep_alive_ = true;
  bool http11_ = true;
  bool head_only_ = false;
  bool watching_ = false;
  bool resume_after_watch_ = false;
  bool peer_eof_ = false;
  bool closed_ = false;
};

void HttpServer::Impl::Accept() {
  acceptor.async_accept([this](error_code ec, tcp::socket socket) {
    if (stopping || !acceptor.is_open()) return;
    if (ec) {
      if (ec == asio::error::operation_aborted) return;
      // Out of descriptors (EMFILE) and the like: keep serving the connections there are and
      // try again shortly, instead of spinning or giving up.
      accept_retry.expires_after(std::chrono::milliseconds(100));
      accept_retry.async_wait([this](error_code e) {
        if (!e) Accept();
      });
      return;
    }
    if (connections.size() >= static_cast<size_t>(std::max(1, options.max_connections))) {
      error_code ignored;
      socket.close(ignored);
    } else {
      auto c = std::make_shared<Connection>(*this, std::move(socket));
      connections.insert(c);
      c->Begin();
    }
    Accept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, ErrorBodyFn error_body, ResponseObserver observer)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->error_body = std::move(error_body);
  impl_->observer = std::move(observer);
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(std::string_view method, std::string path, HttpHandler handler) {
  impl_->routes[std::move(path)][std::string(method)] = std::move(handler);
}

Status HttpServer::Start() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.stop_mu);
  if (s.started) return InvalidArgument("HttpServer::Start called twice");
  // Writes go out with MSG_NOSIGNAL, but a client closing its socket mid-stream must be a failed
  // write anywhere in the process, never its death.
  signal(SIGPIPE, SIG_IGN);
  // Every connection is a descriptor; the usual soft limit (1024) would cap them far below
  // max_connections, so raise it toward the hard limit.
  rlimit nofile{};
  if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
    nofile.rlim_cur = std::min<rlim_t>(nofile.rlim_max, 1u << 16);
    setrlimit(RLIMIT_NOFILE, &nofile);
  }
  const std::string where = s.options.host + ":" + std::to_string(s.options.port);
  error_code ec;
  tcp::resolver resolver(s.io);
  const auto endpoints = resolver.resolve(s.options.host, std::to_string(s.options.port),
                                          tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || endpoints.empty()) return IoError("cannot listen on " + where + ": " + ec.message());
  const tcp::endpoint endpoint = endpoints.begin()->endpoint();
  // SO_REUSEADDR only allows quick restarts; no SO_REUSEPORT, which would let a second server
  // share a port that is already serving.
  s.acceptor.open(endpoint.protocol(), ec);
  if (!ec) s.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) s.acceptor.bind(endpoint, ec);
  if (!ec) s.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) {
    error_code ignored;
    s.acceptor.close(ignored);
    return IoError("cannot listen on " + where + ": " + ec.message());
  }
  s.port = s.acceptor.local_endpoint(ec).port();
  s.pool = std::make_unique<HandlerPool>(s.options.threads, std::max(s.options.threads, s.options.max_active_requests));
  s.work.emplace(s.io.get_executor());
  s.accepting = true;
  s.Accept();
  s.started = true;
  s.io_thread = std::thread([&s] {
    for (;;) {
      try {
        s.io.run();
        break;
      } catch (const std::exception& e) {
        // Handlers catch their own; this is a bug, but one connection's must not end the server.
        std::fprintf(stderr, "kimirt server: I/O loop: %s\n", e.what());
      }
    }
    s.accepting = false;
    s.io_done = true;
  });
  return Status::Ok();
}

int HttpServer::port() const { return impl_->port; }

bool HttpServer::serving() const { return impl_->started && impl_->accepting && !impl_->stopping; }

void HttpServer::Stop() {
  Impl& s = *impl_;
  std::lock_guard<std::mutex> lock(s.stop_mu);
  if (!s.started || s.stopped) return;
  s.stopped = true;
  s.stopping = true;
  // Close the listener and every connection on the I/O thread: handlers see client_gone, and
  // streams fail their next write.
  std::promise<void> closed;
  asio::post(s.io, [&s, &closed] {
    error_code ignored;
    s.acceptor.close(ignored);
    s.accept_retry.cancel();
    std::vector<std::shared_ptr<Impl::Connection>> open(s.connections.begin(), s.connections.end());
    for (auto& c : open) c->Close();
    closed.set_value();
  });
  closed.get_future().wait();
  s.pool->Shutdown();  // handlers finish (what they post finds its connection closed)
  // With every socket closed and timer cancelled, the loop runs out of work once the aborted
  // operations' handlers have run and released their connections; stop it if it does not.
  s.work.reset();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (!s.io_done && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  s.io.stop();
  s.io_thread.join();
  s.accepting = false;
}

}  // namespace kimirt
