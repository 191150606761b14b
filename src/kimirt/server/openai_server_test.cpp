// The server end to end over a real socket on 127.0.0.1, with a scripted engine and a byte-level
// tokenizer (server_test_util.h), so these tests do not depend on the model or the real engine.
#include "kimirt/server/openai_server.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "kimirt/server/server_test_util.h"

namespace kimirt {
namespace {

using nlohmann::json;
using testing::FakeEngine;
using testing::FakeTokenizer;
using testing::HttpCall;
using testing::kK3ToolReply;
using testing::ParseReply;
using testing::SseData;
using testing::TestConnection;
using testing::TestReply;

class ServerTest : public ::testing::Test {
 protected:
  void SetUp() override { StartServer(ChatFormat::kK3); }
  void TearDown() override {
    if (server_) server_->Stop(std::chrono::milliseconds(0));
    engine_.Shutdown(false);
  }

  void StartServer(ChatFormat family, size_t max_body = 1 << 20) {
    if (server_) server_->Stop(std::chrono::milliseconds(0));
    ServerOptions o;
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_name = "tiny";
    o.max_body_bytes = max_body;
    o.http_threads = 8;
    o.log_requests = false;
    o.stats_interval = std::chrono::milliseconds(0);
    auto s = Server::Create(o, engine_, tokenizer_, family);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->port(), 0);
    ASSERT_TRUE(server_->serving());
  }

  TestReply Post(std::string_view path, const json& body) { return HttpCall(server_->port(), "POST", path, body.dump()); }
  TestReply Get(std::string_view path) { return HttpCall(server_->port(), "GET", path); }

  static json Body(const TestReply& r) { return json::parse(r.body); }
  static void ExpectError(const TestReply& r, int status, const std::string& param = "") {
    EXPECT_EQ(r.status, status) << r.body;
    json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    EXPECT_TRUE(e["error"]["message"].is_string());
    EXPECT_TRUE(e["error"]["type"].is_string());
    if (!param.empty()) {
      EXPECT_EQ(e["error"]["param"], param) << r.body;
    }
  }

  FakeTokenizer tokenizer_;
  FakeEngine engine_{tokenizer_};
  std::unique_ptr<Server> server_;
};

TEST_F(ServerTest, ModelsHealthMetrics) {
  TestReply r = Get("/v1/models");
  ASSERT_EQ(r.status, 200);
  json j = Body(r);
  EXPECT_EQ(j["object"], "list");
  ASSERT_EQ(j["data"].size(), 1u);
  EXPECT_EQ(j["data"][0]["id"], "tiny");
  EXPECT_EQ(j["data"][0]["max_model_len"], 2048);

  r = Get("/health");
  EXPECT_EQ(r.status, 200);

  ASSERT_EQ(Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}}).status, 200);
  r = Get("/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_NE(r.headers.find("text/plain; version=0.0.4"), std::string::npos);
  EXPECT_NE(r.body.find("kimirt_http_requests_total{endpoint=\"/v1/completions\",status=\"200\"} 1"), std::string::npos)
      << r.body;
  EXPECT_NE(r.body.find("vllm:generation_tokens_total{model_name=\"tiny\"} 3"), std::string::npos);
  EXPECT_NE(r.body.find("vllm:prompt_tokens_total{model_name=\"tiny\"} 2"), std::string::npos);
  EXPECT_NE(r.body.find("vllm:time_to_first_token_seconds_count{model_name=\"tiny\"} 1"), std::string::npos);
  EXPECT_NE(r.body.find("vllm:e2e_request_latency_seconds_count{model_name=\"tiny\"} 1"), std::string::npos);
  EXPECT_NE(r.body.find("vllm:request_success_total{model_name=\"tiny\",finished_reason=\"length\"} 1"),
            std::string::npos);
  EXPECT_NE(r.body.find("kimirt_kv_cache_blocks_total 100"), std::string::npos);
}

TEST_F(ServerTest, CompletionNonStreaming) {
  TestReply r = Post("/v1/completions", {{"model", "tiny"}, {"prompt", "Say hi"}, {"max_tokens", 50}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["id"].get<std::string>().rfind("cmpl-", 0), 0u);
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], "Hello, world!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_TRUE(j["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(j["usage"]["prompt_tokens"], 6);  // one token per byte
  EXPECT_EQ(j["usage"]["completion_tokens"], 13);
  EXPECT_EQ(j["usage"]["total_tokens"], 19);

  const std::vector<EngineRequest> sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(sub[0].prompt, tokenizer_.Encode("Say hi", true));
  EXPECT_EQ(sub[0].params.max_tokens, 50);
  EXPECT_EQ(sub[0].id, j["id"].get<std::string>() + "-0");

  r = Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 5}, {"echo", true}});
  j = Body(r);
  EXPECT_EQ(j["choices"][0]["text"], "xHello");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
}

TEST_F(ServerTest, CompletionPromptsAndN) {
  TestReply r = Post("/v1/completions", {{"prompt", {"ab", "cde"}}, {"n", 2}, {"seed", 5}, {"max_tokens", 2}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  ASSERT_EQ(j["choices"].size(), 4u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "He");
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5);      // each prompt counted once
  EXPECT_EQ(j["usage"]["completion_tokens"], 8);  // every choice counted
  std::vector<EngineRequest> sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 4u);
  std::map<std::string, EngineRequest> by_id;
  for (const EngineRequest& e : sub) by_id[e.id] = e;
  const std::string id = j["id"];
  // Choice index = prompt × n + i; choice i of a prompt samples with seed + i.
  EXPECT_EQ(by_id[id + "-0"].prompt.size(), 2u);
  EXPECT_EQ(by_id[id + "-3"].prompt.size(), 3u);
  EXPECT_EQ(*by_id[id + "-0"].params.seed, 5u);
  EXPECT_EQ(*by_id[id + "-1"].params.seed, 6u);
  EXPECT_EQ(*by_id[id + "-2"].params.seed, 5u);
  EXPECT_EQ(*by_id[id + "-3"].params.seed, 6u);
  for (const EngineRequest& e : sub) EXPECT_EQ(e.params.n, 1);

  r = Post("/v1/completions", {{"prompt", {72, 105}}, {"max_tokens", 1}, {"echo", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["choices"][0]["text"], "HiH");  // token-id prompt decoded for echo
}

TEST_F(ServerTest, CompletionLogprobs) {
  TestReply r = Post("/v1/completions", {{"prompt", "ab"}, {"max_tokens", 2}, {"logprobs", 2}, {"echo", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  json lp = Body(r)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["tokens"], json({"a", "b", "H", "e"}));
  // Echo asks the engine for prompt logprobs with the same k; the first prompt token has none.
  ASSERT_EQ(engine_.submitted().size(), 1u);
  EXPECT_EQ(engine_.submitted()[0].params.prompt_logprobs, 2);
  EXPECT_EQ(lp["token_logprobs"], json({nullptr, -0.125, -0.25, -0.5}));
  EXPECT_EQ(lp["text_offset"], json({0, 1, 2, 3}));
  ASSERT_EQ(lp["top_logprobs"].size(), 4u);
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_EQ(lp["top_logprobs"][1], json({{"x", -3.0}, {"y", -4.0}, {"b", -0.125}}));
  EXPECT_EQ(lp["top_logprobs"][2], json({{"a", -1.0}, {"b", -2.0}, {"H", -0.25}}));

  // The same, streamed: the echo chunk carries the prompt's share once the first token came.
  r = Post("/v1/completions",
           {{"prompt", "ab"}, {"max_tokens", 2}, {"logprobs", 1}, {"echo", true}, {"stream", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  const std::vector<std::string> events = SseData(r.body);
  ASSERT_GE(events.size(), 3u) << r.body;
  const json first = json::parse(events[0])["choices"][0], second = json::parse(events[1])["choices"][0];
  EXPECT_EQ(first["text"], "ab");
  EXPECT_EQ(first["logprobs"]["token_logprobs"], json({nullptr, -0.125}));
  EXPECT_EQ(second["text"], "H");
  EXPECT_EQ(second["logprobs"]["token_logprobs"], json({-0.25}));
  EXPECT_EQ(second["logprobs"]["text_offset"], json({2}));

  // Without echo the engine is not asked for prompt logprobs.
  Post("/v1/completions", {{"prompt", "ab"}, {"max_tokens", 1}, {"logprobs", 2}});
  EXPECT_EQ(engine_.submitted().back().params.prompt_logprobs, -1);

  r = Post("/v1/completions", {{"prompt", "abc"}, {"max_tokens", 1}, {"logprobs", 0}});
  lp = Body(r)["choices"][0]["logprobs"];
  EXPECT_EQ(lp["text_offset"], json({3}));  // counted from the prompt's start
  EXPECT_EQ(lp["top_logprobs"][0], json({{"H", -0.25}}));
}

TEST_F(ServerTest, CompletionStreaming) {
  TestReply r = Post("/v1/completions", {{"prompt", "hi"},
                                         {"max_tokens", 5},
                                         {"stream", true},
                                         {"stream_options", {{"include_usage", true}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_NE(r.headers.find("text/event-stream"), std::string::npos);
  std::vector<std::string> events = SseData(r.body);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events.back(), "[DONE]");
  std::string text;
  std::string finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    json c = json::parse(events[i]);
    EXPECT_EQ(c["object"], "text_completion");
    EXPECT_TRUE(c["usage"].is_null());
    ASSERT_EQ(c["choices"].size(), 1u);
    text += c["choices"][0]["text"].get<std::string>();
    if (!c["choices"][0]["finish_reason"].is_null()) finish = c["choices"][0]["finish_reason"];
  }
  EXPECT_EQ(text, "Hello");
  EXPECT_EQ(finish, "length");
  json usage = json::parse(events[events.size() - 2]);
  EXPECT_TRUE(usage["choices"].empty());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], 2);
  EXPECT_EQ(usage["usage"]["completion_tokens"], 5);

  // n = 2 streams interleave both choices, each ending with its finish reason.
  r = Post("/v1/completions", {{"prompt", "hi"}, {"max_tokens", 3}, {"n", 2}, {"stream", true}, {"echo", true}});
  events = SseData(r.body);
  std::map<int, std::string> texts;
  int finishes = 0;
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    EXPECT_FALSE(c.contains("usage"));
    texts[c["choices"][0]["index"]] += c["choices"][0]["text"].get<std::string>();
    finishes += !c["choices"][0]["finish_reason"].is_null();
  }
  EXPECT_EQ(texts[0], "hiHel");
  EXPECT_EQ(texts[1], "hiHel");
  EXPECT_EQ(finishes, 2);
}

// vLLM's stream_options.continuous_usage_stats: every chunk carries the usage so far, and tokens
// that decode to no text still send their chunk, so each token can be timed; without it such
// tokens send nothing until the finish.
TEST_F(ServerTest, ContinuousUsageStreamsEveryTokenEvenWithoutText) {
  engine_.textless = true;
  for (const bool chat : {false, true}) {
    SCOPED_TRACE(chat ? "chat" : "completions");
    json body = {{"max_tokens", 5}, {"stream", true},
                 {"stream_options", {{"include_usage", true}, {"continuous_usage_stats", true}}}};
    if (chat) {
      body["messages"] = json::array({{{"role", "user"}, {"content", "hi"}}});
    } else {
      body["prompt"] = "hi";
    }
    const std::string path = chat ? "/v1/chat/completions" : "/v1/completions";
    std::vector<std::string> events = SseData(Post(path, body).body);
    std::vector<int64_t> counts;
    for (const std::string& e : events) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e);
      ASSERT_TRUE(c["usage"].is_object()) << e;
      if (!c["choices"].empty() && c["choices"][0]["finish_reason"].is_null()) {
        counts.push_back(c["usage"]["completion_tokens"].get<int64_t>());
      }
    }
    // Chat's role chunk comes first, with no token yet.
    std::vector<int64_t> want = {1, 2, 3, 4, 5};
    if (chat) want.insert(want.begin(), 0);
    EXPECT_EQ(counts, want);

    body["stream_options"] = {{"include_usage", true}};
    events = SseData(Post(path, body).body);
    int token_chunks = 0;
    for (const std::string& e : events) {
      if (e == "[DONE]") continue;
      const json c = json::parse(e);
      token_chunks += !c["choices"].empty() && c["choices"][0]["finish_reason"].is_null();
    }
    EXPECT_EQ(token_chunks, chat ? 1 : 0);  // chat: the role chunk alone
  }
}

TEST_F(ServerTest, InvalidRequests) {
  ExpectError(HttpCall(server_->port(), "POST", "/v1/completions", "{not json"), 400);
  ExpectError(HttpCall(server_->port(), "POST", "/v1/completions", "[]"), 400);
  ExpectError(Post("/v1/completions", {{"prompt", "x"}, {"temperature", "hot"}}), 400, "temperature");
  ExpectError(Post("/v1/completions", {{"prompt", "x"}, {"top_p", 2}}), 400, "top_p");
  ExpectError(Post("/v1/completions", {{"max_tokens", 2}}), 400, "prompt");
  ExpectError(Post("/v1/completions", {{"prompt", ""}}), 400, "prompt");
  ExpectError(Post("/v1/completions", {{"prompt", {"a", ""}}}), 400, "prompt[1]");
  ExpectError(Post("/v1/chat/completions", {{"model", "tiny"}}), 400, "messages");
  TestReply r = Post("/v1/completions", {{"model", "gpt-4"}, {"prompt", "x"}});
  ExpectError(r, 404, "model");
  EXPECT_EQ(Body(r)["error"]["code"], "model_not_found");
  // The fake engine's context is 2048 tokens.
  r = Post("/v1/completions", {{"prompt", std::string(2042, 'a')}, {"max_tokens", 7}});
  ExpectError(r, 400, "max_tokens");
  EXPECT_EQ(Body(r)["error"]["code"], "context_length_exceeded");
  ExpectError(Post("/v1/completions", {{"prompt", std::string(2100, 'a')}, {"max_tokens", 1}}), 400, "prompt");
  ExpectError(Post("/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", std::string(2100, 'a')}}}}}),
              400, "messages");
  // Renderer errors carry the field they name.
  ExpectError(Post("/v1/chat/completions",
                   {{"messages", {{{"role", "user"}, {"content", {{{"type", "image_url"}}}}}}}}),
              400);
  // Transport-level errors are OpenAI JSON too.
  ExpectError(Get("/v2/nothing"), 404);
  ExpectError(Get("/v1/completions"), 405);
  EXPECT_TRUE(engine_.submitted().empty());  // nothing invalid reached the engine
}

TEST_F(ServerTest, BodyTooLarge) {
  StartServer(ChatFormat::kK3, /*max_body=*/1024);
  TestReply r = Post("/v1/completions", {{"prompt", std::string(2000, 'a')}});
  ExpectError(r, 413);
  EXPECT_EQ(Get("/health").status, 200);  // and the server is fine
}

TEST_F(ServerTest, QueueFullIs429) {
  engine_.submit_status = ResourceExhausted("waiting queue is full (1024 requests)");
  TestReply r = Post("/v1/completions", {{"prompt", "x"}});
  ExpectError(r, 429);
  EXPECT_EQ(Body(r)["error"]["type"], "rate_limit_error");
  ExpectError(Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "x"}}}}}), 429);
}

TEST_F(ServerTest, PartialSubmitFailureAbortsTheRest) {
  // n = 3 where the engine takes two and refuses the third: the two queued are aborted.
  engine_.delay = std::chrono::milliseconds(50);
  engine_.accept_limit = 2;
  ExpectError(Post("/v1/completions", {{"prompt", "x"}, {"n", 3}}), 429);
  ASSERT_EQ(engine_.submitted().size(), 2u);
  std::vector<std::string> aborted = engine_.aborted();
  std::sort(aborted.begin(), aborted.end());
  ASSERT_EQ(aborted.size(), 2u);
  EXPECT_EQ(aborted[0].substr(aborted[0].size() - 2), "-0");
  EXPECT_EQ(aborted[1].substr(aborted[1].size() - 2), "-1");
}

TEST_F(ServerTest, HandlerExceptionIs500) {
  engine_.throw_on_submit = true;
  TestReply r = Post("/v1/completions", {{"prompt", "x"}});
  ExpectError(r, 500);
  EXPECT_NE(Body(r)["error"]["message"].get<std::string>().find("fake engine exploded"), std::string::npos);
  engine_.throw_on_submit = false;
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}).status, 200);
}

TEST_F(ServerTest, ClientDisconnectAbortsTheRequest) {
  engine_.reply = std::string(500, 'z');
  engine_.delay = std::chrono::milliseconds(5);
  {
    TestConnection c(server_->port());
    c.Send("POST", "/v1/completions", json({{"prompt", "x"}, {"max_tokens", 200}, {"stream", true}}).dump());
    const std::string& got = c.ReadUntil("\"text\":\"z\"");
    ASSERT_NE(got.find("\"text\":\"z\""), std::string::npos) << got;
    c.Close();
  }
  // The next write fails or the idle check sees the closed socket: the engine gets Abort.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (engine_.aborted().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(engine_.aborted().size(), 1u);
  EXPECT_EQ(engine_.aborted()[0], engine_.submitted()[0].id);
  while (engine_.running() > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_.running(), 0);
  EXPECT_EQ(Get("/health").status, 200);
}

TEST_F(ServerTest, DisconnectWhileQueuedIsNoticedWithoutATokenArriving) {
  // The engine sends nothing for a long time (a request waiting in its queue): the idle check of
  // the socket still notices the client left.
  engine_.reply = "slow";
  engine_.delay = std::chrono::milliseconds(3000);
  {
    TestConnection c(server_->port());
    c.Send("POST", "/v1/completions", json({{"prompt", "x"}, {"stream", true}}).dump());
    c.ReadUntil("\r\n\r\n", std::chrono::milliseconds(500));
    c.Close();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(2000);
  while (engine_.aborted().empty() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(engine_.aborted().size(), 1u);
}

TEST_F(ServerTest, NonStreamedRequestOfAClientThatHungUpIsAborted) {
  // The transport watches the connection while the handler blocks: client_gone turns true while
  // the answer is still being generated (here: long before the 200 tokens would be done).
  engine_.reply = std::string(500, 'z');
  engine_.delay = std::chrono::milliseconds(20);
  for (const char* path : {"/v1/completions", "/v1/chat/completions"}) {
    SCOPED_TRACE(path);
    const size_t before = engine_.aborted().size();
    {
      TestConnection c(server_->port());
      json body = {{"max_tokens", 200}};
      if (std::string(path) == "/v1/completions") {
        body["prompt"] = "x";
      } else {
        body["messages"] = json::array({{{"role", "user"}, {"content", "x"}}});
      }
      // Counted before sending: the server may submit before the next line runs.
      const auto submitted = engine_.submitted().size();
      c.Send("POST", path, body.dump());
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (engine_.submitted().size() == submitted && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      c.Close();
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
    while (engine_.aborted().size() == before && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_EQ(engine_.aborted().size(), before + 1);
    EXPECT_EQ(engine_.aborted().back(), engine_.submitted().back().id);
  }
  // The connection that stayed gets its answer as usual.
  engine_.delay = std::chrono::milliseconds(0);
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 3}}).status, 200);
}

TEST_F(ServerTest, StopRefusesNewRequestsAndAbortsInFlight) {
  engine_.reply = std::string(1000, 'z');
  engine_.delay = std::chrono::milliseconds(5);
  TestConnection c(server_->port());
  c.Send("POST", "/v1/completions", json({{"prompt", "x"}, {"max_tokens", 1000}, {"stream", true}}).dump());
  c.ReadUntil("\"text\":\"z\"");
  std::thread stopper([&] { server_->Stop(std::chrono::milliseconds(100)); });
  while (!server_->stopping()) std::this_thread::yield();
  // The stream ends with a 503 error event and [DONE] once the grace period is over.
  const std::string& got = c.ReadUntil("[DONE]");
  stopper.join();
  SCOPED_TRACE(got);
  EXPECT_NE(got.find("shutting_down"), std::string::npos);
  EXPECT_NE(got.find("data: [DONE]"), std::string::npos);
  EXPECT_EQ(engine_.aborted().size(), 1u);
  EXPECT_FALSE(TestConnection(server_->port()).connected());  // no longer listening
  EXPECT_FALSE(server_->serving());
}

TEST_F(ServerTest, ChatNonStreamingSplitsReasoningContentAndToolCalls) {
  engine_.reply = kK3ToolReply;
  json req = {{"model", "tiny"},
              {"messages", {{{"role", "user"}, {"content", "Weather in Paris?"}}}},
              {"tools", {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}}}},
              {"max_tokens", 1000},
              {"logprobs", true},
              {"top_logprobs", 1}};
  TestReply r = Post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["object"], "chat.completion");
  json m = j["choices"][0]["message"];
  EXPECT_EQ(m["role"], "assistant");
  EXPECT_EQ(m["reasoning_content"], "Let me check.");
  EXPECT_EQ(m["content"], "Checking.");
  ASSERT_EQ(m["tool_calls"].size(), 1u);
  EXPECT_EQ(m["tool_calls"][0]["type"], "function");
  EXPECT_EQ(m["tool_calls"][0]["function"]["name"], "get_weather");
  EXPECT_EQ(json::parse(m["tool_calls"][0]["function"]["arguments"].get<std::string>()), json({{"city", "Paris"}}));
  EXPECT_EQ(m["tool_calls"][0]["id"].get<std::string>().rfind("call_", 0), 0u);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "tool_calls");
  const int64_t reply_tokens = static_cast<int64_t>(tokenizer_.Encode(kK3ToolReply, true).size());
  EXPECT_EQ(j["usage"]["completion_tokens"], reply_tokens);
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"].size(), static_cast<size_t>(reply_tokens));
  EXPECT_EQ(j["choices"][0]["logprobs"]["content"][0]["top_logprobs"].size(), 1u);

  // The prompt is the K3 rendering, encoded with its markers as special ids.
  std::vector<EngineRequest> sub = engine_.submitted();
  ASSERT_EQ(sub.size(), 1u);
  EXPECT_EQ(j["usage"]["prompt_tokens"], static_cast<int64_t>(sub[0].prompt.size()));
  EXPECT_NE(std::find(sub[0].prompt.begin(), sub[0].prompt.end(), *tokenizer_.SpecialTokenId("<|open|>")),
            sub[0].prompt.end());
}

TEST_F(ServerTest, ChatDefaultsMaxTokensToTheRestOfTheContext) {
  engine_.reply = "hi<|close|>think<|sep|><|open|>response<|sep|>Hello!<|close|>response<|sep|>";
  TestReply r = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Hello!");
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_FALSE(j["choices"][0]["message"].contains("tool_calls"));
  const EngineRequest sub = engine_.submitted().at(0);
  EXPECT_EQ(sub.params.max_tokens + static_cast<int32_t>(sub.prompt.size()), 2048);
}

TEST_F(ServerTest, ChatStreaming) {
  engine_.reply = kK3ToolReply;
  json req = {{"messages", {{{"role", "user"}, {"content", "Weather?"}}}},
              {"stream", true},
              {"n", 2},
              {"stream_options", {{"include_usage", true}}}};
  TestReply r = Post("/v1/chat/completions", req);
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> events = SseData(r.body);
  ASSERT_EQ(events.back(), "[DONE]");
  std::map<int, std::string> reasoning, content, role, finish;
  std::map<int, json> calls;
  json usage;
  for (const std::string& e : events) {
    if (e == "[DONE]") continue;
    json c = json::parse(e);
    EXPECT_EQ(c["object"], "chat.completion.chunk");
    if (c["choices"].empty()) {
      usage = c["usage"];
      continue;
    }
    const int i = c["choices"][0]["index"];
    const json& d = c["choices"][0]["delta"];
    if (d.contains("role")) role[i] = d["role"];
    if (d.contains("reasoning_content")) reasoning[i] += d["reasoning_content"].get<std::string>();
    if (d.contains("content")) content[i] += d["content"].get<std::string>();
    if (d.contains("tool_calls")) {
      for (const json& tc : d["tool_calls"]) calls[i].push_back(tc);
    }
    if (!c["choices"][0]["finish_reason"].is_null()) finish[i] = c["choices"][0]["finish_reason"];
  }
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(role[i], "assistant");
    EXPECT_EQ(reasoning[i], "Let me check.");
    EXPECT_EQ(content[i], "Checking.");
    ASSERT_EQ(calls[i].size(), 1u);
    EXPECT_EQ(calls[i][0]["index"], 0);
    EXPECT_EQ(calls[i][0]["function"]["name"], "get_weather");
    EXPECT_EQ(finish[i], "tool_calls");
  }
  EXPECT_NE(calls[0][0]["id"], calls[1][0]["id"]);
  EXPECT_EQ(usage["completion_tokens"], 2 * static_cast<int64_t>(tokenizer_.Encode(kK3ToolReply, true).size()));
}

TEST_F(ServerTest, ChatThinkingOffAndKimiLinear) {
  engine_.reply = "Plain answer.";
  TestReply r = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                              {"chat_template_kwargs", {{"thinking", false}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  // Thinking off: the prompt opened `response`, so the text is content.
  EXPECT_EQ(Body(r)["choices"][0]["message"]["content"], "Plain answer.");
  EXPECT_TRUE(Body(r)["choices"][0]["message"]["reasoning_content"].is_null());

  StartServer(ChatFormat::kKimiLinear);
  r = Post("/v1/chat/completions", {{"messages", {{{"role", "user"}, {"content", "Hi"}}}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["choices"][0]["message"]["content"], "Plain answer.");
  const EngineRequest sub = engine_.submitted().back();
  EXPECT_NE(std::find(sub.prompt.begin(), sub.prompt.end(), *tokenizer_.SpecialTokenId("<|im_user|>")),
            sub.prompt.end());
}

TEST_F(ServerTest, PortInUseIsAnError) {
  ServerOptions o;
  o.port = server_->port();
  auto second = Server::Create(o, engine_, tokenizer_, ChatFormat::kK3);
  ASSERT_TRUE(second.ok());
  Status s = (*second)->Start();
  EXPECT_EQ(s.code(), ErrorCode::kIo) << s.ToString();
  EXPECT_NE(s.message().find(std::to_string(o.port)), std::string::npos);
  o.port = 70000;
  EXPECT_FALSE(Server::Create(o, engine_, tokenizer_, ChatFormat::kK3).ok());
}

TEST_F(ServerTest, ConcurrentRequests) {
  engine_.delay = std::chrono::milliseconds(1);
  std::vector<std::thread> clients;
  std::atomic<int> ok{0};
  for (int i = 0; i < 16; ++i) {
    clients.emplace_back([&, i] {
      json req = {{"prompt", "p" + std::to_string(i)}, {"max_tokens", 8}, {"stream", i % 2 == 0}};
      TestReply r = Post("/v1/completions", req);
      ok += r.status == 200;
    });
  }
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok, 16);
}

}  // namespace
}  // namespace kimirt
