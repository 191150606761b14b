// Test helper: a scripted OpenAI-compatible server on 127.0.0.1 (port chosen by the OS) for the
// end-to-end tests of `eval gsm8k` and `bench serve`. It records every request body, answers
// /v1/models, /v1/completions and /v1/chat/completions (whole or as SSE streams, each event
// written in two pieces, with a keep-alive comment and mixed line endings, so clients must
// reassemble events across reads), and serves /metrics with a TTFT histogram that counts the
// streamed requests. Token counts: prompt_tokens = w + w/4 + 3 for a prompt of w words (not
// linear, so the bench calibration has work to do; a test may set another count); a stream
// yields max_tokens chunks.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace kimirt::eval::testing {

class FakeOpenAiServer {
 public:
  using Json = nlohmann::json;
  // Maps a request body to the generated text of a non-streamed reply.
  std::function<std::string(const Json&)> responder = [](const Json&) { return std::string(" ok"); };
  double token_delay_s = 0.001;
  // The server's prompt token count of a prompt text (default: PromptTokens).
  std::function<int64_t(const std::string&)> prompt_tokens = [](const std::string& t) { return PromptTokens(t); };

  FakeOpenAiServer() {
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})", "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res, false); });
    server_.Post("/v1/chat/completions",
                 [this](const httplib::Request& req, httplib::Response& res) { Handle(req, res, true); });
    server_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::lock_guard<std::mutex> lock(mu_);
      std::ostringstream m;
      // As kimirt serve and vLLM export it (server/metrics.h): vLLM's name and model_name label.
      m << "# TYPE vllm:time_to_first_token_seconds histogram\n"
        << "vllm:time_to_first_token_seconds_bucket{model_name=\"fake\",le=\"0.001\"} 0\n"
        << "vllm:time_to_first_token_seconds_bucket{model_name=\"fake\",le=\"0.05\"} " << streams_ << "\n"
        << "vllm:time_to_first_token_seconds_bucket{model_name=\"fake\",le=\"+Inf\"} " << streams_ << "\n"
        << "vllm:time_to_first_token_seconds_sum{model_name=\"fake\"} " << 0.002 * streams_ << "\n"
        << "vllm:time_to_first_token_seconds_count{model_name=\"fake\"} " << streams_ << "\n";
      res.set_content(m.str(), "text/plain; version=0.0.4");
    });
    // Without TCP_NODELAY small SSE writes are held back by Nagle's algorithm and arrive in
    // bursts, which would make the timing assertions meaningless (a real server needs it too).
    server_.set_tcp_nodelay(true);
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }

  int port() const { return port_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::vector<Json> bodies() {
    std::lock_guard<std::mutex> lock(mu_);
    return bodies_;
  }

  static int64_t PromptTokens(const std::string& text) {
    std::istringstream in(text);
    std::string w;
    int64_t words = 0;
    while (in >> w) ++words;
    return words + words / 4 + 3;
  }

 private:
  void Handle(const httplib::Request& req, httplib::Response& res, bool chat) {
    Json body = Json::parse(req.body, nullptr, false);
    if (body.is_discarded() || !body.is_object()) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"body is not JSON"}})", "application/json");
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      bodies_.push_back(body);
    }
    if (body.value("model", "") != "fake-model") {
      res.status = 404;
      res.set_content(R"({"error":{"message":"The model `)" + body.value("model", "") + R"(` does not exist."}})",
                      "application/json");
      return;
    }
    const std::string prompt = chat ? body["messages"].back()["content"].get<std::string>() : body["prompt"].get<std::string>();
    const int64_t prompt_tokens = this->prompt_tokens(prompt);
    const int64_t max_tokens = body.value("max_tokens", 16);
    if (!body.value("stream", false)) {
      const std::string text = responder(body);
      Json choice = {{"index", 0}, {"finish_reason", "stop"}};
      if (chat) {
        choice["message"] = {{"role", "assistant"}, {"content", text}};
      } else {
        choice["text"] = text;
      }
      Json reply = {{"id", "x"}, {"choices", Json::array({choice})},
                    {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", 1}}}};
      res.set_content(reply.dump(), "application/json");
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++streams_;
    }
    const double delay = token_delay_s;
    res.set_chunked_content_provider("text/event-stream", [=](size_t, httplib::DataSink& sink) {
      auto send = [&](const std::string& event) {
        const size_t half = event.size() / 2;
        sink.write(event.data(), half);
        sink.write(event.data() + half, event.size() - half);
      };
      send(": ping\n\n");
      if (chat) send("data: " + Json{{"choices", {{{"index", 0}, {"delta", {{"role", "assistant"}}}}}}}.dump() + "\n\n");
      for (int64_t i = 0; i < max_tokens; ++i) {
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
        Json choice = {{"index", 0}, {"finish_reason", i + 1 == max_tokens ? Json("length") : Json(nullptr)}};
        if (chat) {
          choice["delta"] = {{"content", " w" + std::to_string(i)}};
        } else {
          choice["text"] = " w" + std::to_string(i);
        }
        const char* eol = i % 2 == 0 ? "\n\n" : "\r\n\r\n";
        send("data: " + Json{{"choices", Json::array({choice})}}.dump() + eol);
      }
      send("data: " + Json{{"choices", Json::array()}, {"usage", {{"prompt_tokens", prompt_tokens}, {"completion_tokens", max_tokens}}}}.dump() +
           "\n\n");
      send("data: [DONE]\n\n");
      sink.done();
      return true;
    });
  }

  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mu_;
  std::vector<Json> bodies_;
  int64_t streams_ = 0;
};

}  // namespace kimirt::eval::testing
