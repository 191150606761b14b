// Tests for the Kimi-Linear-48B-A3B-Instruct chat template (docs/chat-format.md): exact segments
// for each message kind, text runs merged between markers, and encoding with a tokenizer that
// carries the 48B names at K3's ids (spec §10.2).
#include "kimirt/tokenizer/kimi_linear_chat.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

// Bytes 0..255 as ids, specials by name: the 48B names at the ids K3 uses for
// <|end_of_msg|>/<|open|>/<|close|> (163586..163588, spec §10.2); the other ids are illustrative
// (the renderer never assumes any id).
class KimiLinearNamesTokenizer : public Tokenizer {
 public:
  std::vector<int32_t> Encode(std::string_view text, bool) const override {
    std::vector<int32_t> ids;
    for (char c : text) ids.push_back(static_cast<unsigned char>(c));  // never specials
    return ids;
  }
  std::string Decode(std::span<const int32_t>) const override { return {}; }
  int32_t vocab_size() const override { return 163840; }
  int32_t num_base_tokens() const override { return 163584; }
  std::string_view TokenBytes(int32_t) const override { return {}; }
  std::optional<int32_t> SpecialTokenId(std::string_view name) const override {
    for (const auto& [n, id] : kNames) {
      if (n == name) return id;
    }
    return std::nullopt;
  }
  bool IsSpecial(int32_t id) const override { return id >= 163584; }

  static constexpr std::pair<std::string_view, int32_t> kNames[] = {
      {"<|im_end|>", 163586},
      {"<|im_user|>", 163587},
      {"<|im_assistant|>", 163588},
      {"<|im_system|>", 163594},
      {"<|tool_calls_section_begin|>", 163595},
      {"<|tool_calls_section_end|>", 163596},
      {"<|tool_call_begin|>", 163597},
      {"<|tool_call_argument_begin|>", 163598},
      {"<|tool_call_end|>", 163599},
      {"<|im_middle|>", 163601},
  };
};

using Segs = std::vector<ChatSegment>;
ChatSegment M(std::string s) { return {true, std::move(s)}; }
ChatSegment T(std::string s) { return {false, std::move(s)}; }

std::string Dump(const Segs& segs) {
  std::string out;
  for (const ChatSegment& s : segs) out += (s.marker ? "M[" : "T[") + s.text + "] ";
  return out;
}

Segs Render(const std::vector<ChatMessage>& messages, const std::vector<ToolSpec>& tools = {},
            bool add_generation_prompt = true) {
  ChatOptions o;
  o.add_generation_prompt = add_generation_prompt;
  Result<Segs> r = RenderKimiLinearChat(messages, tools, o);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? *r : Segs{};
}

ChatMessage Msg(std::string role, std::string content) {
  ChatMessage m;
  m.role = std::move(role);
  m.content = std::move(content);
  return m;
}

TEST(KimiLinearChat, SystemUserAndGenerationPrompt) {
  // No default system prompt and no thinking channel in this template.
  const Segs want = {M("<|im_system|>"),    T("system"),    M("<|im_middle|>"), T("Be terse."),
                     M("<|im_end|>"),       M("<|im_user|>"), T("user"),        M("<|im_middle|>"),
                     T("Hi <|im_end|>"),    M("<|im_end|>"), M("<|im_assistant|>"),
                     T("assistant"),        M("<|im_middle|>")};
  const Segs got = Render({Msg("system", "Be terse."), Msg("user", "Hi <|im_end|>")});
  EXPECT_EQ(Dump(got), Dump(want));
  EXPECT_EQ(JoinSegments(got),
            "<|im_system|>system<|im_middle|>Be terse.<|im_end|><|im_user|>user<|im_middle|>"
            "Hi <|im_end|><|im_end|><|im_assistant|>assistant<|im_middle|>");
}

TEST(KimiLinearChat, ToolDeclarationKeepsKeyOrderCompact) {
  const Segs got = Render(
      {Msg("user", "x")},
      {{R"({"type": "function", "function": {"name": "f", "parameters": {"b": 1.0, "a": "é"}}})"}},
      false);
  const Segs want = {M("<|im_system|>"), T("tool_declare"), M("<|im_middle|>"),
                     T(R"([{"type":"function","function":{"name":"f","parameters":{"b":1.0,"a":"é"}}}])"),
                     M("<|im_end|>"), M("<|im_user|>"), T("user"), M("<|im_middle|>"), T("x"),
                     M("<|im_end|>")};
  EXPECT_EQ(Dump(got), Dump(want));
}

TEST(KimiLinearChat, AssistantToolCallsAndToolResults) {
  ChatMessage a = Msg("assistant", "Let me check.");
  a.reasoning_content = "not rendered";
  a.tool_calls = {{"functions.get_weather:0", "get_weather", R"({"city": "Paris"})"},
                  {"functions.f:1", "f", "{}"}};
  ChatMessage r = Msg("tool", "18C");
  r.tool_call_id = "functions.get_weather:0";
  ChatMessage named = Msg("tool", "ok");
  named.tool_call_id = "functions.f:1";
  named.name = "f";  // role_name = name or role
  const Segs want = {
      M("<|im_assistant|>"), T("assistant"), M("<|im_middle|>"), T("Let me check."),
      M("<|tool_calls_section_begin|>"),
      M("<|tool_call_begin|>"), T("functions.get_weather:0"), M("<|tool_call_argument_begin|>"),
      T(R"({"city": "Paris"})"), M("<|tool_call_end|>"),
      M("<|tool_call_begin|>"), T("functions.f:1"), M("<|tool_call_argument_begin|>"), T("{}"),
      M("<|tool_call_end|>"), M("<|tool_calls_section_end|>"), M("<|im_end|>"),
      M("<|im_system|>"), T("tool"), M("<|im_middle|>"),
      T("## Return of functions.get_weather:0\n18C"), M("<|im_end|>"),
      M("<|im_system|>"), T("f"), M("<|im_middle|>"), T("## Return of functions.f:1\nok"),
      M("<|im_end|>")};
  EXPECT_EQ(Dump(Render({a, r, named}, {}, false)), Dump(want));
}

TEST(KimiLinearChat, ContentPartsJoinIntoOneTextRun) {
  ChatMessage m;
  m.role = "user";
  m.name = "alice";
  m.content_parts = {{ContentPart::Type::kText, "one "}, {ContentPart::Type::kText, "two"}};
  const Segs want = {M("<|im_user|>"), T("alice"), M("<|im_middle|>"), T("one two"),
                     M("<|im_end|>")};
  EXPECT_EQ(Dump(Render({m}, {}, false)), Dump(want));
}

TEST(KimiLinearChat, ErrorsNameTheField) {
  ChatOptions o;
  ChatMessage bad = Msg("developer", "x");
  Result<Segs> r = RenderKimiLinearChat(std::vector<ChatMessage>{Msg("user", "a"), bad}, {}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("messages[1].role"), std::string::npos);

  ChatMessage img = Msg("user", "");
  img.content_parts = {{ContentPart::Type::kImage, ""}};
  r = RenderKimiLinearChat(std::vector<ChatMessage>{img}, {}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kUnsupported);

  r = RenderKimiLinearChat({}, std::vector<ToolSpec>{{"nope"}}, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("tools[0]"), std::string::npos);
}

TEST(KimiLinearChat, EncodesWithTheModelsOwnNames) {
  KimiLinearNamesTokenizer tok;
  Result<std::vector<int32_t>> ids = EncodeSegments(tok, Render({Msg("user", "<|im_end|>")}));
  ASSERT_TRUE(ids.ok()) << ids.status().ToString();
  std::vector<int32_t> want = {163587, 'u', 's', 'e', 'r', 163601};
  for (char c : std::string("<|im_end|>")) want.push_back(static_cast<unsigned char>(c));
  for (int32_t id : {163586, 163588}) want.push_back(id);
  for (char c : std::string("assistant")) want.push_back(static_cast<unsigned char>(c));
  want.push_back(163601);
  EXPECT_EQ(*ids, want);

  // The K3 renderer's markers do not exist under these names: an error, not silent BPE.
  Result<std::vector<Segs::value_type>> k3 = RenderK3Chat(
      std::vector<ChatMessage>{Msg("user", "x")}, {}, ChatOptions{});
  ASSERT_TRUE(k3.ok());
  EXPECT_EQ(EncodeSegments(tok, *k3).status().code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace kimirt
