// HttpServer against clients that misbehave, over real 127.0.0.1 sockets (issue 11, "A server that
// one slow client cannot stop"): slow and idle connections, oversized chunked bodies, pipelining,
// bad Content-Length, many connections at once, disconnects. Every wait is bounded, so a
// regression fails in seconds instead of hanging.
#include "kimirt/server/http_server.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "kimirt/server/server_test_util.h"

namespace kimirt {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using testing::ParseReply;
using testing::TestConnection;
using testing::TestReply;

HttpResponse ErrorBody(int status, std::string_view detail) {
  HttpResponse r;
  r.status = status;
  r.body = "error " + std::to_string(status) + " " + std::string(detail);
  return r;
}

// Sends `text` every `period` until the client is gone or `max` pieces went out.
class TickStream : public HttpStream {
 public:
  TickStream(std::atomic<int>* closed, std::chrono::milliseconds period, int max = 1 << 30)
      : closed_(closed), period_(period), max_(max) {}
  Poll Next(std::string* out, std::chrono::milliseconds wait) override {
    if (sent_ == max_) return Poll::kEnd;
    const auto due = last_ + period_;
    if (Clock::now() < due) {
      std::this_thread::sleep_for(std::min<Clock::duration>(wait, due - Clock::now()));
      if (Clock::now() < due) return Poll::kIdle;
    }
    last_ = Clock::now();
    *out = "tick " + std::to_string(sent_++) + "\n";
    return Poll::kData;
  }
  void Close(bool complete) override { closed_->fetch_add(complete ? 1000 : 1); }

 private:
  std::atomic<int>* closed_;
  std::chrono::milliseconds period_;
  int max_;
  int sent_ = 0;
  Clock::time_point last_{};
};

class HttpServerTest : public ::testing::Test {
 protected:
  void Start(HttpServerOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    server_ = std::make_unique<HttpServer>(o, ErrorBody, [this](const HttpRequest&, int) { ++observed_; });
    server_->Route("GET", "/health", [](const HttpRequest&) {
      HttpResponse r;
      r.body = "ok";
      return r;
    });
    server_->Route("POST", "/echo", [this](const HttpRequest& req) {
      ++handled_;
      HttpResponse r;
      r.body = req.method + " " + req.path + " " + req.body;
      return r;
    });
    server_->Route("POST", "/slow", [this](const HttpRequest&) {
      ++handled_;
      std::this_thread::sleep_for(200ms);
      HttpResponse r;
      r.body = std::string(4096, 'x');
      return r;
    });
    server_->Route("POST", "/ticks", [this](const HttpRequest&) {
      HttpResponse r;
      r.content_type = "text/plain";
      r.stream = std::make_shared<TickStream>(&stream_closes_, 100ms);
      return r;
    });
    server_->Route("GET", "/three-ticks", [this](const HttpRequest&) {
      HttpResponse r;
      r.content_type = "text/plain";
      r.stream = std::make_shared<TickStream>(&stream_closes_, 10ms, 3);
      return r;
    });
    server_->Route("POST", "/wait-for-hangup", [this](const HttpRequest& req) {
      ++handled_;
      const auto deadline = Clock::now() + 5s;
      while (Clock::now() < deadline && !(req.client_gone && req.client_gone())) std::this_thread::sleep_for(5ms);
      if (req.client_gone && req.client_gone()) ++saw_hangup_;
      return HttpResponse{};
    });
    ASSERT_TRUE(server_->Start().ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
  }
  int port() const { return server_->port(); }

  // GET /health on a fresh connection; the reply and how long it took.
  std::pair<TestReply, Clock::duration> TimedHealth() {
    const auto t0 = Clock::now();
    TestConnection c(port());
    c.Send("GET", "/health", "");
    TestReply r = ParseReply(c.ReadUntil("\x01never\x01", 3s));
    return {r, Clock::now() - t0};
  }
  // Starts a server with 2 handler threads, opens `n` connections that each sent `prefix` (part
  // of a request line, or nothing) and then nothing, and checks /health still answers at once.
  std::vector<std::unique_ptr<TestConnection>> StartBesideStalled(HttpServerOptions o, int n, std::string_view prefix) {
    o.threads = 2;
    Start(o);
    std::vector<std::unique_ptr<TestConnection>> conns;
    for (int i = 0; i < n; ++i) {
      conns.push_back(std::make_unique<TestConnection>(port()));
      if (!prefix.empty()) conns.back()->SendRaw(prefix);
    }
    ExpectHealthWithinOneSecond(std::to_string(n) + " stalled connections");
    return conns;
  }
  void ExpectHealthWithinOneSecond(const std::string& beside) {
    auto [health, took] = TimedHealth();
    EXPECT_EQ(health.status, 200) << beside;
    EXPECT_LT(took, 1s) << beside << " held the server";
  }

  std::unique_ptr<HttpServer> server_;
  std::atomic<int> handled_{0};
  std::atomic<int> observed_{0};
  std::atomic<int> stream_closes_{0};
  std::atomic<int> saw_hangup_{0};
};

TEST_F(HttpServerTest, SlowHeaderClientsAreDroppedAtTheHeaderDeadline) {
  HttpServerOptions o;
  o.header_timeout = 600ms;
  // More slow clients than handler threads, each trickling its header one byte at a time.
  const auto t0 = Clock::now();
  std::vector<std::unique_ptr<TestConnection>> slow = StartBesideStalled(o, 16, "G");
  // Keep trickling: the deadline counts from the first byte, so they are cut off all the same.
  const std::string rest = "ET /health HTTP/1.1\r\nHost: x\r\n";
  for (size_t i = 0; i < rest.size() && Clock::now() - t0 < 2s; ++i) {
    for (auto& c : slow) c->SendRaw(rest.substr(i, 1));
    std::this_thread::sleep_for(50ms);
  }
  int dropped = 0;
  for (auto& c : slow) {
    c->ReadUntil("\x01never\x01", 500ms);
    dropped += c->eof();
  }
  EXPECT_EQ(dropped, 16);
  EXPECT_LT(Clock::now() - t0, 3s);
}

TEST_F(HttpServerTest, IdleConnectionsHoldNoThreadAndAreClosed) {
  HttpServerOptions o;
  o.idle_timeout = 800ms;
  std::vector<std::unique_ptr<TestConnection>> idle = StartBesideStalled(o, 200, "");
  int closed = 0;
  for (auto& c : idle) {
    c->ReadUntil("\x01never\x01", 1500ms);
    closed += c->eof();
    if (!c->eof()) break;
  }
  EXPECT_EQ(closed, 200);
}

TEST_F(HttpServerTest, ChunkedBodyOverTheLimitIs413) {
  HttpServerOptions o;
  o.max_body_bytes = 64 << 10;
  Start(o);
  TestConnection c(port());
  c.SendRaw("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n");
  const std::string piece(16 << 10, 'a');
  char size_line[32];
  std::snprintf(size_line, sizeof(size_line), "%zx\r\n", piece.size());
  // 4 MiB offered; the server should refuse after the first 64 KiB.
  for (int i = 0; i < 256; ++i) c.SendRaw(std::string(size_line) + piece + "\r\n");
  c.SendRaw("0\r\n\r\n");
  TestReply r = ParseReply(c.ReadUntil("\x01never\x01", 5s));
  EXPECT_EQ(r.status, 413) << r.headers;
  EXPECT_EQ(handled_, 0);
  // A chunked body under the limit is read and handed over whole.
  TestConnection ok(port());
  ok.SendRaw("POST /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n"
             "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
  TestReply r2 = ParseReply(ok.ReadUntil("\x01never\x01", 3s));
  EXPECT_EQ(r2.status, 200);
  EXPECT_EQ(r2.body, "POST /echo abcde");
}

// Splits back-to-back responses that each carry a Content-Length.
std::vector<TestReply> SplitReplies(const std::string& raw) {
  std::vector<TestReply> out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t head_end = raw.find("\r\n\r\n", pos);
    if (head_end == std::string::npos) break;
    std::string head = raw.substr(pos, head_end - pos);
    std::string lower = head;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    const size_t cl = lower.find("content-length:");
    const size_t len = cl == std::string::npos ? 0 : std::strtoul(lower.c_str() + cl + 15, nullptr, 10);
    TestReply r = ParseReply(raw.substr(pos, head_end + 4 + len - pos));
    out.push_back(r);
    pos = head_end + 4 + len;
  }
  return out;
}

TEST_F(HttpServerTest, PipelinedRequestsAreAnsweredInOrder) {
  Start();
  TestConnection c(port());
  std::string batch;
  for (const char* body : {"one", "two", "three"}) {
    batch += "POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: " + std::to_string(std::strlen(body)) + "\r\n\r\n" + body;
  }
  batch += "GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  c.SendRaw(batch);
  std::vector<TestReply> replies = SplitReplies(c.ReadUntil("\x01never\x01", 3s));
  ASSERT_EQ(replies.size(), 4u);
  EXPECT_EQ(replies[0].body, "POST /echo one");
  EXPECT_EQ(replies[1].body, "POST /echo two");
  EXPECT_EQ(replies[2].body, "POST /echo three");
  EXPECT_EQ(replies[3].body, "ok");
  EXPECT_TRUE(c.eof());  // Connection: close was honoured
}

TEST_F(HttpServerTest, BadOrMissingContentLengthIsAnsweredAtOnce) {
  HttpServerOptions o;
  o.max_body_bytes = 1 << 20;
  Start(o);
  struct Case {
    std::string head;
    int status;
  };
  const Case cases[] = {
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n", 400},
      {"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n", 413},
      {"POST /echo HTTP/1.1\r\nHost: x\r\n\r\n", 411},
  };
  for (const Case& k : cases) {
    SCOPED_TRACE(k.head);
    const auto t0 = Clock::now();
    TestConnection c(port());
    c.SendRaw(k.head);
    TestReply r = ParseReply(c.ReadUntil("\x01never\x01", 3s));
    EXPECT_EQ(r.status, k.status) << r.headers;
    EXPECT_NE(r.body.find("error " + std::to_string(k.status)), std::string::npos) << r.body;
    EXPECT_LT(Clock::now() - t0, 1s);
  }
  EXPECT_EQ(handled_, 0);
}

TEST_F(HttpServerTest, BodyThatNeverArrivesIsDroppedAtTheBodyDeadline) {
  HttpServerOptions o;
  o.body_timeout = 500ms;
  Start(o);
  const auto t0 = Clock::now();
  TestConnection c(port());
  c.SendRaw("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nonly this");
  c.ReadUntil("\x01never\x01", 3s);
  EXPECT_TRUE(c.eof());
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(handled_, 0);
}

TEST_F(HttpServerTest, ManyConcurrentConnectionsEachGetACompleteResponse) {
  HttpServerOptions o;
  o.threads = 8;  // handler threads up front; the pool grows for the requests actually running
  Start(o);
  constexpr int kClients = 128;
  std::atomic<int> complete{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> clients;
  const auto t0 = Clock::now();
  for (int i = 0; i < kClients; ++i) {
    clients.emplace_back([&] {
      ++ready;
      while (ready < kClients) std::this_thread::yield();
      TestConnection c(port());
      c.Send("POST", "/slow", "{}");
      TestReply r = ParseReply(c.ReadUntil("\x01never\x01", 10s));
      complete += r.status == 200 && r.body == std::string(4096, 'x');
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(complete, kClients);
  // 128 handlers of 200 ms each, run side by side rather than 8 at a time (3.2 s).
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(handled_, kClients);
}

TEST_F(HttpServerTest, HealthAnswersWhileHundredStreamsRun) {
  HttpServerOptions o;
  o.threads = 4;
  Start(o);
  std::vector<std::unique_ptr<TestConnection>> streams;
  for (int i = 0; i < 100; ++i) {
    streams.push_back(std::make_unique<TestConnection>(port()));
    streams.back()->Send("POST", "/ticks", "");
  }
  const auto started_by = Clock::now() + 5s;
  for (auto& s : streams) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(started_by - Clock::now());
    ASSERT_NE(s->ReadUntil("tick 0", std::max(left, 1ms)).find("tick 0"), std::string::npos);
  }
  for (int i = 0; i < 3; ++i) ExpectHealthWithinOneSecond("100 streams");
  // Every client hangs up: every stream is closed as incomplete, soon.
  for (auto& s : streams) s->Close();
  const auto deadline = Clock::now() + 3s;
  while (stream_closes_ < 100 && Clock::now() < deadline) std::this_thread::sleep_for(10ms);
  EXPECT_EQ(stream_closes_, 100);
}

TEST_F(HttpServerTest, StreamsAreChunkedOnKeepAliveAndCloseDelimitedForHttp10) {
  Start();
  TestConnection c(port());
  // A stream, then a pipelined request on the same connection: the stream's end is its last chunk.
  c.SendRaw("GET /three-ticks HTTP/1.1\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
  const std::string& got = c.ReadUntil("\x01never\x01", 3s);
  const size_t second = got.find("HTTP/1.1 200", 1);
  ASSERT_NE(second, std::string::npos) << got;
  TestReply stream = ParseReply(got.substr(0, second));
  EXPECT_NE(stream.headers.find("Transfer-Encoding: chunked"), std::string::npos) << stream.headers;
  EXPECT_EQ(stream.body, "tick 0\ntick 1\ntick 2\n");
  EXPECT_EQ(ParseReply(got.substr(second)).body, "ok");
  // HTTP/1.0 has no chunked encoding: the body is sent as is and ends with the connection.
  TestConnection old(port());
  old.SendRaw("GET /three-ticks HTTP/1.0\r\n\r\n");
  TestReply r = ParseReply(old.ReadUntil("\x01never\x01", 3s));
  EXPECT_TRUE(old.eof());
  EXPECT_EQ(r.headers.find("chunked"), std::string::npos) << r.headers;
  EXPECT_EQ(r.body, "tick 0\ntick 1\ntick 2\n");
  EXPECT_EQ(stream_closes_, 2000);  // both streams closed as complete
}

TEST_F(HttpServerTest, NonStreamingHandlerSeesTheClientHangUp) {
  Start();
  TestConnection c(port());
  c.Send("POST", "/wait-for-hangup", "");
  const auto until = Clock::now() + 2s;
  while (handled_ == 0 && Clock::now() < until) std::this_thread::sleep_for(5ms);
  ASSERT_EQ(handled_, 1);
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(saw_hangup_, 0);  // still connected: not gone
  c.Close();
  const auto deadline = Clock::now() + 1s;
  while (saw_hangup_ == 0 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(saw_hangup_, 1);
}

TEST_F(HttpServerTest, UnknownPathAndMethodAndObserver) {
  Start();
  TestReply r = testing::HttpCall(port(), "GET", "/nope");
  EXPECT_EQ(r.status, 404);
  EXPECT_EQ(r.body, "error 404 ");
  r = testing::HttpCall(port(), "GET", "/echo");
  EXPECT_EQ(r.status, 405);
  r = testing::HttpCall(port(), "POST", "/echo?x=1", "hi");
  EXPECT_EQ(r.body, "POST /echo hi");  // the query string is not part of the path
  const auto deadline = Clock::now() + 1s;
  while (observed_ < 3 && Clock::now() < deadline) std::this_thread::sleep_for(5ms);
  EXPECT_EQ(observed_, 3);
}

}  // namespace
}  // namespace kimirt
