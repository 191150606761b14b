// Tests for the K3 XTML renderer (spec §10.3): the exact marker/text segment sequence for every
// message kind, the fixed system-message bodies, attribute escaping, argument typing, tool-result
// ordering, Python json.dumps spelling, segment-wise encoding, and render → parse round trips.
// Expected segments were cross-checked against encoding_k3.py (docs/chat-format.md).
#include "kimirt/tokenizer/chat_renderer.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kimirt/tokenizer/detokenizer.h"
#include "kimirt/tokenizer/fake_tokenizer_test_util.h"
#include "kimirt/tokenizer/output_parser.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

using testing::FakeTokenizer;

// Expected-segment builders, written independently of the renderer's own helpers.
using Segs = std::vector<ChatSegment>;
ChatSegment M(std::string s) { return {true, std::move(s)}; }
ChatSegment T(std::string s) { return {false, std::move(s)}; }
void Add(Segs* out, const Segs& more) { out->insert(out->end(), more.begin(), more.end()); }
using Attrs = std::vector<std::pair<std::string, std::string>>;
Segs Open(std::string tag, Attrs attrs = {}) {
  Segs s = {M("<|open|>"), T(tag)};
  for (auto& [k, v] : attrs) Add(&s, {T(" " + k), T("=\""), T(v), T("\"")});
  s.push_back(M("<|sep|>"));
  return s;
}
Segs Close(std::string tag) { return {M("<|close|>"), T(tag), M("<|sep|>")}; }
// A whole element: its opener with `attrs`, `body`, its closer.
Segs Element(std::string tag, Attrs attrs, const Segs& body) {
  Segs s = Open(tag, std::move(attrs));
  Add(&s, body);
  Add(&s, Close(tag));
  return s;
}
// A whole message: the message element, then <|end_of_msg|>.
Segs Message(Attrs attrs, const Segs& body) {
  Segs s = Element("message", std::move(attrs), body);
  s.push_back(M("<|end_of_msg|>"));
  return s;
}
Segs SystemMessage(std::string type, std::string body) {
  return Message({{"role", "system"}, {"type", type}}, {T(body)});
}

// Options that render only the given messages: no thinking-effort message, no generation prompt.
ChatOptions MessagesOnly() {
  ChatOptions o;
  o.thinking_effort.reset();
  o.add_generation_prompt = false;
  return o;
}

ChatMessage User(std::string text) {
  ChatMessage m;
  m.role = "user";
  m.content = std::move(text);
  return m;
}

Segs Render(const std::vector<ChatMessage>& messages, const ChatOptions& options = {},
            const std::vector<ToolSpec>& tools = {}) {
  Result<Segs> r = RenderK3Chat(messages, tools, options);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Segs{};
}

std::string Dump(const Segs& segs) {
  std::string out;
  for (const ChatSegment& s : segs) out += (s.marker ? "M[" : "T[") + s.text + "] ";
  return out;
}

#define EXPECT_SEGS(actual, expected) EXPECT_EQ(Dump(actual), Dump(expected))

const char kEffortMaxBody[] =
    "`thinking_effort` guides on how much to think in your thinking channel (not including the "
    "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
    "Now the system is invoked with `thinking_effort=max`.";

TEST(ChatK3Render, SingleUserMessageWithDefaultOptions) {
  // Defaults = apply_chat_template(): thinking on, thinking_effort "max", generation prompt.
  const Segs want = {
      M("<|open|>"), T("message"), T(" role"), T("=\""), T("system"), T("\""), T(" type"),
      T("=\""), T("thinking-effort"), T("\""), M("<|sep|>"), T(kEffortMaxBody), M("<|close|>"),
      T("message"), M("<|sep|>"), M("<|end_of_msg|>"),
      M("<|open|>"), T("message"), T(" role"), T("=\""), T("user"), T("\""), M("<|sep|>"),
      T("Hello"), M("<|close|>"), T("message"), M("<|sep|>"), M("<|end_of_msg|>"),
      M("<|open|>"), T("message"), T(" role"), T("=\""), T("assistant"), T("\""), M("<|sep|>"),
      M("<|open|>"), T("think"), M("<|sep|>")};
  EXPECT_SEGS(Render({User("Hello")}), want);
}

TEST(ChatK3Render, ThinkingOffOpensResponseAndDropsEffort) {
  ChatOptions o;
  o.thinking = false;  // the effort message only exists in thinking mode
  Segs want = Message({{"role", "user"}}, {T("Hi")});
  Add(&want, Open("message", {{"role", "assistant"}}));
  Add(&want, Open("response"));
  EXPECT_SEGS(Render({User("Hi")}, o), want);
  EXPECT_EQ(JoinSegments(want),
            "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>"
            "<|open|>message role=\"assistant\"<|sep|><|open|>response<|sep|>");
}

TEST(ChatK3Render, EveryThinkingEffortNamesItself) {
  for (auto [effort, name] : {std::pair{ThinkingEffort::kLow, "low"},
                              {ThinkingEffort::kMedium, "medium"},
                              {ThinkingEffort::kHigh, "high"},
                              {ThinkingEffort::kMax, "max"}}) {
    ChatOptions o;
    o.thinking_effort = effort;
    o.add_generation_prompt = false;
    const Segs segs = Render({}, o);
    ASSERT_EQ(segs.size(), 16u);
    EXPECT_TRUE(segs[11].text.ends_with(std::string("`thinking_effort=") + name + "`."));
    EXPECT_EQ(*ParseThinkingEffort(name), effort);
  }
  EXPECT_FALSE(ParseThinkingEffort("extreme").ok());
}

TEST(ChatK3Render, SystemAndUserWithNamesAndEscapedAttributes) {
  ChatOptions o = MessagesOnly();
  ChatMessage sys;
  sys.role = "system";
  sys.content = "Be terse.";
  sys.name = "ops";
  ChatMessage user = User("hi");
  user.name = "A&\"B\"";
  Segs want = Message({{"role", "system"}, {"name", "ops"}}, {T("Be terse.")});
  Add(&want, Message({{"role", "user"}, {"name", "A&amp;&quot;B&quot;"}}, {T("hi")}));
  EXPECT_SEGS(Render({sys, user}, o), want);
}

TEST(ChatK3Render, ContentPartsAreSeparateSegmentsAndEmptyOnesVanish) {
  ChatOptions o = MessagesOnly();
  ChatMessage m;
  m.role = "user";
  m.content_parts = {{ContentPart::Type::kText, "one "}, {ContentPart::Type::kText, ""},
                     {ContentPart::Type::kText, "two"}};
  EXPECT_SEGS(Render({m}, o), Message({{"role", "user"}}, {T("one "), T("two")}));
  // No content segment at all.
  EXPECT_SEGS(Render({User("")}, o), Message({{"role", "user"}}, {}));
}

ChatMessage AssistantWithCalls() {
  ChatMessage a;
  a.role = "assistant";
  a.content = "Checking.";
  a.reasoning_content = "  The user wants weather.\n";
  a.tool_calls = {
      {"c1", "get_weather",
       R"({"city": "Zürich", "days": 3, "f": 2.50, "ok": true, "x": null,)"
       R"( "o": {"z": 1, "a": [1, 2]}, "arr": ["é", 1e-7]})"},
      {"c2", "search", "not json {"},
      {"c3", "search", "  \n "},
  };
  return a;
}

TEST(ChatK3Render, AssistantThinkResponseAndTypedArguments) {
  ChatOptions o = MessagesOnly();
  Segs body = Element("think", {}, {T("  The user wants weather.\n")});  // reasoning is not stripped
  Add(&body, Element("response", {}, {T("Checking.")}));
  Add(&body, Open("tools"));
  Add(&body, Open("call", {{"tool", "get_weather"}, {"index", "1"}}));
  // Keys in the client's order; non-strings as json.dumps with ", " / ": " separators.
  const std::vector<std::array<std::string, 3>> args = {
      {"city", "string", "Zürich"},       {"days", "number", "3"},
      {"f", "number", "2.5"},             {"ok", "boolean", "true"},
      {"x", "null", "null"},              {"o", "object", "{\"z\": 1, \"a\": [1, 2]}"},
      {"arr", "array", "[\"é\", 1e-07]"}};
  for (const auto& [key, type, value] : args) {
    Add(&body, Element("argument", {{"key", key}, {"type", type}}, {T(value)}));
  }
  Add(&body, Close("call"));
  // Unparseable arguments travel verbatim in one json element.
  Add(&body, Element("call", {{"tool", "search"}, {"index", "2"}},
                     Element("json", {{"type", "object"}}, {T("not json {")})));
  // Blank arguments: an empty call.
  Add(&body, Element("call", {{"tool", "search"}, {"index", "3"}}, {}));
  Add(&body, Close("tools"));
  EXPECT_SEGS(Render({AssistantWithCalls()}, o), Message({{"role", "assistant"}}, body));
}

TEST(ChatK3Render, AssistantThinkChannelIsStructuralInThinkingModeOnly) {
  ChatOptions o = MessagesOnly();
  ChatMessage a;
  a.role = "assistant";
  a.content = "Done.";
  a.reasoning_content = " \n\t\xE3\x80\x80";  // blank by Python's str.strip (U+3000 included)
  a.name = "bot";
  const Attrs attrs = {{"role", "assistant"}, {"name", "bot"}};
  const Segs response = Element("response", {}, {T("Done.")});
  Segs body = Element("think", {}, {});
  Add(&body, response);
  EXPECT_SEGS(Render({a}, o), Message(attrs, body));

  o.thinking = false;
  a.reasoning_content = "ignored without thinking";
  EXPECT_SEGS(Render({a}, o), Message(attrs, response));
}

ChatMessage ToolResult(std::string id, std::string content, std::string name = "") {
  ChatMessage m;
  m.role = "tool";
  m.tool_call_id = std::move(id);
  m.content = std::move(content);
  m.name = std::move(name);
  return m;
}

Segs ToolMessage(std::string tool, std::string index, std::string content) {
  return Message({{"role", "tool"}, {"tool", tool}, {"index", index}}, {T(content)});
}

// `before`, then a tool message per {tool, index, content}.
Segs WithToolMessages(Segs before, const std::vector<std::array<std::string, 3>>& tool_messages) {
  for (const auto& [tool, index, content] : tool_messages) {
    Add(&before, ToolMessage(tool, index, content));
  }
  return before;
}

TEST(ChatK3Render, ToolResultsAreSortedIntoCallOrderAndIndexed) {
  ChatOptions o = MessagesOnly();
  const ChatMessage a = AssistantWithCalls();
  // Results arrive as c2, c3, c1: the run is fully matched, so it is re-sorted by call position
  // and each takes its call's name (a stale `name` is overridden).
  const Segs got = Render({a, ToolResult("c2", "r2", "stale"), ToolResult("c3", "r3"),
                           ToolResult("c1", "r1")}, o);
  EXPECT_SEGS(got, WithToolMessages(Render({a}, o), {{"get_weather", "1", "r1"},
                                                     {"search", "2", "r2"},
                                                     {"search", "3", "r3"}}));
}

TEST(ChatK3Render, PartlyMatchedToolRunKeepsOrderAndNamesByNameOrPosition) {
  ChatOptions o = MessagesOnly();
  const ChatMessage a = AssistantWithCalls();
  // "zzz" matches nothing, so the run stays as sent: names come from `name`, else the call at the
  // same position.
  const Segs got = Render({a, ToolResult("zzz", "A"), ToolResult("c1", "B", "explicit"),
                           ToolResult("", "C")}, o);
  EXPECT_SEGS(got, WithToolMessages(Render({a}, o), {{"get_weather", "1", "A"},
                                                     {"explicit", "2", "B"},
                                                     {"search", "3", "C"}}));
}

TEST(ChatK3Render, ToolMessageIndexRestartsAfterEachAssistant) {
  ChatOptions o = MessagesOnly();
  ChatMessage a1;
  a1.role = "assistant";
  a1.tool_calls = {{"x", "f", "{}"}};
  ChatMessage a2 = a1;
  a2.tool_calls = {{"y", "g", "{}"}};
  const Segs got = Render({a1, ToolResult("x", "1"), a2, ToolResult("y", "2")}, o);
  Segs want = Render({a1}, o);
  Add(&want, ToolMessage("f", "1", "1"));
  Add(&want, Render({a2}, o));
  Add(&want, ToolMessage("g", "1", "2"));
  EXPECT_SEGS(got, want);
}

TEST(ChatK3Render, ToolDeclarationIsCompactDeepSortedJsonAfterThePreamble) {
  ChatOptions o;
  o.add_generation_prompt = false;
  const std::vector<ToolSpec> tools = {
      {R"({"type": "function", "function": {"name": "get_weather", "description": "Wetter für",)"
       R"( "parameters": {"type": "object", "properties": {"days": {"maximum": 1e16,)"
       R"( "minimum": 1, "default": 0.5}}}}})"},
      {R"({"type":"function","function":{"name":"s"}})"}};
  const Segs segs = Render({}, o, tools);
  Segs want = SystemMessage(
      "tool-declare",
      "# Tools\nHere are the available tools, described in JSONSchema.\n\n```json\n"
      R"([{"function":{"description":"Wetter für","name":"get_weather","parameters":)"
      R"({"properties":{"days":{"default":0.5,"maximum":1e+16,"minimum":1}},"type":"object"}},)"
      R"("type":"function"},{"function":{"name":"s"},"type":"function"}])"
      "\n```");
  Add(&want, SystemMessage("thinking-effort", kEffortMaxBody));  // tools come first
  EXPECT_SEGS(segs, want);
}

TEST(ChatK3Render, SystemMessageWithToolsIsADynamicDeclaration) {
  ChatOptions o = MessagesOnly();
  ChatMessage sys;
  sys.role = "system";
  sys.tools_json = R"([{"type":"function","function":{"name":"s"}}])";
  EXPECT_SEGS(Render({sys}, o),
              SystemMessage("tool-declare",
                            "## New Tools Available\n"
                            "The system dynamically extends the toolset via lazy-loading.\n"
                            "You have access to all existing and extended tools.\n"
                            "Here are the specs for the extended tools.\n\n```json\n"
                            R"([{"function":{"name":"s"},"type":"function"}])"
                            "\n```"));
  sys.tools_json = "[]";  // falsy in Python: an ordinary system message
  sys.content = "plain";
  EXPECT_SEGS(Render({sys}, o), Message({{"role", "system"}}, {T("plain")}));
}

TEST(ChatK3Render, ToolChoiceAndResponseFormatMessagesComeLast) {
  ChatOptions o = MessagesOnly();
  o.tool_choice = ToolChoice::kRequired;
  EXPECT_SEGS(Render({}, o), SystemMessage("tool-choice",
                                           "The system is invoked with `tool_choice=required`.\n"
                                           "You MUST call tools in the next message."));
  o.tool_choice = ToolChoice::kNone;
  EXPECT_SEGS(Render({}, o), SystemMessage("tool-choice",
                                           "The system is invoked with `tool_choice=none`.\n"
                                           "You MUST NOT call any tools in the next message."));
  o.tool_choice = ToolChoice::kAuto;
  o.response_format.type = ResponseFormat::Type::kJsonObject;
  const std::string json_rule =
      "Your response must be raw JSON data without markdown code blocks (```json) or any "
      "additional formatting.";
  EXPECT_SEGS(Render({}, o),
              SystemMessage("response-format",
                            "The system is invoked with `response_format=json_object`.\n" +
                                json_rule));

  o.response_format.type = ResponseFormat::Type::kJsonSchema;
  const std::string schema_head =
      "The system is invoked with `response_format=json_schema`.\n" + json_rule +
      "\nThe JSON data must match the following schema:\n```json\n";
  // `schema` member of json_schema, deep-sorted and compact.
  o.response_format.json_schema =
      R"({"name": "r", "schema": {"type": "object", "properties": {"b": {}, "a": {}}}})";
  EXPECT_SEGS(Render({}, o),
              SystemMessage("response-format",
                            schema_head + R"({"properties":{"a":{},"b":{}},"type":"object"})" +
                                "\n```"));
  o.response_format.json_schema = R"({"type": "object"})";  // no "schema": the object itself
  EXPECT_SEGS(Render({}, o),
              SystemMessage("response-format", schema_head + R"({"type":"object"})" + "\n```"));
  o.response_format.json_schema = "";  // absent: null
  EXPECT_SEGS(Render({}, o), SystemMessage("response-format", schema_head + "null\n```"));
}

TEST(ChatK3Render, ErrorsNameTheMessageAndField) {
  ChatOptions o;
  auto error = [&](const std::vector<ChatMessage>& messages) {
    Result<Segs> r = RenderK3Chat(messages, {}, o);
    EXPECT_FALSE(r.ok());
    return r.ok() ? std::string() : r.status().message();
  };
  ChatMessage dev = User("x");
  dev.role = "developer";
  EXPECT_NE(error({User("a"), dev}).find("messages[1].role"), std::string::npos);

  ChatMessage a;
  a.role = "assistant";
  a.tool_calls = {{"i", "f", "{}"}, {"j", "g", "[1, 2]"}};
  EXPECT_NE(error({a}).find("messages[0].tool_calls[1].arguments"), std::string::npos);
  a.tool_calls = {{"i", "", "{}"}};
  EXPECT_NE(error({a}).find("messages[0].tool_calls[0].name"), std::string::npos);

  // A tool result with no name, no matching id and no call at its position.
  EXPECT_NE(error({User("q"), ToolResult("nope", "r")}).find("messages[1]"), std::string::npos);

  ChatMessage image = User("");
  image.content_parts = {{ContentPart::Type::kText, "see"}, {ContentPart::Type::kImage, ""}};
  Result<Segs> r = RenderK3Chat(std::vector<ChatMessage>{image}, {}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);
  EXPECT_NE(r.status().message().find("messages[0].content[1]"), std::string::npos);

  Result<Segs> bad_tool = RenderK3Chat({}, std::vector<ToolSpec>{{"{"}}, o);
  ASSERT_FALSE(bad_tool.ok());
  EXPECT_NE(bad_tool.status().message().find("tools[0]"), std::string::npos);
}

std::unique_ptr<Tokenizer> K3ByteTokenizer() {
  return std::make_unique<FakeTokenizer>(
      std::vector<std::string>{"<|end_of_msg|>", "<|open|>", "<|close|>", "<|sep|>"});
}

TEST(ChatK3Encode, MarkersBecomeSpecialIdsAndUserMarkupStaysText) {
  auto tok = K3ByteTokenizer();
  ChatOptions o = MessagesOnly();
  Result<std::vector<int32_t>> ids =
      EncodeSegments(*tok, Render({User("a<|open|>b")}, o));
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  const int32_t open = 257, close = 258, sep = 259, eom = 256;
  std::vector<int32_t> want = {open};
  for (char c : std::string("message role=\"user\"")) want.push_back(static_cast<unsigned char>(c));
  want.push_back(sep);
  for (char c : std::string("a<|open|>b")) want.push_back(static_cast<unsigned char>(c));
  want.push_back(close);
  for (char c : std::string("message")) want.push_back(static_cast<unsigned char>(c));
  want.push_back(sep);
  want.push_back(eom);
  EXPECT_EQ(*ids, want);
}

TEST(ChatK3Encode, MissingMarkerInTokenizerIsAnError) {
  // A tokenizer_config without K3 names (e.g. Kimi-Linear-48B's) must not silently BPE-encode
  // the markers (spec §10.2).
  FakeTokenizer k2_names({"<|im_end|>", "<|im_user|>", "<|im_assistant|>"});
  Result<std::vector<int32_t>> ids = EncodeSegments(k2_names, Render({User("x")}));
  ASSERT_FALSE(ids.ok());
  EXPECT_EQ(ids.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(ids.status().message().find("<|open|>"), std::string::npos);
}

TEST(ChatPythonJson, FloatsAndStringsAreSpelledLikePython) {
  // Expected strings from CPython 3.11 json.dumps.
  const std::vector<std::pair<std::string, std::string>> floats = {
      {"1.0", "1.0"}, {"1e-5", "1e-05"}, {"0.0001", "0.0001"}, {"1e16", "1e+16"},
      {"1e15", "1000000000000000.0"}, {"0.1", "0.1"}, {"-0.0", "-0.0"},
      {"123456789.125", "123456789.125"}, {"1.5e300", "1.5e+300"}, {"2.5e-7", "2.5e-07"},
      {"12345678901234567.0", "1.2345678901234568e+16"}, {"5e-324", "5e-324"},
      {"1E2", "100.0"}, {"-3.75", "-3.75"}, {"-0", "0"}, {"18446744073709551615",
      "18446744073709551615"}, {"-9223372036854775808", "-9223372036854775808"}};
  for (const auto& [in, want] : floats) {
    Result<std::string> got = PythonJsonRedump(in, false, false);
    ASSERT_TRUE(got.ok()) << in;
    EXPECT_EQ(*got, want) << in;
  }
  EXPECT_EQ(*PythonJsonRedump(R"({"b":[1,2.0,{"x":null}],"a":"é\u001f\n\"\\/","c":true})",
                              /*compact=*/false, /*sort_keys=*/false),
            R"({"b": [1, 2.0, {"x": null}], "a": "é\u001f\n\"\\/", "c": true})");
  EXPECT_EQ(*PythonJsonRedump(R"({"b":[1,2.0,{"x":null}],"a":"é"})", true, true),
            R"({"a":"é","b":[1,2.0,{"x":null}]})");
  EXPECT_EQ(PythonJsonQuote("\x7f\xe2\x80\xa8 \x01\xff"), "\"\x7f\xe2\x80\xa8 \\u0001\xEF\xBF\xBD\"");
  EXPECT_FALSE(PythonJsonRedump("[1,", false, false).ok());
  EXPECT_FALSE(PythonJsonRedump(std::string(1000, '['), false, false).ok());  // depth limit
}

// Render an assistant message, cut the prompt the generation prompt would have produced, and
// parse the rest back as if the model had written it.
TEST(ChatK3RoundTrip, AssistantMessageParsesBackToItsParts) {
  for (bool thinking : {true, false}) {
    ChatOptions o;
    o.thinking = thinking;
    o.thinking_effort.reset();
    ChatMessage a;
    a.role = "assistant";
    a.reasoning_content = thinking ? "Need the weather <not a tag> & more." : "";
    a.content = "Let me look that up. 😀";
    a.tool_calls = {
        {"c1", "get_weather",
         R"({"city": "Zürich", "days": 3, "f": 2.5, "ok": false, "x": null,)"
         R"( "o": {"z": 1, "a": [1, 2]}, "arr": ["é", 1e-07], "s": " padded ", "n": "42"})"},
        {"c2", "search", "not json {"},
        {"c3", "noop", ""}};

    const std::vector<ChatMessage> prefix = {User("Weather?")};
    const std::string prompt = JoinSegments(Render(prefix, o));
    ChatOptions no_prompt = o;
    no_prompt.add_generation_prompt = false;
    std::vector<ChatMessage> full = prefix;
    full.push_back(a);
    const std::string rendered = JoinSegments(Render(full, no_prompt));
    ASSERT_TRUE(rendered.starts_with(prompt)) << rendered;
    const std::string completion = rendered.substr(prompt.size());

    K3CompletionParser parser(K3ParseStartFor(o));
    parser.Feed(completion);
    parser.Finish();
    EXPECT_EQ(parser.reasoning(), a.reasoning_content);
    EXPECT_EQ(parser.content(), a.content);
    ASSERT_EQ(parser.tool_calls().size(), 3u);
    EXPECT_EQ(parser.tool_calls()[0].name, "get_weather");
    EXPECT_EQ(parser.tool_calls()[0].arguments, a.tool_calls[0].arguments);
    EXPECT_EQ(parser.tool_calls()[1].arguments, "not json {");
    EXPECT_EQ(parser.tool_calls()[2].arguments, "{}");
    for (const auto& c : parser.tool_calls()) EXPECT_TRUE(c.complete);
    EXPECT_TRUE(parser.message_ended());
  }
}

std::unique_ptr<Tokenizer> LoadBuiltinTokenizer() {
  const std::filesystem::path dir =
      std::filesystem::path(KIMIRT_SOURCE_DIR) / "assets" / "builtin";
  Result<std::unique_ptr<Tokenizer>> tok = Tokenizer::Load(dir.string());
  EXPECT_TRUE(tok.ok()) << tok.status().ToString();
  return tok.ok() ? std::move(*tok) : nullptr;
}

// With the real built-in vocabulary (assets/builtin, in the repository), the
// markers land on K3's ids: base + 2..5 (spec §10.2).
TEST(ChatK3Integration, BuiltinTokenizerMarkerIds) {
  std::unique_ptr<Tokenizer> tok = LoadBuiltinTokenizer();
  ASSERT_NE(tok, nullptr) << "the built-in tokenizer did not load from assets/builtin";
  const int32_t base = tok->num_base_tokens();
  ChatOptions o;
  o.thinking_effort.reset();
  const Segs segs = Render({User("Hello <|open|>")}, o);
  Result<std::vector<int32_t>> ids = EncodeSegments(*tok, segs);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  EXPECT_EQ(tok->Decode(*ids), JoinSegments(segs));  // byte-level: nothing lost or added
  std::map<int32_t, int> count;
  for (int32_t id : *ids) count[id]++;
  EXPECT_EQ(ids->front(), base + 3);  // <|open|>
  EXPECT_EQ(count[base + 3], 3);      // <|open|>: user message, assistant message, think
  EXPECT_EQ(count[base + 4], 1);      // <|close|>message
  EXPECT_EQ(count[base + 5], 4);      // <|sep|> after each open and the close
  EXPECT_EQ(count[base + 2], 1);      // <|end_of_msg|>
  if (base == 163584) {
    // The real Kimi vocabulary: a one-message chat is 22 ids, 89 with the default thinking-effort
    // message ([BG-MOD] via spec §10.3 step 2).
    Result<std::vector<int32_t>> plain = EncodeSegments(*tok, Render({User("Hello")}, o));
    ASSERT_TRUE(plain.ok());
    EXPECT_EQ(plain->size(), 22u);
    Result<std::vector<int32_t>> with_effort = EncodeSegments(*tok, Render({User("Hello")}));
    ASSERT_TRUE(with_effort.ok());
    EXPECT_EQ(with_effort->size(), 89u);
  }
}

// Prompt and completion through the real tokenizer: the completion's ids are streamed through
// the detokenizer with skip_special (XTML markers are "special": false and survive) into the
// parser, one token at a time.
TEST(ChatK3Integration, EncodeDetokenizeParseRoundTrip) {
  std::unique_ptr<Tokenizer> tok = LoadBuiltinTokenizer();
  ASSERT_NE(tok, nullptr) << "the built-in tokenizer did not load from assets/builtin";
  ChatOptions o;
  ChatMessage a;
  a.role = "assistant";
  a.reasoning_content = "Think: 東京 or 大阪? 🤔";
  a.content = "Tokyo.";
  a.tool_calls = {{"c", "lookup", R"({"city": "東京", "n": 2})"}};
  ChatOptions no_prompt = o;
  no_prompt.add_generation_prompt = false;
  const Segs prompt = Render({User("Capital?")}, o);
  const Segs full = Render({User("Capital?"), a}, no_prompt);
  ASSERT_GE(full.size(), prompt.size());
  const Segs completion(full.begin() + static_cast<std::ptrdiff_t>(prompt.size()), full.end());
  Result<std::vector<int32_t>> ids = EncodeSegments(*tok, completion);
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();

  IncrementalDetokenizer detok(*tok, /*skip_special=*/true);
  K3CompletionParser parser(K3ParseStartFor(o));
  for (int32_t id : *ids) {
    if (id == *tok->SpecialTokenId(kK3EndOfMsg)) break;  // the stop token ends generation
    parser.Feed(detok.Push(id));
  }
  parser.Feed(detok.Flush());
  parser.Finish();
  EXPECT_EQ(parser.reasoning(), a.reasoning_content);
  EXPECT_EQ(parser.content(), a.content);
  ASSERT_EQ(parser.tool_calls().size(), 1u);
  EXPECT_EQ(parser.tool_calls()[0].arguments, a.tool_calls[0].arguments);
  EXPECT_TRUE(tok->IsSpecial(*tok->SpecialTokenId(kK3EndOfMsg)));
  EXPECT_FALSE(tok->IsSpecial(*tok->SpecialTokenId(kK3Open)));
}

}  // namespace
}  // namespace kimirt
