// Tests for JsonScanner: RFC 8259 acceptance and rejection (with byte offsets), string
// decoding, strict integers, depth limit, and the escaping helper's round trip.
#include "kimirt/io/json_scanner.h"

#include <gtest/gtest.h>

#include <string>

namespace kimirt {
namespace {

std::string Decode(std::string_view json) {
  JsonScanner s(json);
  std::string_view out;
  Status st = s.ReadString(&out);
  EXPECT_TRUE(st.ok()) << st.ToString();
  EXPECT_TRUE(s.Finish().ok());
  return std::string(out);
}

TEST(JsonScanner, AcceptsValidDocuments) {
  const char* ok[] = {
      "{}", "[]", " { } ", "\t\r\n[\n]\n", "0", "-0", "12", "-12.5e+3", "1E-2", "0.0",
      "true", "false", "null", "\"\"", "\"a\\\"b\\\\c\\/d\\b\\f\\n\\r\\t\"",
      "{\"a\":[1,2,{\"b\":null}],\"c\":{\"d\":[]},\"e\":\"\\u00e9\\ud83d\\ude00\"}",
      "[\"\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80\"]",  // raw UTF-8: é € 😀
      "[1, 2 ,3 ]",
  };
  for (const char* doc : ok) {
    Status st = ValidateJson(doc);
    EXPECT_TRUE(st.ok()) << doc << ": " << st.ToString();
  }
}

TEST(JsonScanner, RejectsInvalidDocumentsWithByteOffset) {
  struct Case {
    std::string doc;
    size_t byte;  // where the error is reported
  };
  const Case bad[] = {
      {"", 0},
      {"{", 1},
      {"{\"a\":1,}", 7},       // trailing comma in an object
      {"[1,]", 3},             // trailing comma in an array
      {"[1 2]", 3},
      {"{\"a\" 1}", 5},
      {"{a:1}", 1},
      {"01", 1},               // leading zero
      {"1.", 2},
      {"-", 1},
      {"1e", 2},
      {".5", 0},
      {"+1", 0},
      {"tru", 0},
      {"nul", 0},
      {"{} x", 3},             // trailing garbage
      {"[] []", 3},
      {"\"abc", 0},            // unterminated
      {"\"a\x01\"", 2},        // raw control character
      {"\"\\x\"", 1},          // invalid escape
      {"\"\\u12\"", 1},
      {"\"\\ud800\"", 1},      // lone high surrogate
      {"\"\\ud800\\u0041\"", 1},
      {"\"\\udc00\"", 1},      // lone low surrogate
      {"\"\xc0\x80\"", 1},     // overlong NUL
      {"\"\xed\xa0\x80\"", 1}, // UTF-8-encoded surrogate
      {"\"\xf5\x80\x80\x80\"", 1},
      {"\"\xe2\x82\"", 1},     // truncated sequence
      {"\xef\xbb\xbf{}", 0},   // a BOM is not JSON
  };
  for (const Case& c : bad) {
    Status st = ValidateJson(c.doc);
    ASSERT_FALSE(st.ok()) << c.doc;
    EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
    const std::string want = "invalid JSON at byte " + std::to_string(c.byte) + ":";
    EXPECT_NE(st.message().find(want), std::string::npos) << c.doc << " -> " << st.message();
  }
}

TEST(JsonScanner, DecodesEscapesToUtf8) {
  EXPECT_EQ(Decode("\"plain\""), "plain");
  EXPECT_EQ(Decode("\"q\\\"b\\\\s\\/n\\nt\\t\""), "q\"b\\s/n\nt\t");
  EXPECT_EQ(Decode("\"\\u0041\\u00e9\\u20AC\""), "A\xc3\xa9\xe2\x82\xac");
  EXPECT_EQ(Decode("\"\\ud83d\\ude00\""), "\xf0\x9f\x98\x80");  // surrogate pair -> U+1F600
  EXPECT_EQ(Decode("\"\\udbff\\udfff\""), "\xf4\x8f\xbf\xbf");  // U+10FFFF
  EXPECT_EQ(Decode("\"a\\u0000b\""), std::string("a\0b", 3));
}

TEST(JsonScanner, SpecialBytesAtEveryPositionOfLongStrings) {
  // The string scan tests 16 bytes at a time; a special byte must be found wherever it sits.
  for (size_t pos = 0; pos < 40; ++pos) {
    const std::string a(pos, 'a'), b(40 - pos, 'b');
    EXPECT_EQ(Decode("\"" + a + "\\n" + b + "\""), a + "\n" + b) << pos;
    EXPECT_EQ(Decode("\"" + a + "\xc3\xa9" + b + "\""), a + "\xc3\xa9" + b) << pos;
    EXPECT_EQ(Decode("\"" + a + "\""), a) << pos;
    Status st = ValidateJson("\"" + a + "\x1f" + b + "\"");
    ASSERT_FALSE(st.ok()) << pos;
    EXPECT_NE(st.message().find("at byte " + std::to_string(pos + 1) + ":"), std::string::npos)
        << st.message();
    st = ValidateJson("\"" + a + "\xff" + b + "\"");
    ASSERT_FALSE(st.ok()) << pos;
    EXPECT_NE(st.message().find("at byte " + std::to_string(pos + 1) + ":"), std::string::npos)
        << st.message();
    EXPECT_FALSE(ValidateJson("\"" + a).ok()) << pos;  // unterminated
  }
}

TEST(JsonScanner, ReadUint64IsStrict) {
  auto read = [](std::string_view doc, uint64_t* v) {
    JsonScanner s(doc);
    return s.ReadUint64(v);
  };
  uint64_t v = 7;
  ASSERT_TRUE(read("0", &v).ok());
  EXPECT_EQ(v, 0u);
  ASSERT_TRUE(read(" 18446744073709551615", &v).ok());
  EXPECT_EQ(v, UINT64_MAX);
  for (const char* bad : {"-1", "1.5", "1e3", "1.0", "-0", "18446744073709551616",
                          "99999999999999999999999", "\"12\"", "null", "[1]"}) {
    Status st = read(bad, &v);
    EXPECT_FALSE(st.ok()) << bad;
    EXPECT_NE(st.message().find("integer"), std::string::npos) << bad << ": " << st.message();
  }
}

TEST(JsonScanner, DepthLimit) {
  const int max = JsonScanner::kMaxDepth;
  std::string ok = std::string(max, '[') + std::string(max, ']');
  EXPECT_TRUE(ValidateJson(ok).ok());
  std::string deep = std::string(max + 1, '[') + std::string(max + 1, ']');
  Status st = ValidateJson(deep);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("nesting"), std::string::npos) << st.message();
  // Far deeper input fails the same way, without recursing further.
  EXPECT_FALSE(ValidateJson(std::string(100000, '[')).ok());
  EXPECT_FALSE(ValidateJson(std::string(100000, '{')).ok());
}

TEST(JsonScanner, PullApiWalksObjects) {
  JsonScanner s(R"({"a": [1, 2], "b\u0021": "x\ny", "c": {}})");
  ASSERT_TRUE(s.BeginObject().ok());
  std::string_view key;
  std::vector<std::string> keys;
  for (;;) {
    auto more = s.NextMember(&key);
    ASSERT_TRUE(more.ok()) << more.status().ToString();
    if (!*more) break;
    keys.emplace_back(key);
    if (key == "a") {
      ASSERT_TRUE(s.BeginArray().ok());
      uint64_t sum = 0, v = 0;
      for (;;) {
        auto el = s.NextElement();
        ASSERT_TRUE(el.ok());
        if (!*el) break;
        ASSERT_TRUE(s.ReadUint64(&v).ok());
        sum += v;
      }
      EXPECT_EQ(sum, 3u);
    } else if (key == "b!") {
      std::string_view str;
      ASSERT_TRUE(s.ReadString(&str).ok());
      EXPECT_EQ(str, "x\ny");
    } else {
      auto kind = s.Peek();
      ASSERT_TRUE(kind.ok());
      EXPECT_EQ(*kind, JsonScanner::Kind::kObject);
      ASSERT_TRUE(s.SkipValue().ok());
    }
  }
  EXPECT_TRUE(s.Finish().ok());
  EXPECT_EQ(keys, (std::vector<std::string>{"a", "b!", "c"}));
}

TEST(JsonScanner, TypeErrorsNameTheKinds) {
  JsonScanner s("[1]");
  Status st = s.BeginObject();
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "expected object, got array");
  JsonScanner s2("5");
  std::string_view out;
  st = s2.ReadString(&out);
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.message(), "expected a string, got number");
}

TEST(JsonScanner, BeginObjectWithExpectationNamesWhatHadToBeAnObject) {
  JsonScanner s("[1]");
  Status st = s.BeginObject("\"weight_map\" must be an object");
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::kCorrupt);
  EXPECT_EQ(st.message(), "\"weight_map\" must be an object, got array");
  // An object is opened as by BeginObject().
  JsonScanner ok(" {\"a\":1}");
  ASSERT_TRUE(ok.BeginObject("unused").ok());
  std::string_view key;
  ASSERT_TRUE(*ok.NextMember(&key));
  EXPECT_EQ(key, "a");
  EXPECT_TRUE(ok.SkipValue().ok());
  EXPECT_FALSE(*ok.NextMember(&key));
  EXPECT_TRUE(ok.Finish().ok());
}

TEST(JsonScanner, AppendJsonStringRoundTrips) {
  std::string all;
  for (int c = 0; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  all += "\xc3\xa9\xf0\x9f\x98\x80";
  std::string json;
  AppendJsonString(&json, all);
  EXPECT_TRUE(IsValidUtf8(json));
  EXPECT_EQ(Decode(json), all);
  json.clear();
  AppendJsonString(&json, "a\"b\\c\n\x01");
  EXPECT_EQ(json, "\"a\\\"b\\\\c\\n\\u0001\"");
}

TEST(JsonScanner, IsValidUtf8) {
  EXPECT_TRUE(IsValidUtf8(""));
  EXPECT_TRUE(IsValidUtf8("abc\xc3\xa9\xe2\x82\xac\xf0\x9f\x98\x80"));
  EXPECT_FALSE(IsValidUtf8("\xc3"));
  EXPECT_FALSE(IsValidUtf8("\xc0\xaf"));
  EXPECT_FALSE(IsValidUtf8("\xed\xbf\xbf"));
  EXPECT_FALSE(IsValidUtf8("\xf4\x90\x80\x80"));
  EXPECT_FALSE(IsValidUtf8("\xff"));
}

}  // namespace
}  // namespace kimirt
