// Issue 11, "a server vLLM users can drop in": the defects found against vLLM's behaviour and
// the vLLM-side features, over a real 127.0.0.1 socket with the scripted engine and byte-level
// tokenizer of server_test_util.h.
#include <gtest/gtest.h>

#include <set>

#include <nlohmann/json.hpp>

#include "kimirt/server/api_gateway.h"
#include "kimirt/server/openai_server.h"
#include "kimirt/server/server_test_util.h"
#include "kimirt/server/version.h"

namespace kimirt {
namespace {

using nlohmann::json;
using testing::FakeEngine;
using testing::FakeTokenizer;
using testing::HttpCall;
using testing::kK3ToolReply;
using testing::SseData;
using testing::TestReply;

const json kUserHi = {{{"role", "user"}, {"content", "Hi"}}};

class VllmCompatTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->Stop(std::chrono::milliseconds(0));
    engine_.Shutdown(false);
  }

  void Start(ServerOptions o = {}) {
    o.host = "127.0.0.1";
    o.port = 0;
    o.served_model_name = "tiny";
    o.http_threads = 8;
    o.log_requests = false;
    o.stats_interval = std::chrono::milliseconds(0);
    auto s = Server::Create(o, engine_, tokenizer_, ChatFormat::kK3);
    ASSERT_TRUE(s.ok()) << s.status().ToString();
    server_ = std::move(*s);
    ASSERT_TRUE(server_->Start().ok());
  }

  TestReply Post(std::string_view path, const json& body, std::string_view headers = "") {
    return HttpCall(server_->port(), "POST", path, body.dump(), headers);
  }
  TestReply Get(std::string_view path, std::string_view headers = "") {
    return HttpCall(server_->port(), "GET", path, "", headers);
  }
  static json Body(const TestReply& r) { return json::parse(r.body); }
  static void ExpectError(const TestReply& r, int status, const std::string& param) {
    EXPECT_EQ(r.status, status) << r.body;
    const json e = json::parse(r.body, nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r.body;
    if (param.empty()) {
      EXPECT_TRUE(e["error"]["param"].is_null()) << r.body;
    } else {
      EXPECT_EQ(e["error"]["param"], param) << r.body;
    }
  }
  // The value of response header `name` (case-insensitive), or "" when absent.
  static std::string Header(const TestReply& r, std::string name) {
    std::string lower = r.headers;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    const size_t at = lower.find("\r\n" + name + ":");
    if (at == std::string::npos) return "";
    size_t start = at + 2 + name.size() + 1;
    while (start < r.headers.size() && r.headers[start] == ' ') ++start;
    return r.headers.substr(start, r.headers.find("\r\n", start) - start);
  }

  FakeTokenizer tokenizer_;
  FakeEngine engine_{tokenizer_};
  std::unique_ptr<Server> server_;
};

// Defect 6: after a bare <|open|> nothing streamed until the end; then one chunk carried all the
// reasoning, starting with the raw marker.
TEST_F(VllmCompatTest, ReasoningStreamsIncrementallyAfterABareOpenMarker) {
  Start();
  engine_.reply = "<|open|>The user asks about the weather in Paris.<|close|>think<|sep|>"
                  "<|open|>response<|sep|>Sunny.<|close|>response<|sep|><|close|>message<|sep|>";
  const TestReply r = Post("/v1/chat/completions", {{"messages", kUserHi}, {"stream", true}});
  ASSERT_EQ(r.status, 200) << r.body;
  std::vector<std::string> pieces;
  std::string content;
  for (const std::string& e : SseData(r.body)) {
    if (e == "[DONE]") continue;
    const json d = json::parse(e)["choices"][0]["delta"];
    if (d.contains("reasoning_content")) {
      pieces.push_back(d["reasoning_content"]);
      EXPECT_TRUE(content.empty()) << "reasoning after content";
    }
    if (d.contains("content")) content += d["content"].get<std::string>();
  }
  std::string reasoning;
  for (const std::string& p : pieces) reasoning += p;
  EXPECT_EQ(reasoning, "The user asks about the weather in Paris.");
  EXPECT_EQ(content, "Sunny.");
  // One token per event: the reasoning streams in many chunks, not one at the end.
  EXPECT_GT(pieces.size(), 20u);
}

// Defect 7: unseeded n > 1 requests all used the same seeds.
TEST_F(VllmCompatTest, UnseededChoicesGetFreshSeeds) {
  Start();
  engine_.reply = "ab";
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"n", 2}, {"max_tokens", 1}}).status, 200);
  }
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"n", 2}, {"max_tokens", 1}, {"seed", 40}}).status, 200);
  std::map<std::string, uint64_t> seeds;
  for (const EngineRequest& s : engine_.submitted()) {
    ASSERT_TRUE(s.params.seed.has_value());
    seeds[s.id] = *s.params.seed;
  }
  ASSERT_EQ(seeds.size(), 6u);
  std::set<uint64_t> distinct;
  for (const auto& [id, seed] : seeds) distinct.insert(seed);
  EXPECT_EQ(distinct.size(), 6u);
  std::set<uint64_t> seeded;
  for (const auto& [id, seed] : seeds) {
    if (seed == 40 || seed == 41) seeded.insert(seed);
  }
  EXPECT_EQ(seeded, (std::set<uint64_t>{40, 41}));
}

// --seed: the same server seed replays the same unseeded seeds.
TEST_F(VllmCompatTest, ServerSeedMakesUnseededRequestsReproducible) {
  ServerOptions o;
  o.seed = 7;
  Start(o);
  engine_.reply = "a";
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}).status, 200);
  const uint64_t first = *engine_.submitted().at(0).params.seed;
  server_->Stop(std::chrono::milliseconds(0));
  Start(o);
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}).status, 200);
  EXPECT_EQ(*engine_.submitted().at(1).params.seed, first);
}

// Defect 8: each parameter is honoured or refused by name.
TEST_F(VllmCompatTest, ToolChoiceNoneReturnsNoToolCalls) {
  Start();
  engine_.reply = kK3ToolReply;
  const json tools = {{{"type", "function"}, {"function", {{"name", "get_weather"}, {"parameters", json::object()}}}}};
  for (const bool stream : {false, true}) {
    const TestReply r =
        Post("/v1/chat/completions", {{"messages", kUserHi}, {"tools", tools}, {"tool_choice", "none"}, {"stream", stream}});
    ASSERT_EQ(r.status, 200) << r.body;
    EXPECT_EQ(r.body.find("tool_calls\":["), std::string::npos) << r.body;
    EXPECT_EQ(r.body.find("get_weather"), std::string::npos) << r.body;
    EXPECT_NE(r.body.find("\"finish_reason\":\"stop\""), std::string::npos) << r.body;
    std::string content;
    if (stream) {
      for (const std::string& e : SseData(r.body)) {
        if (e == "[DONE]") continue;
        const json d = json::parse(e)["choices"][0]["delta"];
        if (d.contains("content")) content += d["content"].get<std::string>();
      }
    } else {
      content = Body(r)["choices"][0]["message"]["content"];
    }
    EXPECT_EQ(content, "Checking.");
  }
}

TEST_F(VllmCompatTest, VllmSamplingExtrasReachTheEngine) {
  Start();
  engine_.reply = "ab";
  ASSERT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 5}, {"min_tokens", 3}, {"skip_special_tokens", false}})
                .status,
            200);
  const EngineRequest sub = engine_.submitted().at(0);
  EXPECT_EQ(sub.params.min_tokens, 3);
  EXPECT_FALSE(sub.params.skip_special_tokens);
}

TEST_F(VllmCompatTest, UnsupportedFeaturesAreRefusedByName) {
  Start();
  const std::pair<json, std::string> cases[] = {
      {{{"messages", kUserHi}, {"tool_choice", "required"}, {"tools", json::array()}}, "tool_choice"},
      {{{"messages", kUserHi}, {"response_format", {{"type", "json_object"}}}}, "response_format"},
      {{{"messages", kUserHi}, {"guided_regex", "a+"}}, "guided_regex"},
      {{{"messages", kUserHi}, {"use_beam_search", true}}, "use_beam_search"},
  };
  for (const auto& [body, param] : cases) ExpectError(Post("/v1/chat/completions", body), 400, param);
  EXPECT_TRUE(engine_.submitted().empty());
}

// Defect 9: validation errors name the field.
TEST_F(VllmCompatTest, ValidationErrorsNameTheField) {
  ServerOptions o;
  o.model_vocab_size = 200;  // the model knows fewer ids than the tokenizer (270)
  Start(o);
  ExpectError(Post("/v1/completions", {{"prompt", {1, 2, 250}}}), 400, "prompt[2]");
  ExpectError(Post("/v1/completions", {{"prompt", "x"}, {"stop_token_ids", {210}}}), 400, "stop_token_ids");
  json stops = json::array();
  for (int i = 0; i < 17; ++i) stops.push_back("s" + std::to_string(i));
  ExpectError(Post("/v1/completions", {{"prompt", "x"}, {"stop", stops}}), 400, "stop");
  // Chat's default max_tokens is the rest of the context (2048 − prompt here).
  ExpectError(Post("/v1/chat/completions", {{"messages", kUserHi}, {"min_tokens", 2048}}), 400, "min_tokens");
  ExpectError(Post("/v1/chat/completions",
                   {{"messages", kUserHi},
                    {"tools", {{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", "{}"}}}}}}}),
              400, "tools[0].function.parameters");
  EXPECT_TRUE(engine_.submitted().empty());
}

TEST_F(VllmCompatTest, ApiKeyGuardsV1Only) {
  ServerOptions o;
  o.api_key = "sk-test";
  Start(o);
  TestReply r = Get("/v1/models");
  ExpectError(r, 401, "");
  EXPECT_EQ(Body(r)["error"]["code"], "invalid_api_key");
  ExpectError(Get("/v1/models", "Authorization: Bearer sk-wrong\r\n"), 401, "");
  ExpectError(Post("/v1/completions", {{"prompt", "x"}}), 401, "");
  EXPECT_EQ(Get("/v1/models", "Authorization: Bearer sk-test\r\n").status, 200);
  EXPECT_EQ(Post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 1}}, "authorization: bearer sk-test\r\n").status,
            200);
  EXPECT_EQ(engine_.submitted().size(), 1u);
  // Probes and utilities stay open, as in vLLM.
  EXPECT_EQ(Get("/health").status, 200);
  EXPECT_EQ(Get("/metrics").status, 200);
  EXPECT_EQ(Get("/version").status, 200);
}

TEST_F(VllmCompatTest, RequestIdIsEchoedOrMade) {
  Start();
  TestReply r = Get("/v1/models", "X-Request-Id: my-trace-42\r\n");
  EXPECT_EQ(Header(r, "X-Request-Id"), "my-trace-42");
  r = Post("/v1/chat/completions", {{"messages", kUserHi}, {"stream", true}}, "x-request-id: stream-7\r\n");
  EXPECT_EQ(Header(r, "X-Request-Id"), "stream-7");
  const std::string a = Header(Get("/health"), "X-Request-Id");
  const std::string b = Header(Get("/health"), "X-Request-Id");
  EXPECT_FALSE(a.empty());
  EXPECT_NE(a, b);
}

TEST_F(VllmCompatTest, CorsHeaders) {
  ServerOptions o;
  o.allowed_origins = {"https://ui.example"};
  o.api_key = "k";
  Start(o);
  TestReply r = Get("/v1/models", "Origin: https://ui.example\r\nAuthorization: Bearer k\r\n");
  EXPECT_EQ(Header(r, "Access-Control-Allow-Origin"), "https://ui.example");
  r = Get("/v1/models", "Origin: https://evil.example\r\nAuthorization: Bearer k\r\n");
  EXPECT_EQ(Header(r, "Access-Control-Allow-Origin"), "");
}

// The preflight answer itself, without a transport.
TEST(ApiGateway, PreflightAndKey) {
  const ApiGateway gw({"k", {"https://ui.example"}, false});
  HttpRequest pre;
  pre.method = "OPTIONS";
  pre.path = "/v1/chat/completions";
  pre.headers = {{"origin", "https://ui.example"}, {"Access-Control-Request-Headers", "authorization"}};
  const HttpResponse r = gw.Preflight(pre);
  EXPECT_EQ(r.status, 200);
  auto header = [&](std::string_view name) {
    for (const HttpHeader& h : r.headers) {
      if (h.name == name) return h.value;
    }
    return std::string();
  };
  EXPECT_EQ(header("Access-Control-Allow-Origin"), "https://ui.example");
  EXPECT_EQ(header("Access-Control-Allow-Headers"), "authorization");
  EXPECT_NE(header("Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_FALSE(header("X-Request-Id").empty());
  pre.headers = {{"Origin", "https://evil.example"}};
  EXPECT_EQ(gw.Preflight(pre).headers.size(), 1u);  // X-Request-Id only

  HttpRequest get;
  get.path = "/v1/models";
  EXPECT_FALSE(gw.Authorized(get));
  get.headers = {{"Authorization", "Bearer k"}};
  EXPECT_TRUE(gw.Authorized(get));
  get.headers = {{"Authorization", "Bearer kk"}};
  EXPECT_FALSE(gw.Authorized(get));
  get.headers = {{"Authorization", "k"}};
  EXPECT_FALSE(gw.Authorized(get));
  get.path = "/health";
  EXPECT_TRUE(gw.Authorized(get));
  get.path = "/v1x";  // only /v1 and below
  EXPECT_TRUE(gw.Authorized(get));
}

// Needs a transport that routes OPTIONS (the replacement transport of issue 11 does; the
// cpp-httplib one answers 405 before any handler runs).
TEST_F(VllmCompatTest, CorsPreflight) {
  ServerOptions o;
  o.allowed_origins = {"https://ui.example"};
  o.api_key = "k";
  Start(o);
  // A browser's preflight carries no API key; it must still succeed.
  const TestReply r = HttpCall(server_->port(), "OPTIONS", "/v1/chat/completions", "",
               "Origin: https://ui.example\r\nAccess-Control-Request-Method: POST\r\n"
               "Access-Control-Request-Headers: authorization, content-type\r\n");
  EXPECT_EQ(r.status, 200) << r.headers;
  EXPECT_EQ(Header(r, "Access-Control-Allow-Origin"), "https://ui.example");
  EXPECT_NE(Header(r, "Access-Control-Allow-Methods").find("POST"), std::string::npos);
  EXPECT_EQ(Header(r, "Access-Control-Allow-Headers"), "authorization, content-type");
}

TEST_F(VllmCompatTest, TokenizeDetokenizeVersion) {
  Start();
  TestReply r = Post("/tokenize", {{"model", "tiny"}, {"prompt", "hi<|sep|>"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json j = Body(r);
  EXPECT_EQ(j["tokens"], json({'h', 'i', 258}));
  EXPECT_EQ(j["count"], 3);
  EXPECT_EQ(j["max_model_len"], 2048);
  EXPECT_TRUE(j["token_strs"].is_null());
  j = Body(Post("/tokenize", {{"prompt", "hi"}, {"return_token_strs", true}}));
  EXPECT_EQ(j["token_strs"], json({"h", "i"}));

  // Messages count as the chat endpoint bills them.
  engine_.reply = "ok";
  const json chat = {{"messages", kUserHi}, {"chat_template_kwargs", {{"thinking", false}}}};
  j = Body(Post("/tokenize", chat));
  const json done = Body(Post("/v1/chat/completions", chat));
  EXPECT_EQ(j["count"], done["usage"]["prompt_tokens"]);
  EXPECT_EQ(j["tokens"].get<std::vector<int32_t>>(), engine_.submitted().at(0).prompt);

  r = Post("/detokenize", {{"tokens", {'h', 'i', 258}}});
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(Body(r)["prompt"], "hi<|sep|>");
  ExpectError(Post("/detokenize", {{"tokens", {1, 9999}}}), 400, "tokens[1]");
  ExpectError(Post("/tokenize", {{"model", "other"}, {"prompt", "x"}}), 404, "model");
  ExpectError(Post("/tokenize", json::object()), 400, "prompt");

  r = Get("/version");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(Body(r)["version"], std::string(kKimirtVersion));
}

TEST_F(VllmCompatTest, DefaultChatTemplateKwargsApplyUnderTheRequests) {
  ServerOptions o;
  o.default_chat_template_kwargs = R"({"thinking": false})";
  Start(o);
  engine_.reply = "Plain.";
  const auto prompt_of = [&](const json& body) {
    const TestReply r = Post("/tokenize", body);
    EXPECT_EQ(r.status, 200) << r.body;
    return Body(r)["tokens"].get<std::vector<int32_t>>();
  };
  const std::vector<int32_t> by_default = prompt_of({{"messages", kUserHi}});
  EXPECT_EQ(by_default, prompt_of({{"messages", kUserHi}, {"chat_template_kwargs", {{"thinking", false}}}}));
  EXPECT_NE(by_default, prompt_of({{"messages", kUserHi}, {"chat_template_kwargs", {{"thinking", true}}}}));
  // Thinking off: the reply is parsed as the answer.
  const json j = Body(Post("/v1/chat/completions", {{"messages", kUserHi}}));
  EXPECT_EQ(j["choices"][0]["message"]["content"], "Plain.");

  o.default_chat_template_kwargs = "[1]";
  EXPECT_FALSE(Server::Create(o, engine_, tokenizer_, ChatFormat::kK3).ok());
}

// The request log line and vLLM's periodic stats line, on stderr.
TEST_F(VllmCompatTest, RequestAndStatsLogLines) {
  ServerOptions o;
  Start();  // a quiet server first, so the one under test is the only writer
  server_->Stop(std::chrono::milliseconds(0));
  engine_.reply = "abcdefgh";
  engine_.delay = std::chrono::milliseconds(40);
  ::testing::internal::CaptureStderr();
  {
    o.host = "127.0.0.1";
    o.served_model_name = "tiny";
    o.stats_interval = std::chrono::milliseconds(50);
    auto s = Server::Create(o, engine_, tokenizer_, ChatFormat::kK3);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE((*s)->Start().ok());
    EXPECT_EQ(HttpCall((*s)->port(), "POST", "/v1/completions", R"({"prompt":"x","max_tokens":8})",
                       "X-Request-Id: log-me\r\n").status,
              200);
    (*s)->Stop(std::chrono::milliseconds(0));
  }
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(log.find("INFO "), std::string::npos) << log;
  EXPECT_NE(log.find("POST /v1/completions 200 "), std::string::npos) << log;
  EXPECT_NE(log.find("request_id=log-me"), std::string::npos) << log;
  EXPECT_NE(log.find("Avg prompt throughput: "), std::string::npos) << log;
  EXPECT_NE(log.find("Running: 1 reqs, Waiting: 0 reqs, KV cache usage: 2.0%"), std::string::npos) << log;
}

}  // namespace
}  // namespace kimirt
