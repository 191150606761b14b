// Test doubles for the server tests: a scripted Engine and a minimal HTTP/1.1 client over a
// 127.0.0.1 socket (the tests never include the HTTP library; only http_server.cpp does); the
// byte-level FakeTokenizer is tokenizer/fake_tokenizer_test_util.h. Header-only, included by *_test.cpp files only.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "kimirt/engine/engine.h"
#include "kimirt/tokenizer/fake_tokenizer_test_util.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt::testing {

// K3 output for a thinking-mode prompt: reasoning, content, then one tool call (spec §10.3).
inline constexpr char kK3ToolReply[] =
    "Let me check.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
    "<|open|>tools<|sep|><|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|>Paris<|close|>argument<|sep|>"
    "<|close|>call<|sep|><|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

// Answers every request with `reply` (one token per byte, see FakeTokenizer), one token per
// event `delay` apart, finishing kStop at its end or kLength at max_tokens. Records what was
// submitted and aborted.
class FakeEngine : public Engine {
 public:
  explicit FakeEngine(const Tokenizer& tokenizer) : tokenizer_(tokenizer) {
    options_.max_model_len = 2048;
    options_.default_seed = 1000;
  }
  ~FakeEngine() override { Shutdown(false); }

  // Scripted behaviour; set before requests arrive.
  std::string reply = "Hello, world!";
  std::chrono::milliseconds delay{0};
  Status submit_status;        // returned by Submit when not OK (e.g. the queue is full)
  bool throw_on_submit = false;
  int accept_limit = -1;       // >= 0: refuse (ResourceExhausted) once this many were accepted
  bool textless = false;       // every token decodes to no text (ids a tokenizer does not cover)

  Status Submit(EngineRequest request) override {
    if (throw_on_submit) throw std::runtime_error("fake engine exploded");
    std::lock_guard<std::mutex> lock(mu_);
    if (!submit_status.ok()) return submit_status;
    if (accept_limit >= 0 && static_cast<int>(submitted_.size()) >= accept_limit) {
      return ResourceExhausted("waiting queue is full");
    }
    auto run = std::make_shared<Run>();
    run->request = std::move(request);
    submitted_.push_back(run->request);
    submitted_.back().on_output = nullptr;
    runs_[run->request.id] = run;
    threads_.emplace_back([this, run] { Play(*run); });
    return Status::Ok();
  }
  void Abort(const std::string& id) override {
    std::lock_guard<std::mutex> lock(mu_);
    aborted_.push_back(id);
    auto it = runs_.find(id);
    if (it != runs_.end()) it->second->abort = true;
  }
  EngineStats Stats() const override {
    EngineStats s;
    s.running = running_;
    s.kv_blocks_total = 100;
    s.kv_blocks_used = running_ * 2;
    s.state_slots_total = 8;
    s.state_slots_used = running_;
    return s;
  }
  void Shutdown(bool /*drain*/) override {
    std::vector<std::thread> threads;
    {
      std::lock_guard<std::mutex> lock(mu_);
      for (auto& [id, run] : runs_) run->abort = true;
      threads.swap(threads_);
    }
    for (std::thread& t : threads) t.join();
  }
  const EngineOptions& options() const override { return options_; }
  EngineOptions& mutable_options() { return options_; }

  std::vector<EngineRequest> submitted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return submitted_;
  }
  std::vector<std::string> aborted() const {
    std::lock_guard<std::mutex> lock(mu_);
    return aborted_;
  }
  int64_t running() const { return running_; }

 private:
  struct Run {
    EngineRequest request;
    std::atomic<bool> abort{false};
  };

  void Play(Run& run) {
    ++running_;
    const SamplingParams& p = run.request.params;
    const std::vector<int32_t> script = tokenizer_.Encode(reply, /*allow_special=*/true);
    RequestOutput out;
    out.request_id = run.request.id;
    out.prompt_tokens = static_cast<int64_t>(run.request.prompt.size());
    for (size_t i = 0;; ++i) {
      // Sleeps in slices so that an abort is seen at once, as a real engine's next step would.
      const auto wake = std::chrono::steady_clock::now() + delay;
      while (!run.abort && std::chrono::steady_clock::now() < wake) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      if (run.abort) {
        out.finish = FinishReason::kAbort;
        break;
      }
      const bool at_end = i >= script.size();
      if (at_end || static_cast<int32_t>(i) >= p.max_tokens) {
        out.finish = at_end ? FinishReason::kStop : FinishReason::kLength;
        break;
      }
      RequestOutput step = out;
      step.token_ids = {script[i]};
      step.text = textless ? std::string() : std::string(tokenizer_.TokenBytes(script[i]));
      if (p.logprobs >= 0) {
        SampleResult s;
        s.token = script[i];
        s.logprob = -0.25f * static_cast<float>(i + 1);
        for (int32_t k = 0; k < p.logprobs; ++k) s.top.push_back({'a' + k, -1.0f - static_cast<float>(k)});
        step.logprobs = {s};
      }
      if (i == 0 && p.prompt_logprobs >= 0) {
        // Prompt token j (j >= 1) scored -0.125·j, its top list 'x', 'y', ...
        for (size_t j = 1; j < run.request.prompt.size(); ++j) {
          SampleResult s;
          s.token = run.request.prompt[j];
          s.logprob = -0.125f * static_cast<float>(j);
          for (int32_t k = 0; k < p.prompt_logprobs; ++k) s.top.push_back({'x' + k, -3.0f - static_cast<float>(k)});
          step.prompt_logprobs.push_back(s);
        }
      }
      step.completion_tokens = static_cast<int64_t>(i + 1);
      out.completion_tokens = step.completion_tokens;
      run.request.on_output(step);
    }
    --running_;
    run.request.on_output(out);
  }

  const Tokenizer& tokenizer_;
  EngineOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Run>> runs_;
  std::vector<std::thread> threads_;
  std::vector<EngineRequest> submitted_;
  std::vector<std::string> aborted_;
  std::atomic<int64_t> running_{0};
};

// One HTTP/1.1 exchange on a fresh 127.0.0.1 connection.
class TestConnection {
 public:
  explicit TestConnection(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
  }
  ~TestConnection() { Close(); }
  bool connected() const { return connected_; }
  // The server closed the connection (seen by a ReadUntil).
  bool eof() const { return eof_; }

  void Send(std::string_view method, std::string_view path, std::string_view body,
            std::string_view extra_headers = "") {
    std::string req = std::string(method) + " " + std::string(path) + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" +
                      "Connection: close\r\nContent-Type: application/json\r\n" + std::string(extra_headers) +
                      "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
    SendRaw(req);
  }
  void SendRaw(std::string_view bytes) {
    size_t sent = 0;
    while (sent < bytes.size()) {
      ssize_t n = send(fd_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n <= 0) return;
      sent += static_cast<size_t>(n);
    }
  }
  // Reads until `needle` appears in what was received, EOF or the timeout. Returns all received.
  const std::string& ReadUntil(std::string_view needle, std::chrono::milliseconds timeout = std::chrono::seconds(10)) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (received_.find(needle) == std::string::npos && !eof_) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) break;
      pollfd p{fd_, POLLIN, 0};
      if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
      char buf[4096];
      ssize_t n = recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) {
        eof_ = true;
        break;
      }
      received_.append(buf, static_cast<size_t>(n));
    }
    return received_;
  }
  void Close() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool eof_ = false;
  std::string received_;
};

struct TestReply {
  int status = 0;
  std::string headers;
  std::string body;  // de-chunked
};

inline TestReply ParseReply(const std::string& raw) {
  TestReply r;
  const size_t head_end = raw.find("\r\n\r\n");
  if (raw.size() < 12 || head_end == std::string::npos) return r;
  r.status = std::atoi(raw.substr(9, 3).c_str());
  r.headers = raw.substr(0, head_end);
  std::string rest = raw.substr(head_end + 4);
  std::string lower = r.headers;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (lower.find("transfer-encoding: chunked") == std::string::npos) {
    r.body = rest;
    return r;
  }
  size_t pos = 0;
  while (pos < rest.size()) {
    const size_t eol = rest.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t len = std::strtoul(rest.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (len == 0) break;
    r.body += rest.substr(eol + 2, len);
    pos = eol + 2 + len + 2;
  }
  return r;
}

inline TestReply HttpCall(int port, std::string_view method, std::string_view path, std::string_view body = "",
                          std::string_view extra_headers = "") {
  TestConnection c(port);
  c.Send(method, path, body, extra_headers);
  return ParseReply(c.ReadUntil("\x01never\x01"));
}

// The `data:` payloads of an SSE body, in order.
inline std::vector<std::string> SseData(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while (true) {
    const size_t start = body.find("data: ", pos);
    if (start == std::string::npos) break;
    const size_t end = body.find("\n\n", start);
    if (end == std::string::npos) break;
    out.push_back(body.substr(start + 6, end - start - 6));
    pos = end + 2;
  }
  return out;
}

}  // namespace kimirt::testing
