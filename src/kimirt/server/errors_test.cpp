// The error kind → HTTP status / OpenAI error JSON mapping.
#include "kimirt/server/errors.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

namespace kimirt {
namespace {

TEST(ServerErrors, EveryKindHasItsStatusAndType) {
  struct Case {
    ApiErrorKind kind;
    int status;
    const char* type;
  };
  const Case cases[] = {
      {ApiErrorKind::kInvalidRequest, 400, "invalid_request_error"},
      {ApiErrorKind::kUnauthorized, 401, "authentication_error"},
      {ApiErrorKind::kModelNotFound, 404, "invalid_request_error"},
      {ApiErrorKind::kNotFound, 404, "not_found_error"},
      {ApiErrorKind::kMethodNotAllowed, 405, "invalid_request_error"},
      {ApiErrorKind::kPayloadTooLarge, 413, "invalid_request_error"},
      {ApiErrorKind::kQueueFull, 429, "rate_limit_error"},
      {ApiErrorKind::kClientClosed, 499, "client_closed_request"},
      {ApiErrorKind::kInternal, 500, "server_error"},
      {ApiErrorKind::kNotImplemented, 501, "not_supported_error"},
      {ApiErrorKind::kShuttingDown, 503, "unavailable_error"},
  };
  for (const Case& c : cases) {
    ErrorReply r = RenderError({c.kind, "msg", {}, {}});
    EXPECT_EQ(r.http_status, c.status);
    EXPECT_EQ(HttpStatusOf(c.kind), c.status);
    nlohmann::json j = nlohmann::json::parse(r.body);
    ASSERT_TRUE(j.contains("error")) << r.body;
    const nlohmann::json& e = j["error"];
    EXPECT_EQ(e["message"], "msg");
    EXPECT_EQ(e["type"], c.type);
    EXPECT_TRUE(e["param"].is_null());
    EXPECT_TRUE(e.contains("code"));
    EXPECT_EQ(r.body.find('\n'), std::string::npos);  // one line: safe inside an SSE event
  }
}

TEST(ServerErrors, ParamAndCode) {
  ErrorReply r = RenderError(InvalidRequest("`top_p` must be in (0, 1], got 2", "top_p"));
  nlohmann::json e = nlohmann::json::parse(r.body)["error"];
  EXPECT_EQ(e["param"], "top_p");
  EXPECT_TRUE(e["code"].is_null());
  r = RenderError({ApiErrorKind::kModelNotFound, "no", "model", {}});
  e = nlohmann::json::parse(r.body)["error"];
  EXPECT_EQ(e["code"], "model_not_found");
  ApiError custom = InvalidRequest("long", "messages");
  custom.code = "context_length_exceeded";
  EXPECT_EQ(nlohmann::json::parse(RenderError(custom).body)["error"]["code"], "context_length_exceeded");
  // Bytes that are not UTF-8 in a message do not break the JSON.
  r = RenderError(InvalidRequest("bad \xff byte"));
  EXPECT_TRUE(nlohmann::json::accept(r.body));
}

TEST(ServerErrors, FromStatus) {
  EXPECT_EQ(ApiErrorFromStatus(InvalidArgument("x")).kind, ApiErrorKind::kInvalidRequest);
  EXPECT_EQ(ApiErrorFromStatus(OutOfRange("x")).kind, ApiErrorKind::kInvalidRequest);
  EXPECT_EQ(ApiErrorFromStatus(Unsupported("x")).kind, ApiErrorKind::kInvalidRequest);
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhausted("queue")).kind, ApiErrorKind::kQueueFull);
  EXPECT_EQ(ApiErrorFromStatus(ResourceExhausted("queue"), /*shutting_down=*/true).kind,
            ApiErrorKind::kShuttingDown);
  EXPECT_EQ(ApiErrorFromStatus(Internal("bug")).kind, ApiErrorKind::kInternal);
  EXPECT_EQ(ApiErrorFromStatus(IoError("disk")).kind, ApiErrorKind::kInternal);
  ApiError e = ApiErrorFromStatus(InvalidArgument("messages[1].role: unknown"), false, "messages[1].role");
  EXPECT_EQ(e.param, "messages[1].role");
  EXPECT_EQ(e.message, "messages[1].role: unknown");
}

}  // namespace
}  // namespace kimirt
