#include "kimirt/eval/sse_parser.h"

#include <gtest/gtest.h>

namespace kimirt::eval {
namespace {

std::vector<std::string> ParseInPieces(const std::string& stream, const std::vector<size_t>& cuts) {
  SseParser p;
  std::vector<std::string> events;
  size_t prev = 0;
  for (size_t c : cuts) {
    p.Feed(std::string_view(stream).substr(prev, c - prev), &events);
    prev = c;
  }
  p.Feed(std::string_view(stream).substr(prev), &events);
  p.Finish(&events);
  return events;
}

// A stream with every line ending, a comment, a multi-line event and non-data fields.
const std::string kStream =
    "data: {\"a\":1}\n\n"
    ": ping\r\n\r\n"
    "event: message\r\ndata: {\"b\":2}\r\n\r\n"
    "data:first\ndata: second\n\n"
    "id: 7\rdata: {\"c\":\"x\\ny\"}\r\r"
    "data: [DONE]\n\n";
const std::vector<std::string> kExpected = {"{\"a\":1}", "{\"b\":2}", "first\nsecond", "{\"c\":\"x\\ny\"}", "[DONE]"};

TEST(SseParser, WholeStream) { EXPECT_EQ(ParseInPieces(kStream, {}), kExpected); }

TEST(SseParser, EverySingleCut) {
  for (size_t cut = 0; cut <= kStream.size(); ++cut) {
    EXPECT_EQ(ParseInPieces(kStream, {cut}), kExpected) << "cut at " << cut;
  }
}

TEST(SseParser, EveryPairOfCuts) {
  for (size_t a = 0; a <= kStream.size(); ++a) {
    for (size_t b = a; b <= kStream.size(); ++b) {
      ASSERT_EQ(ParseInPieces(kStream, {a, b}), kExpected) << "cuts at " << a << ", " << b;
    }
  }
}

TEST(SseParser, ByteByByte) {
  std::vector<size_t> cuts;
  for (size_t i = 1; i < kStream.size(); ++i) cuts.push_back(i);
  EXPECT_EQ(ParseInPieces(kStream, cuts), kExpected);
}

TEST(SseParser, UnterminatedFinalEventIsKept) {
  EXPECT_EQ(ParseInPieces("data: {\"x\":1}\n\ndata: [DONE]", {}), (std::vector<std::string>{"{\"x\":1}", "[DONE]"}));
}

TEST(SseParser, EmptyDataLineMakesAnEmptyEvent) {
  EXPECT_EQ(ParseInPieces("data\n\ndata:\n\n\n\n", {}), (std::vector<std::string>{"", ""}));
}

}  // namespace
}  // namespace kimirt::eval
