// Tests for K3CompletionParser (spec §10.3–10.4): channel splitting, typed tool-call arguments,
// the OpenAI tool_calls JSON, truncation, a prompt that already opened think or response, literal
// markup inside values, and byte-by-byte feeding == feeding at once.
#include "kimirt/tokenizer/output_parser.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kimirt {
namespace {

struct Parsed {
  std::string reasoning;
  std::string content;
  std::vector<K3ParsedToolCall> calls;
  bool ended = false;
};

// Feeds `text` in pieces of `chunk` bytes (0 = all at once) and checks that the deltas add up to
// the accumulated state.
Parsed Parse(std::string_view text, K3ParseStart start = K3ParseStart::kThink, size_t chunk = 0) {
  K3CompletionParser p(start);
  Parsed from_deltas;
  auto take = [&](const K3ParseDelta& d) {
    from_deltas.reasoning += d.reasoning;
    from_deltas.content += d.content;
    from_deltas.calls.insert(from_deltas.calls.end(), d.tool_calls.begin(), d.tool_calls.end());
  };
  if (chunk == 0) {
    take(p.Feed(text));
  } else {
    for (size_t i = 0; i < text.size(); i += chunk) take(p.Feed(text.substr(i, chunk)));
  }
  from_deltas.ended = p.message_ended();  // before Finish(), which always ends
  take(p.Finish());
  EXPECT_EQ(from_deltas.reasoning, p.reasoning());
  EXPECT_EQ(from_deltas.content, p.content());
  EXPECT_EQ(from_deltas.calls.size(), p.tool_calls().size());
  return from_deltas;
}

constexpr char kToolCompletion[] =
    "Need weather.<|close|>think<|sep|><|open|>response<|sep|>Checking.<|close|>response<|sep|>"
    "<|open|>tools<|sep|>"
    "<|open|>call tool=\"get_weather\" index=\"1\"<|sep|>"
    "<|open|>argument key=\"city\" type=\"string\"<|sep|> Zürich <|close|>argument<|sep|>"
    "<|open|>argument key=\"days\" type=\"number\"<|sep|>3<|close|>argument<|sep|>"
    "<|open|>argument key=\"f\" type=\"number\"<|sep|> 2.50 <|close|>argument<|sep|>"
    "<|open|>argument key=\"ok\" type=\"boolean\"<|sep|>True<|close|>argument<|sep|>"
    "<|open|>argument key=\"x\" type=\"null\"<|sep|>null<|close|>argument<|sep|>"
    "<|open|>argument key=\"o\" type=\"object\"<|sep|>{\"a\":[1,{\"b\":null}]}<|close|>argument<|sep|>"
    "<|open|>argument key=\"q&quot;\" type=\"string\"<|sep|>a<|close|>argument<|sep|>"
    "<|close|>call<|sep|>"
    "<|open|>call tool=\"search\" index=\"2\"<|sep|><|open|>json type=\"object\"<|sep|>{raw"
    "<|close|>json<|sep|><|close|>call<|sep|>"
    "<|close|>tools<|sep|><|close|>message<|sep|><|end_of_msg|>";

TEST(OutputParser, SplitsReasoningContentAndTypedToolCalls) {
  const Parsed p = Parse(kToolCompletion);
  EXPECT_EQ(p.reasoning, "Need weather.");
  EXPECT_EQ(p.content, "Checking.");
  EXPECT_TRUE(p.ended);
  ASSERT_EQ(p.calls.size(), 2u);
  EXPECT_EQ(p.calls[0].id, "call_0");
  EXPECT_EQ(p.calls[0].name, "get_weather");
  // Strings verbatim (whitespace kept), other types parsed; json.dumps spelling.
  EXPECT_EQ(p.calls[0].arguments,
            R"({"city": " Zürich ", "days": 3, "f": 2.5, "ok": true, "x": null,)"
            R"( "o": {"a": [1, {"b": null}]}, "q\"": "a"})");
  EXPECT_TRUE(p.calls[0].complete);
  EXPECT_EQ(p.calls[1].name, "search");
  EXPECT_EQ(p.calls[1].arguments, "{raw");  // an unparseable-arguments block comes back raw
}

TEST(OutputParser, ToolCallsJsonIsTheOpenAIShape) {
  K3CompletionParser p;
  p.Feed(kToolCompletion);
  p.Finish();
  EXPECT_TRUE(p.ToolCallsJson().starts_with(
      R"([{"id":"call_0","type":"function","function":{"name":"get_weather","arguments":")"
      R"({\"city\": \" Zürich \", \"days\": 3, )"))
      << p.ToolCallsJson();
  EXPECT_TRUE(p.ToolCallsJson().ends_with(R"("arguments":"{raw"}}])")) << p.ToolCallsJson();
  K3CompletionParser none;
  none.Finish();
  EXPECT_EQ(none.ToolCallsJson(), "[]");
}

TEST(OutputParser, ValuesThatDoNotFitTheirTypeStayStrings) {
  const Parsed p = Parse(
      "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|>"
      "<|open|>argument key=\"n\" type=\"number\"<|sep|>about 3<|close|>argument<|sep|>"
      "<|open|>argument key=\"b\" type=\"boolean\"<|sep|>yes<|close|>argument<|sep|>"
      "<|open|>argument key=\"o\" type=\"object\"<|sep|>{oops<|close|>argument<|sep|>"
      "<|open|>argument key=\"u\"<|sep|>[1, 2]<|close|>argument<|sep|>"
      "<|open|>argument key=\"n\" type=\"number\"<|sep|>-1e3<|close|>argument<|sep|>"
      "<|close|>call<|sep|><|close|>tools<|sep|>");
  ASSERT_EQ(p.calls.size(), 1u);
  // A repeated key keeps its first place and takes the last value.
  EXPECT_EQ(p.calls[0].arguments, R"({"n": -1000.0, "b": "yes", "o": "{oops", "u": [1, 2]})");
}

TEST(OutputParser, StartInResponseOrMessage) {
  const Parsed r = Parse("Plain answer.<|close|>response<|sep|><|close|>message<|sep|>",
                         K3ParseStart::kResponse);
  EXPECT_EQ(r.reasoning, "");
  EXPECT_EQ(r.content, "Plain answer.");
  EXPECT_TRUE(r.ended);

  const Parsed m = Parse("<|open|>think<|sep|>hmm<|close|>think<|sep|><|open|>response<|sep|>ok"
                         "<|close|>response<|sep|>",
                         K3ParseStart::kMessage);
  EXPECT_EQ(m.reasoning, "hmm");
  EXPECT_EQ(m.content, "ok");
  EXPECT_FALSE(m.ended);

  // The model skipped the framing entirely: the text is still the answer.
  EXPECT_EQ(Parse("just text", K3ParseStart::kMessage).content, "just text");
}

TEST(OutputParser, TruncatedOutputKeepsWhatArrived) {
  // Cut inside reasoning.
  Parsed p = Parse("still thinking <|clo");
  EXPECT_EQ(p.reasoning, "still thinking <|clo");
  EXPECT_FALSE(p.ended);

  // Cut inside the second argument of a call: the call is returned incomplete with the finished
  // argument only.
  p = Parse("r<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"
            "<|open|>tools<|sep|><|open|>call tool=\"f\" index=\"1\"<|sep|>"
            "<|open|>argument key=\"a\" type=\"number\"<|sep|>1<|close|>argument<|sep|>"
            "<|open|>argument key=\"b\" type=\"string\"<|sep|>hal");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_FALSE(p.calls[0].complete);
  EXPECT_EQ(p.calls[0].name, "f");
  EXPECT_EQ(p.calls[0].arguments, R"({"a": 1})");

  // Cut inside a call opener: no call, nothing leaks into content.
  p = Parse("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f");
  EXPECT_TRUE(p.calls.empty());
  EXPECT_EQ(p.content, "");

  // The stop token ends an open call as cut off.
  p = Parse("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"g\"<|sep|><|end_of_msg|>"
            "ignored");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_FALSE(p.calls[0].complete);
  EXPECT_TRUE(p.ended);
}

TEST(OutputParser, MissingThinkCloseAndLenientCloses) {
  // response opened without closing think first; close tags without <|sep|>.
  const Parsed p = Parse("reason<|open|>response<|sep|>answer<|close|>response"
                         "<|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|close|>call"
                         "<|close|>tools<|close|>message<|end_of_msg|>");
  EXPECT_EQ(p.reasoning, "reason");
  EXPECT_EQ(p.content, "answer");
  ASSERT_EQ(p.calls.size(), 1u);
  EXPECT_TRUE(p.calls[0].complete);
  EXPECT_EQ(p.calls[0].arguments, "{}");
  EXPECT_TRUE(p.ended);
}

TEST(OutputParser, UnexpectedMarkupStaysLiteralText) {
  // Inside a channel, markup that is not its own close is kept as written; a '<' or "<|" that
  // starts no marker is plain text.
  const Parsed p = Parse("a <b> <|x|> <|open|>foo bar=\"1\"<|sep|>z<|close|>foo<|sep|>"
                         "<|close|>think<|sep|><|open|>response<|sep|>1 < 2 <|clos"
                         "e|>x y<|close|>response<|sep|>");
  EXPECT_EQ(p.reasoning, "a <b> <|x|> <|open|>foo bar=\"1\"<|sep|>z<|close|>foo<|sep|>");
  EXPECT_EQ(p.content, "1 < 2 <|close|>x y");

  // A string argument may contain markers other than its own close.
  const Parsed v = Parse("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|>"
                         "<|open|>argument key=\"html\" type=\"string\"<|sep|>"
                         "<|open|>p<|sep|>hi<|close|>p<|sep|><|sep|><|close|>argument<|sep|>"
                         "<|close|>call<|sep|>");
  ASSERT_EQ(v.calls.size(), 1u);
  EXPECT_EQ(v.calls[0].arguments, R"({"html": "<|open|>p<|sep|>hi<|close|>p<|sep|><|sep|>"})");
}

TEST(OutputParser, StreamingHoldsBackOnlyPossibleMarkers) {
  K3CompletionParser p;
  EXPECT_EQ(p.Feed("abc<|clo").reasoning, "abc");
  const K3ParseDelta d = p.Feed("se|>think<|sep|><|open|>response<|sep|>Hi <");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Hi ");
  EXPECT_EQ(p.Feed("3").content, "<3");
  EXPECT_EQ(p.Finish().content, "");
}

// Issue 11 defect 6: after a bare <|open|> the reasoning went silent until the end of the
// completion, then came as one piece that began with the raw marker. It must keep streaming,
// without the marker.
TEST(OutputParser, BareOpenMarkerKeepsReasoningStreaming) {
  K3CompletionParser p;
  EXPECT_EQ(p.Feed("<|open|>").reasoning, "");
  EXPECT_EQ(p.Feed("The user").reasoning, "");  // could still be `<|open|>The user="…"<|sep|>`
  EXPECT_EQ(p.Feed(" asks about").reasoning, "The user asks about");
  EXPECT_EQ(p.Feed(" Paris.").reasoning, " Paris.");
  const K3ParseDelta d = p.Feed("<|close|>think<|sep|><|open|>response<|sep|>Sunny.");
  EXPECT_EQ(d.reasoning, "");
  EXPECT_EQ(d.content, "Sunny.");
  EXPECT_EQ(p.reasoning(), "The user asks about Paris.");

  // Malformed openers give their text back at the first byte that cannot belong to a tag.
  EXPECT_EQ(K3CompletionParser().Feed("<|open|>\nLet me").reasoning, "\nLet me");
  EXPECT_EQ(K3CompletionParser().Feed("<|open|>think\nLet me").reasoning, "think\nLet me");
  EXPECT_EQ(K3CompletionParser().Feed("<|open|>a b=1").reasoning, "a b=1");

  // The model re-opening the channel it is in is framing, not reasoning.
  EXPECT_EQ(Parse("<|open|>think<|sep|>hmm<|close|>think<|sep|>").reasoning, "hmm");
  EXPECT_EQ(Parse("<|open|>response<|sep|>ok", K3ParseStart::kResponse).content, "ok");
  // A bare marker cut off at the end is dropped too; inside a value it stays literal.
  EXPECT_EQ(Parse("r<|open|>").reasoning, "r");
  const Parsed v = Parse("<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|>"
                         "<|open|>argument key=\"s\" type=\"string\"<|sep|>a<|open|>b c<|close|>argument<|sep|>"
                         "<|close|>call<|sep|>");
  ASSERT_EQ(v.calls.size(), 1u);
  EXPECT_EQ(v.calls[0].arguments, R"({"s": "a<|open|>b c"})");
}

// Whether two parses agree on all a client sees: reasoning, content, and each call's name,
// arguments and completeness.
::testing::AssertionResult SameParse(const Parsed& got, const Parsed& want) {
  auto differs = [](const char* what, const auto& a, const auto& b) {
    return ::testing::AssertionFailure() << what << ": got " << ::testing::PrintToString(a)
                                         << ", want " << ::testing::PrintToString(b);
  };
  if (got.reasoning != want.reasoning) return differs("reasoning", got.reasoning, want.reasoning);
  if (got.content != want.content) return differs("content", got.content, want.content);
  if (got.calls.size() != want.calls.size()) {
    return differs("number of calls", got.calls.size(), want.calls.size());
  }
  for (size_t i = 0; i < want.calls.size(); ++i) {
    const K3ParsedToolCall& g = got.calls[i];
    const K3ParsedToolCall& w = want.calls[i];
    if (g.name != w.name) return differs("call name", g.name, w.name);
    if (g.arguments != w.arguments) return differs("call arguments", g.arguments, w.arguments);
    if (g.complete != w.complete) return differs("call complete", g.complete, w.complete);
  }
  return ::testing::AssertionSuccess();
}

TEST(OutputParser, ByteByByteEqualsAllAtOnce) {
  const std::vector<std::string> corpus = {
      kToolCompletion,
      "r<|close|>think<|sep|><|open|>response<|sep|>1 < 2 <|clo",
      "<|open|><|close|><|sep|><|end_of_msg|>",
      "a<|open|>response<|close|>think<|sep|>b",
      "x<|close|>thinkXYZ<|sep|>y<|close|>",
      "思考 😀<|close|>think<|sep|><|open|>response<|sep|>答え<|close|>response<|sep|>",
      "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"a&amp;b\"<|sep|>"
      "<|open|>argument key=\"k\" type=\"array\"<|sep|>[1,<|close|>x<|sep|>2]",
      std::string("<|open|>") + std::string(5000, 'q') + "<|sep|>tail",
      "<|open|>The user asks<|close|>think<|sep|>ok",
      "<|open|>think<|sep|>a<|open|>x=\"1\" b<|sep|>c<|open|>k v=\"<\" w=\"x\"<|sep|>",
      "<|close|>think<|sep|><|open|>tools<|sep|><|open|>call tool=\"f\"<|sep|><|open|>json<|sep|>{<|open|>z y<|close|>json<|sep|>",
  };
  for (const std::string& text : corpus) {
    for (K3ParseStart start :
         {K3ParseStart::kThink, K3ParseStart::kResponse, K3ParseStart::kMessage}) {
      const Parsed whole = Parse(text, start);
      for (size_t chunk : {1, 2, 3, 7}) {
        EXPECT_TRUE(SameParse(Parse(text, start, chunk), whole)) << text << " chunk " << chunk;
      }
    }
  }
}

// Random sequences of grammar fragments (seeded): whatever the structure, the split of the input
// must not change the result.
TEST(OutputParser, RandomFragmentsSplitEquivalence) {
  const std::vector<std::string> fragments = {
      "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>", "think", "response", "tools",
      "message", "call tool=\"f\" index=\"1\"", "argument key=\"k\" type=\"number\"",
      "argument key=\"s\" type=\"string\"", "json type=\"object\"", "argument", "call", "json",
      "<", "|", ">", "<|", "12", " ", "\n", "é", "😀", "{\"a\": [1]}", "&quot;"};
  std::mt19937 rng(1234);
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int n = static_cast<int>(rng() % 40);
    for (int i = 0; i < n; ++i) text += fragments[rng() % fragments.size()];
    const auto start = static_cast<K3ParseStart>(rng() % 3);
    const Parsed whole = Parse(text, start);
    ASSERT_TRUE(SameParse(Parse(text, start, 1), whole)) << text;
  }
}

TEST(OutputParser, IdPrefixAndStartForOptions) {
  K3CompletionParser p(K3ParseStart::kResponse, "call_req7_");
  p.Feed("<|open|>tools<|sep|><|open|>call tool=\"a\"<|sep|><|close|>call<|sep|>"
         "<|open|>call tool=\"b\"<|sep|><|close|>call<|sep|>");
  p.Finish();
  ASSERT_EQ(p.tool_calls().size(), 2u);
  EXPECT_EQ(p.tool_calls()[1].id, "call_req7_1");

  ChatOptions o;
  EXPECT_EQ(K3ParseStartFor(o), K3ParseStart::kThink);
  o.thinking = false;
  EXPECT_EQ(K3ParseStartFor(o), K3ParseStart::kResponse);
  o.add_generation_prompt = false;
  EXPECT_EQ(K3ParseStartFor(o), K3ParseStart::kMessage);
}

}  // namespace
}  // namespace kimirt
