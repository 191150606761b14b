#include "kimirt/eval/openai_client.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "kimirt/testing/loopback.h"

namespace kimirt::eval {
namespace {

TEST(OpenAiClient, ParsesCompletionAndChatBodies) {
  Result<Completion> c = ParseCompletionBody(
      R"({"choices":[{"index":0,"text":" 42","finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":2}})",
      false);
  ASSERT_TRUE(c.ok()) << c.status().message();
  EXPECT_EQ(c->text, " 42");
  EXPECT_EQ(c->finish_reason, "stop");
  EXPECT_EQ(c->usage.prompt_tokens, 7);
  EXPECT_EQ(c->usage.completion_tokens, 2);
  Result<Completion> chat = ParseCompletionBody(R"({"choices":[{"message":{"role":"assistant","content":null}}]})", true);
  ASSERT_TRUE(chat.ok());
  EXPECT_TRUE(chat->content_null);
  EXPECT_EQ(chat->usage.prompt_tokens, -1);
  EXPECT_FALSE(ParseCompletionBody("not json", false).ok());
  EXPECT_FALSE(ParseCompletionBody(R"({"choices":[]})", false).ok());
  EXPECT_FALSE(ParseCompletionBody(R"({"choices":[{"text":1}]})", false).ok());
}

TEST(OpenAiClient, StreamEventsTimeOnlyChunksWithText) {
  StreamedCompletion s;
  bool done = false;
  // A role-only chat chunk is not a token; content and reasoning_content are.
  ASSERT_TRUE(ApplyStreamEvent(R"({"choices":[{"delta":{"role":"assistant"}}]})", true, 1.0, &s, &done).ok());
  ASSERT_TRUE(ApplyStreamEvent(R"({"choices":[{"delta":{"reasoning_content":"hm"}}]})", true, 2.0, &s, &done).ok());
  ASSERT_TRUE(ApplyStreamEvent(R"({"choices":[{"delta":{"content":"Hi"},"finish_reason":"length"}]})", true, 3.0, &s, &done).ok());
  ASSERT_TRUE(ApplyStreamEvent(R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}})", true, 4.0, &s, &done).ok());
  EXPECT_FALSE(done);
  ASSERT_TRUE(ApplyStreamEvent("[DONE]", true, 5.0, &s, &done).ok());
  EXPECT_TRUE(done);
  EXPECT_EQ(s.token_times_s, (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(s.text, "hmHi");
  EXPECT_EQ(s.finish_reason, "length");
  EXPECT_EQ(s.usage.completion_tokens, 2);
  EXPECT_EQ(s.events, 5);
  Status err = ApplyStreamEvent(R"({"error":{"message":"engine died"}})", false, 6.0, &s, &done);
  EXPECT_NE(err.message().find("engine died"), std::string::npos);
  EXPECT_FALSE(ApplyStreamEvent("{oops", false, 6.0, &s, &done).ok());
}

// With continuous usage stats a chunk counts when the usage count rises, text or not (tokens
// that decode to nothing yet); the role chunk (0 tokens) and the final usage chunk do not.
TEST(OpenAiClient, StreamEventsWithContinuousUsageTimeEveryToken) {
  StreamedCompletion s;
  bool done = false;
  const char* events[] = {
      R"({"choices":[{"delta":{"role":"assistant","content":""}}],"usage":{"prompt_tokens":5,"completion_tokens":0}})",
      R"({"choices":[{"delta":{}}],"usage":{"prompt_tokens":5,"completion_tokens":1}})",
      R"({"choices":[{"delta":{"content":"ab"}}],"usage":{"prompt_tokens":5,"completion_tokens":3}})",
      R"({"choices":[{"delta":{},"finish_reason":"length"}],"usage":{"prompt_tokens":5,"completion_tokens":3}})",
      R"({"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}})"};
  double t = 1.0;
  for (const char* e : events) ASSERT_TRUE(ApplyStreamEvent(e, true, t++, &s, &done).ok()) << e;
  EXPECT_EQ(s.token_times_s, (std::vector<double>{2.0, 3.0}));
  EXPECT_EQ(s.text, "ab");
  EXPECT_EQ(s.usage.completion_tokens, 3);
}

TEST(OpenAiClient, ErrorBodies) {
  EXPECT_EQ(ErrorBodyMessage(R"({"error":{"message":"bad model","type":"invalid_request_error"}})"), "bad model");
  EXPECT_EQ(ErrorBodyMessage(R"({"detail":"x"})"), R"({"detail":"x"})");
  EXPECT_EQ(ErrorBodyMessage("Internal Server Error"), "Internal Server Error");
}

TEST(OpenAiClient, ConnectionRefusedNamesTheUrl) {
  // A port nobody listens on: bind, read it back, close.
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  const int port = ::kimirt::testing::BindLoopback(fd);
  ASSERT_GT(port, 0) << std::strerror(errno);  // bind and getsockname succeeded
  close(fd);
  Result<ServerUrl> url = ParseServerUrl("http://127.0.0.1:" + std::to_string(port));
  ASSERT_TRUE(url.ok());
  HttpOptions o;
  o.connect_timeout_s = 2;
  OpenAiClient client(*url, o);
  Result<Completion> c = client.Complete("completions", {{"prompt", "x"}});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("POST http://127.0.0.1:" + std::to_string(port) + "/v1/completions"), std::string::npos)
      << c.status().message();
  Result<StreamedCompletion> s = client.Stream("completions", {{"prompt", "x"}});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.status().message().find("/v1/completions"), std::string::npos) << s.status().message();
  Result<std::vector<std::string>> m = client.ListModels();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("GET http://127.0.0.1:" + std::to_string(port) + "/v1/models"), std::string::npos);
}

}  // namespace
}  // namespace kimirt::eval
