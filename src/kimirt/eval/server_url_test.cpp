#include "kimirt/eval/server_url.h"

#include <gtest/gtest.h>

namespace kimirt::eval {
namespace {

TEST(ServerUrl, AcceptsTheSpellingsUsersWrite) {
  for (const char* s : {"http://127.0.0.1:8000", "http://127.0.0.1:8000/", "http://127.0.0.1:8000/v1",
                        "http://127.0.0.1:8000/v1/", "http://127.0.0.1:8000/v1/completions",
                        "http://127.0.0.1:8000/v1/chat/completions", "127.0.0.1:8000"}) {
    Result<ServerUrl> u = ParseServerUrl(s);
    ASSERT_TRUE(u.ok()) << s << ": " << u.status().message();
    EXPECT_EQ(u->host, "127.0.0.1") << s;
    EXPECT_EQ(u->port, 8000) << s;
    EXPECT_EQ(u->api_path, "/v1") << s;
    EXPECT_EQ(u->ApiUrl("completions"), "http://127.0.0.1:8000/v1/completions") << s;
    EXPECT_EQ(u->RootPath("/metrics"), "/metrics") << s;
  }
}

TEST(ServerUrl, DefaultPortsPrefixesAndIpv6) {
  Result<ServerUrl> a = ParseServerUrl("http://localhost");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->port, 80);
  Result<ServerUrl> b = ParseServerUrl("https://example.test/proxy/v1");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->port, 443);
  EXPECT_EQ(b->api_path, "/proxy/v1");
  EXPECT_EQ(b->RootPath("/metrics"), "/proxy/metrics");
  Result<ServerUrl> c = ParseServerUrl("http://[::1]:9000/v1");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->Origin(), "http://[::1]:9000");
}

TEST(ServerUrl, RejectsWithTheUrlInTheMessage) {
  for (const char* s : {"", "ftp://h:1", "http://:80", "http://h:0", "http://h:99999", "http://h:12ab",
                        "http://h:1/api", "http://h:1/v1?x=1", "http://u@h:1"}) {
    Result<ServerUrl> u = ParseServerUrl(s);
    ASSERT_FALSE(u.ok()) << s;
    EXPECT_NE(u.status().message().find(std::string("\"") + s + "\""), std::string::npos) << u.status().message();
  }
}

}  // namespace
}  // namespace kimirt::eval
