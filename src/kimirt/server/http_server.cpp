// The cpp-httplib side of HttpServer (http_server.h). The only file that includes <httplib.h>.
#include "kimirt/server/http_server.h"

#include <signal.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <set>
#include <thread>
#include <utility>

#include <httplib.h>

#include "kimirt/server/socket_probe.h"

namespace kimirt {
namespace {

// What the content provider and its releaser share: the stream and whether it reached kEnd.
struct StreamState {
  std::shared_ptr<HttpStream> stream;
  bool ended = false;
  std::once_flag closed;

  void Close(bool complete) {
    std::call_once(closed, [&] {
      try {
        stream->Close(complete);
      } catch (...) {
        // A stream's cleanup must not take the connection thread down; nothing else to do.
      }
    });
  }
  // cpp-httplib calls the releaser from ~Response, so this only guards against a provider that
  // was never installed.
  ~StreamState() { Close(false); }
};

// Route patterns are std::regex in cpp-httplib; ours are literal paths.
std::string EscapeRegex(std::string_view path) {
  std::string out;
  for (char c : path) {
    if (std::strchr(".^$|()[]{}*+?\\", c) != nullptr) out += '\\';
    out += c;
  }
  return out;
}

HttpRequest ToRequest(const httplib::Request& req) {
  HttpRequest r;
  r.method = req.method;
  r.path = req.path;
  r.body = req.body;
  for (const auto& [name, value] : req.headers) r.headers.push_back({name, value});
  return r;
}

}  // namespace

const std::string* HttpRequest::Header(std::string_view name) const {
  for (const HttpHeader& h : headers) {
    if (h.name.size() == name.size() &&
        std::equal(name.begin(), name.end(), h.name.begin(),
                   [](char a, char b) { return std::tolower(static_cast<unsigned char>(a)) ==
                                               std::tolower(static_cast<unsigned char>(b)); })) {
      return &h.value;
    }
  }
  return nullptr;
}

struct HttpServer::Impl {
  HttpServerOptions options;
  ErrorBodyFn error_body;
  ResponseObserver observer;
  httplib::Server server;
  std::set<std::string> routed_paths;
  std::thread thread;
  std::atomic<int> port{0};
  std::atomic<bool> loop_exited{false};
  std::mutex stop_mu;
  bool started = false;
  bool stopped = false;

  void Fill(httplib::Response& res, HttpResponse response) {
    res.status = response.status;
    for (const HttpHeader& h : response.headers) res.set_header(h.name, h.value);
    if (!response.stream) {
      res.set_content(std::move(response.body), response.content_type.c_str());
      return;
    }
    auto state = std::make_shared<StreamState>();
    state->stream = std::move(response.stream);
    const std::chrono::milliseconds poll = options.stream_poll;
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        response.content_type,
        [state, poll](size_t /*offset*/, httplib::DataSink& sink) {
          std::string piece;
          HttpStream::Poll p;
          try {
            p = state->stream->Next(&piece, poll);
          } catch (...) {
            return false;  // cancel: the connection closes and Close(false) runs
          }
          if (!piece.empty() && !sink.write(piece.data(), piece.size())) return false;
          if (p == HttpStream::Poll::kEnd) {
            state->ended = true;
            sink.done();
            return true;
          }
          // A client that closed its socket is only noticed on a write or here: without this
          // a request waiting in the engine's queue would keep its slot until its first token.
          if (p == HttpStream::Poll::kIdle && !sink.is_writable()) return false;
          return true;
        },
        [state](bool success) { state->Close(success && state->ended); });
  }

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
};

HttpServer::HttpServer(HttpServerOptions options, ErrorBodyFn error_body, ResponseObserver observer)
    : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->error_body = std::move(error_body);
  impl_->observer = std::move(observer);
  Impl* impl = impl_.get();
  httplib::Server& s = impl->server;

  const size_t threads = static_cast<size_t>(impl->options.threads > 0 ? impl->options.threads : 1);
  s.new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  s.set_payload_max_length(impl->options.max_body_bytes);
  s.set_read_timeout(std::chrono::duration_cast<std::chrono::seconds>(impl->options.body_timeout).count(), 0);
  s.set_write_timeout(std::chrono::duration_cast<std::chrono::seconds>(impl->options.write_timeout).count(), 0);
  s.set_keep_alive_max_count(1000);
  s.set_keep_alive_timeout(5);
  // cpp-httplib's default sets SO_REUSEPORT, which lets a second server bind a port that is
  // already serving and silently share it; plain SO_REUSEADDR only allows quick restarts.
  s.set_socket_options([](int sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  // Bodies for the statuses cpp-httplib produces itself; handler responses already have one.
  s.set_error_handler(httplib::Server::HandlerWithResponse(
      [impl](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        if (res.status == 404 && impl->routed_paths.count(req.path) != 0) res.status = 405;
        impl->Fill(res, impl->SafeErrorBody(res.status, ""));
        return httplib::Server::HandlerResponse::Handled;
      }));
  s.set_exception_handler([impl](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "unknown exception";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    impl->Fill(res, impl->SafeErrorBody(500, what));
  });
  s.set_logger([impl](const httplib::Request& req, const httplib::Response& res) {
    if (!impl->observer) return;
    try {
      impl->observer(ToRequest(req), res.status);
    } catch (...) {
    }
  });
}

HttpServer::~HttpServer() { Stop(); }

void HttpServer::Route(std::string_view method, std::string path, HttpHandler handler) {
  Impl* impl = impl_.get();
  impl->routed_paths.insert(path);
  auto wrapped = [impl, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res) {
    HttpResponse response;
    try {
      HttpRequest request = ToRequest(req);
      auto probe = std::make_shared<SocketProbe>(req.local_addr, req.local_port, req.remote_addr, req.remote_port);
      request.client_gone = [probe] { return probe->Gone(); };
      response = handler(request);
    } catch (const std::exception& e) {
      response = impl->SafeErrorBody(500, e.what());
    } catch (...) {
      response = impl->SafeErrorBody(500, "unknown exception");
    }
    impl->Fill(res, std::move(response));
  };
  const std::string pattern = EscapeRegex(path);
  if (method == "GET") {
    impl->server.Get(pattern, std::move(wrapped));
  } else if (method == "POST") {
    impl->server.Post(pattern, std::move(wrapped));
  } else if (method == "DELETE") {
    impl->server.Delete(pattern, std::move(wrapped));
  } else {
    impl->server.Put(pattern, std::move(wrapped));
  }
}

Status HttpServer::Start() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (impl_->started) return InvalidArgument("HttpServer::Start called twice");
  signal(SIGPIPE, SIG_IGN);
  const std::string& host = impl_->options.host;
  int port = impl_->options.port;
  errno = 0;
  if (port == 0) {
    port = impl_->server.bind_to_any_port(host);
  } else if (!impl_->server.bind_to_port(host, port)) {
    port = -1;
  }
  if (port <= 0) {
    const int err = errno;
    return IoError("cannot listen on " + host + ":" + std::to_string(impl_->options.port) +
                   (err != 0 ? std::string(": ") + std::strerror(err) : std::string()));
  }
  impl_->port = port;
  impl_->started = true;
  impl_->thread = std::thread([impl = impl_.get()] {
    const bool clean = impl->server.listen_after_bind();
    impl->loop_exited = true;
    // cpp-httplib ends its accept loop on an accept() error it does not retry (not EMFILE, EINTR
    // or EAGAIN). Nothing can restart it here, but it must not go unnoticed.
    if (!clean) {
      std::fprintf(stderr, "kimirt server: the listener on port %d stopped accepting connections\n",
                   impl->port.load());
    }
  });
  // stop() is a no-op until the loop has marked itself running, so wait for that here: a Stop()
  // right after Start() must not leave the loop serving forever.
  while (!impl_->server.is_running() && !impl_->loop_exited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return Status::Ok();
}

int HttpServer::port() const { return impl_->port; }

bool HttpServer::serving() const { return impl_->started && !impl_->loop_exited; }

void HttpServer::Stop() {
  std::lock_guard<std::mutex> lock(impl_->stop_mu);
  if (!impl_->started || impl_->stopped) return;
  impl_->stopped = true;
  impl_->server.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

}  // namespace kimirt
