// SSE framing.
#include "kimirt/server/sse.h"

#include <gtest/gtest.h>

namespace kimirt {
namespace {

TEST(Sse, OneLinePayload) {
  EXPECT_EQ(SseEvent(R"({"a":1})"), "data: {\"a\":1}\n\n");
  EXPECT_EQ(SseEvent(""), "data: \n\n");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(Sse, LineBreaksBecomeSeveralDataLines) {
  // A client joins the data lines of one event with '\n', giving the payload back.
  EXPECT_EQ(SseEvent("a\nb"), "data: a\ndata: b\n\n");
  EXPECT_EQ(SseEvent("a\r\nb\rc"), "data: a\ndata: b\ndata: c\n\n");
  EXPECT_EQ(SseEvent("a\n"), "data: a\ndata: \n\n");
}

}  // namespace
}  // namespace kimirt
