// Tokenizer tests (spec §10.1-10.2): the built-in assets and their special-token table,
// tiktoken.model / tokenizer_config.json validation, BPE merge rules on hand-made vocabularies,
// special-token handling, NeMo's long-input splitting, round trips (ill-formed UTF-8 included),
// thread safety, and TokenizerVsTiktoken: id-for-id agreement with the PyPI tiktoken library on
// a multi-megabyte corpus and on every code point of planes 0-3 and 14
// (tests/python/tokenizer_vs_tiktoken.py computes the reference; skipped without tiktoken).
#include "kimirt/tokenizer/tokenizer.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <thread>

#include "kimirt/tokenizer/pretokenizer.h"
#include "kimirt/testing/status_test_util.h"
#include "kimirt/testing/test_data.h"
#include "kimirt/tokenizer/tiktoken_bpe.h"

namespace kimirt {
namespace {

using Ids = std::vector<int32_t>;

std::string BuiltinDir() { return std::string(KIMIRT_SOURCE_DIR) + "/assets/builtin"; }

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

const Tokenizer& Builtin() {
  static const std::unique_ptr<Tokenizer> tok = [] {
    auto r = Tokenizer::Load(BuiltinDir());
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }();
  return *tok;
}

std::string Base64(std::string_view bytes) {
  static const char* kAlphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16 |
                       static_cast<uint8_t>(bytes[i + 1]) << 8 | static_cast<uint8_t>(bytes[i + 2]);
    for (int k = 3; k >= 0; --k) out += kAlphabet[v >> (6 * k) & 63];
  }
  if (bytes.size() - i == 1) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16;
    out += std::string{kAlphabet[v >> 18 & 63], kAlphabet[v >> 12 & 63], '=', '='};
  } else if (bytes.size() - i == 2) {
    const uint32_t v = static_cast<uint8_t>(bytes[i]) << 16 | static_cast<uint8_t>(bytes[i + 1])
                                                                  << 8;
    out +=
        std::string{kAlphabet[v >> 18 & 63], kAlphabet[v >> 12 & 63], kAlphabet[v >> 6 & 63], '='};
  }
  return out;
}

// A tiktoken.model: the 256 single bytes (rank = byte value), then `merges` in rank order.
std::string ModelText(const std::vector<std::string>& merges = {}) {
  std::string text;
  int rank = 0;
  for (int b = 0; b < 256; ++b)
    text += Base64(std::string(1, static_cast<char>(b))) + " " + std::to_string(rank++) + "\n";
  for (const std::string& m : merges) text += Base64(m) + " " + std::to_string(rank++) + "\n";
  return text;
}

std::unique_ptr<Tokenizer> Make(const std::vector<std::string>& merges,
                                std::string_view config = "", int num_reserved = 256) {
  auto r = Tokenizer::FromStrings(ModelText(merges), config, num_reserved);
  EXPECT_TRUE(r.ok()) << r.status().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

Ids Concat(std::initializer_list<Ids> parts) {
  Ids out;
  for (const Ids& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

// ---------------------------------------------------------------------------------------------
// Built-in assets and the special-token table (spec §10.2 offsets)

TEST(TokenizerBuiltin, LoadsWithK3SpecialOffsets) {
  const Tokenizer& t = Builtin();
  ASSERT_EQ(t.num_base_tokens(), 4096);
  EXPECT_EQ(t.vocab_size(), 4096 + 256);
  const std::pair<const char*, int> named[] = {{"[BOS]", 0},
                                               {"[EOS]", 1},
                                               {"<|end_of_msg|>", 2},
                                               {"<|open|>", 3},
                                               {"<|close|>", 4},
                                               {"<|sep|>", 5},
                                               {"[start_header_id]", 6},
                                               {"[end_header_id]", 7},
                                               {"[EOT]", 9},
                                               {"<|media_begin|>", 18},
                                               {"<|media_content|>", 19},
                                               {"<|media_end|>", 20},
                                               {"<|media_pad|>", 21},
                                               {"<osagent_mode>", 65},
                                               {"[UNK]", 254},
                                               {"[PAD]", 255}};
  for (const auto& [name, offset] : named) {
    EXPECT_EQ(t.SpecialTokenId(name), 4096 + offset) << name;
    EXPECT_EQ(t.TokenBytes(4096 + offset), name);
  }
  // Unnamed reserved ids are named after their own id.
  EXPECT_EQ(t.TokenBytes(4096 + 8), "<|reserved_token_4104|>");
  EXPECT_EQ(t.SpecialTokenId("<|reserved_token_4104|>"), 4104);
  EXPECT_EQ(t.TokenBytes(4351), "[PAD]");
  EXPECT_FALSE(t.SpecialTokenId("<|im_end|>").has_value());
  // The XTML markers are "special": false (kept by skip_special, spec §10.4).
  EXPECT_FALSE(t.IsSpecial(4096 + 3));
  EXPECT_FALSE(t.IsSpecial(4096 + 4));
  EXPECT_FALSE(t.IsSpecial(4096 + 5));
  EXPECT_TRUE(t.IsSpecial(4096 + 2));
  EXPECT_TRUE(t.IsSpecial(4096 + 8));
  EXPECT_FALSE(t.IsSpecial(0));
  EXPECT_FALSE(t.IsSpecial(4352));
  EXPECT_EQ(t.TokenBytes(-1), "");
  EXPECT_EQ(t.TokenBytes(4352), "");
  EXPECT_EQ(t.TokenBytes('A'), "A");
}

TEST(TokenizerBuiltin, AssetsAreSmallAndRanksAreOrdered) {
  EXPECT_LT(std::filesystem::file_size(BuiltinDir() + "/tiktoken.model"), 100u * 1024);
  auto tokens = ParseTiktokenModel(ReadFile(BuiltinDir() + "/tiktoken.model"));
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  for (int b = 0; b < 256; ++b)
    EXPECT_EQ((*tokens)[static_cast<size_t>(b)], std::string(1, static_cast<char>(b)));
}

TEST(TokenizerBuiltin, EncodesGsm8kCompactly) {
  const std::string text =
      "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 "
      "clips altogether in April and May.\n#### 72";
  const Ids ids = Builtin().Encode(text);
  EXPECT_LT(ids.size(), text.size() / 2);
  EXPECT_EQ(Builtin().Decode(ids), text);
}

// ---------------------------------------------------------------------------------------------
// BPE merge rules (tiktoken's: lowest rank first, leftmost on ties, whole-piece lookup first)

TEST(TokenizerBpe, LowestRankMergesFirst) {
  // "bc" (256) outranks "ab" (257): "abc" merges b+c first, then a+bc = "abc" (258).
  auto t = Make({"bc", "ab", "abc", "xyz"});
  EXPECT_EQ(t->Encode("xabc"), (Ids{'x', 258}));
  EXPECT_EQ(t->Encode("xab"), (Ids{'x', 257}));
  // "xbca": bc first; then no pair of (x, bc, a) is a token.
  EXPECT_EQ(t->Encode("xbca"), (Ids{'x', 256, 'a'}));
}

TEST(TokenizerBpe, LeftmostOnTies) {
  auto t = Make({"aa"});
  EXPECT_EQ(t->Encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t->Encode("aaaa"), (Ids{256, 256}));
  EXPECT_EQ(t->Encode("aaaaa"), (Ids{256, 256, 'a'}));
}

TEST(TokenizerBpe, WholePieceLookupComesFirst) {
  // "xyz" cannot be built by merges (no "xy" or "yz"), but a piece equal to it is one token.
  auto t = Make({"bc", "ab", "abc", "xyz"});
  EXPECT_EQ(t->Encode("xyz"), (Ids{259}));
  EXPECT_EQ(t->Encode("xyzw"), (Ids{'x', 'y', 'z', 'w'}));
  EXPECT_EQ(t->Encode("xyz xyz"), (Ids{259, ' ', 'x', 'y', 'z'}));
}

TEST(TokenizerBpe, HeapMergeMatchesQuadraticMerge) {
  auto tokens = ParseTiktokenModel(ReadFile(BuiltinDir() + "/tiktoken.model"));
  ASSERT_TRUE(tokens.ok());
  const BpeRanks ranks(*tokens);
  // Also a vocabulary with many equal-letter merges (ties everywhere).
  const BpeRanks ties(
      *ParseTiktokenModel(ModelText({"aa", "ab", "ba", "aaa", "aab", "bb", "abab", "aaaa"})));
  std::mt19937 rng(7);
  const std::string letters = "ab the12 ,.\n";
  for (int i = 0; i < 6000; ++i) {
    const size_t n = 2 + rng() % 300;
    std::string s;
    for (size_t k = 0; k < n; ++k) s += letters[rng() % (i % 2 ? 2 : letters.size())];
    for (const BpeRanks* r : {&ranks, &ties}) {
      Ids a, b;
      r->MergeQuadratic(s, &a);
      r->MergeWithHeap(s, &b);
      ASSERT_EQ(a, b) << "piece \"" << s << "\"";
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Special tokens

TEST(TokenizerSpecial, PlainTextUnlessAllowed) {
  const Tokenizer& t = Builtin();
  for (const char* name : {"<|open|>", "[BOS]", "<|reserved_token_4104|>", "<|end_of_msg|>"}) {
    const Ids plain = t.Encode(name);
    EXPECT_GT(plain.size(), 1u) << name;
    for (int32_t id : plain) EXPECT_LT(id, t.num_base_tokens()) << name;
    EXPECT_EQ(t.Decode(plain), name);
    EXPECT_EQ(t.Encode(name, /*allow_special=*/true), Ids{*t.SpecialTokenId(name)}) << name;
  }
  // Partial names stay text even when specials are allowed.
  for (const char* text : {"<|open|", "<|open", "|open|>", "[BOS", "<|reserved_token_9|>"}) {
    EXPECT_EQ(t.Encode(text, true), t.Encode(text)) << text;
  }
}

TEST(TokenizerSpecial, TextAroundMarkersIsEncodedSeparately) {
  const Tokenizer& t = Builtin();
  const int32_t open = *t.SpecialTokenId("<|open|>"), sep = *t.SpecialTokenId("<|sep|>");
  // Merges and the regex never look across a special token (" the" would otherwise join).
  EXPECT_EQ(t.Encode("message<|sep|> the", true),
            Concat({t.Encode("message"), {sep}, t.Encode(" the")}));
  EXPECT_EQ(t.Encode("<|open|><|sep|>", true), (Ids{open, sep}));
  EXPECT_EQ(t.Encode("a  <|open|>  b", true), Concat({t.Encode("a  "), {open}, t.Encode("  b")}));
  EXPECT_EQ(t.Encode("<|<|open|>|>", true), Concat({t.Encode("<|"), {open}, t.Encode("|>")}));
  const std::string chat =
      "<|open|>message role=\"user\"<|sep|>Hi<|close|>message<|sep|><|end_of_msg|>";
  EXPECT_EQ(t.Decode(t.Encode(chat, true)), chat);
}

TEST(TokenizerSpecial, LongestNameWinsWhereNamesOverlap) {
  auto t = Make(
      {}, R"({"added_tokens_decoder": {"256": {"content": "<a>"}, "257": {"content": "<a>b"}}})",
      4);
  EXPECT_EQ(t->Encode("x<a>b<a>", true), (Ids{'x', 257, 256}));
}

// ---------------------------------------------------------------------------------------------
// tiktoken.model validation: errors name the line

Status ParseError(const std::string& text) { return ParseTiktokenModel(text).status(); }

TEST(TokenizerModelFile, AcceptsCrlfAndBlankLines) {
  std::string text = ModelText({"ab"});
  std::string crlf;
  for (char c : text) {
    if (c == '\n')
      crlf += "\r\n\r\n";
    else
      crlf += c;
  }
  auto tokens = ParseTiktokenModel(crlf);
  ASSERT_TRUE(tokens.ok()) << tokens.status().ToString();
  EXPECT_EQ(tokens->size(), 257u);
  EXPECT_EQ((*tokens)[256], "ab");
}

TEST(TokenizerModelFile, RejectsMalformedLines) {
  const std::string base = ModelText();
  EXPECT_ERROR_HAS(ParseError(base + "Q!== 256\n"), "line 257", "malformed base64");
  EXPECT_ERROR_HAS(ParseError(base + "QUI 256\n"), "line 257", "malformed base64");
  EXPECT_ERROR_HAS(ParseError(base + "QUJ= 256\n"), "line 257",
                   "malformed base64");  // non-canonical
  EXPECT_ERROR_HAS(ParseError(base + "QUI= x\n"), "line 257", "malformed rank");
  EXPECT_ERROR_HAS(ParseError(base + "QUI= -1\n"), "line 257", "malformed rank");
  EXPECT_ERROR_HAS(ParseError(base + "QUI= 1 2\n"), "line 257", "malformed rank");
  EXPECT_ERROR_HAS(ParseError(base + "QUI=\n"), "line 257", "<base64> <rank>");
  EXPECT_ERROR_HAS(ParseError(base + "\nQUI=  256\n"), "line 258");
  EXPECT_ERROR_HAS(ParseError(base + "QUI= 300\n"), "line 257", "rank 300");
  EXPECT_ERROR_HAS(ParseError(base + "QUI= 5\n"), "line 257", "rank 5 already given on line 6");
  EXPECT_ERROR_HAS(ParseError(base + "QQ== 256\n"), "line 257", "same bytes as line 66");
  EXPECT_ERROR_HAS(ParseError(""), "no tokens");
  // Without the byte 'A' (line 66), byte-level BPE could not encode "A".
  std::string missing = base;
  const std::string line66 = Base64("A") + " 65\n";
  missing.replace(missing.find(line66), line66.size(), Base64("AB") + " 65\n");
  EXPECT_ERROR_HAS(ParseError(missing), "single byte 0x41");
  // Tokenizer::FromStrings adds the file name.
  EXPECT_ERROR_HAS(Tokenizer::FromStrings(base + "QUI= x\n", "").status(), "tiktoken.model",
                   "line 257");
}

// ---------------------------------------------------------------------------------------------
// tokenizer_config.json

TEST(TokenizerConfig, NamesFlagsAndRange) {
  auto t = Make({"ab"}, R"({"added_tokens_decoder": {
      "257": {"content": "[BOS]", "special": true},
      "260": {"content": "<|open|>", "special": false},
      "100": {"content": "ignored: a base id"},
      "999": {"content": "ignored: past the reserved range"}}})",
                8);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->vocab_size(), 265);
  EXPECT_EQ(t->SpecialTokenId("[BOS]"), 257);
  EXPECT_EQ(t->SpecialTokenId("<|open|>"), 260);
  EXPECT_EQ(t->TokenBytes(258), "<|reserved_token_258|>");
  EXPECT_EQ(t->TokenBytes(100), "d");
  EXPECT_FALSE(t->SpecialTokenId("ignored: a base id").has_value());
  EXPECT_TRUE(t->IsSpecial(257));
  EXPECT_FALSE(t->IsSpecial(260));
  EXPECT_TRUE(t->IsSpecial(258));
}

TEST(TokenizerConfig, RejectsBadConfigs) {
  const std::string model = ModelText();
  auto err = [&](std::string_view config) {
    return Tokenizer::FromStrings(model, config).status();
  };
  EXPECT_ERROR_HAS(err("{"), "tokenizer_config.json", "not a JSON object");
  EXPECT_ERROR_HAS(err(R"({"added_tokens_decoder": []})"), "added_tokens_decoder is not an object");
  EXPECT_ERROR_HAS(err(R"({"added_tokens_decoder": {"x1": {"content": "a"}}})"),
                   "\"x1\" is not a token id");
  EXPECT_ERROR_HAS(err(R"({"added_tokens_decoder": {"256": {"content": 5}}})"), "\"256\"",
                   "content");
  EXPECT_ERROR_HAS(err(R"({"added_tokens_decoder": {"256": {"content": ""}}})"), "empty name");
  EXPECT_ERROR_HAS(err(R"({"added_tokens_decoder": {"256": {"content": "a", "special": 1}}})"),
                   "special");
  EXPECT_ERROR_HAS(
      err(R"({"added_tokens_decoder": {"256": {"content": "[X]"}, "300": {"content": "[X]"}}})"),
      "ids 256 and 300", "[X]");
  EXPECT_ERROR_HAS(
      err(R"({"added_tokens_decoder": {"256": {"content": "<|reserved_token_257|>"}}})"),
      "ids 256 and 257");
}

TEST(TokenizerLoad, MissingDirectoryNamesThePath) {
  const auto r = Tokenizer::Load("/nonexistent/kimirt-tokenizer");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), ErrorCode::kNotFound);
  EXPECT_NE(r.status().message().find("/nonexistent/kimirt-tokenizer/tiktoken.model"),
            std::string::npos);
}

TEST(TokenizerLoad, ConfigIsOptional) {
  const std::string dir = ::testing::TempDir() + "/kimirt-tok-noconfig";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/tiktoken.model") << ModelText({"ab"});
  auto r = Tokenizer::Load(dir);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ((*r)->TokenBytes(257), "<|reserved_token_257|>");
  std::filesystem::remove_all(dir);
}

// ---------------------------------------------------------------------------------------------
// Encoding behaviour

TEST(TokenizerEncode, EmptyAndRoundTrips) {
  const Tokenizer& t = Builtin();
  EXPECT_TRUE(t.Encode("").empty());
  EXPECT_TRUE(t.Encode("", true).empty());
  EXPECT_EQ(t.Decode({}), "");
  for (const std::string& s : std::vector<std::string>{
           "Hello world", "你好世界", "emoji 👨‍👩‍👧‍👦 🇯🇵", "   \n\n\t  x  ",
           "I'M DON'T it'ſ", "Привет, мир! ١٢٣", "a\u180e\u0085\u2028b",
           std::string("\x00\x01\x1f\x7f", 4)}) {
    EXPECT_EQ(t.Decode(t.Encode(s)), s);
    EXPECT_EQ(t.Decode(t.Encode(s, true)), s);
  }
}

TEST(TokenizerEncode, IllFormedUtf8RoundTrips) {
  const Tokenizer& t = Builtin();
  std::mt19937 rng(3);
  for (const std::string& s :
       {std::string("ab\xff"
                    "cd"),
        std::string("\xe4\xbd"), std::string("a  \xc3"), std::string("\xed\xa0\x80 x"),
        std::string("\xc0\xaf<|open|>\xfe")}) {
    EXPECT_EQ(t.Decode(t.Encode(s)), s);
    EXPECT_EQ(t.Decode(t.Encode(s, true)), s);
  }
  for (int i = 0; i < 2000; ++i) {
    std::string s(1 + rng() % 64, '\0');
    const std::string common = "ab \n'1\xe4\xbd\xa0";  // bytes of 你 out of order, too
    for (char& c : s)
      c = static_cast<char>(rng() % 4 == 0 ? rng() % 256 : common[rng() % common.size()]);
    const Ids ids = t.Encode(s);
    ASSERT_EQ(t.Decode(ids), s);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < t.num_base_tokens());
  }
}

TEST(TokenizerEncode, RoundTripsGsm8k) {
  KIMIRT_REQUIRE_FILE(testing::TestDataPath("data/gsm8k/test.jsonl"));
  const std::string text = ReadFile(testing::TestDataPath("data/gsm8k/test.jsonl"));
  const Ids ids = Builtin().Encode(text);
  EXPECT_EQ(Builtin().Decode(ids), text);
  EXPECT_LT(ids.size(), text.size() / 2);
}

// NeMo's long-input split (spec §10.1): runs of more than 25,000 whitespace / non-whitespace
// characters and 400,000-character chunks are encoded separately.
TEST(TokenizerEncode, LongInputsAreCutLikeNemo) {
  auto t = Make({"aa", "aaaa", "aaaaaaaa", "  ", "    "});
  const std::string a30k(30000, 'a');
  EXPECT_EQ(t->Encode(a30k),
            Concat({t->Encode(std::string(25000, 'a')), t->Encode(std::string(5000, 'a'))}));
  EXPECT_EQ(t->Encode("x" + std::string(25001, 'a')),
            Concat({t->Encode("x" + std::string(24999, 'a')), t->Encode(std::string(2, 'a'))}));
  const std::string sp(25003, ' ');
  EXPECT_EQ(t->Encode("b" + sp + "b"),
            Concat({t->Encode("b" + std::string(25000, ' ')), t->Encode("   b")}));
  // A run of exactly 25,000 is not cut.
  EXPECT_EQ(t->Encode(std::string(25000, 'a')).size(), 25000u / 8);
  // 400,000 characters, counted as code points: "é " is two characters in three bytes. Uncut,
  // the chunk's trailing space would join the next "é" as the token " é".
  auto e = Make({"\xc3\xa9", " \xc3\xa9"});
  std::string text;
  for (int i = 0; i < 200005; ++i) text += "\u00e9 ";
  const Ids cut = Concat({e->Encode(text.substr(0, 600000)), e->Encode(text.substr(600000))});
  EXPECT_EQ(e->Encode(text), cut);
  EXPECT_EQ(cut.size(), 200007u);
  // The cut comes before special-token matching, so a marker across it stays text.
  auto s = Make({}, R"({"added_tokens_decoder": {"256": {"content": "<m>"}}})", 1);
  const std::string across = std::string(24999, 'a') + "<m>";
  EXPECT_EQ(s->Encode(across, true), s->Encode(across));
  EXPECT_EQ(s->Encode(std::string(24990, 'a') + "<m>", true).back(), 256);
}

// A direct port of NeMo's loops over decoded characters: the reference for the optimized cut.
std::vector<std::string_view> ReferenceSlices(std::string_view text) {
  struct Char {
    size_t pos, len;
    bool space;
  };
  std::vector<Char> chars;
  for (size_t pos = 0; pos < text.size();) {
    size_t len = 1;
    char32_t cp = 0xFFFFFFFF;  // ill-formed: one non-space character per byte
    const auto b = static_cast<uint8_t>(text[pos]);
    const size_t want = b < 0x80                 ? 1
                        : b >= 0xC2 && b <= 0xDF ? 2
                        : b >= 0xE0 && b <= 0xEF ? 3
                        : b >= 0xF0 && b <= 0xF4 ? 4
                                                 : 0;
    if (want == 1) {
      cp = b;
    } else if (want > 1 && pos + want <= text.size()) {
      char32_t c = b & (0x7F >> want);
      bool ok = true;
      for (size_t k = 1; k < want; ++k) {
        const auto cb = static_cast<uint8_t>(text[pos + k]);
        ok = ok && (cb & 0xC0) == 0x80;
        c = c << 6 | (cb & 0x3F);
      }
      const char32_t min = want == 2 ? 0x80 : want == 3 ? 0x800 : 0x10000;
      if (ok && c >= min && c <= 0x10FFFF && !(c >= 0xD800 && c <= 0xDFFF)) {
        cp = c;
        len = want;
      }
    }
    const bool space = (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 ||
                       cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
                       cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
    chars.push_back({pos, len, space});
    pos += len;
  }
  std::vector<std::string_view> out;
  auto at = [&](size_t i) { return i < chars.size() ? chars[i].pos : text.size(); };
  for (size_t c0 = 0; c0 < chars.size(); c0 += 400000) {
    const size_t c1 = std::min(chars.size(), c0 + 400000);
    size_t slice_start = c0, run = 0;
    bool run_is_space = chars[c0].space;
    for (size_t i = c0; i < c1; ++i) {
      if (chars[i].space != run_is_space) {
        run = 1;
        run_is_space = chars[i].space;
      } else if (++run > 25000) {
        out.push_back(text.substr(at(slice_start), at(i) - at(slice_start)));
        slice_start = i;
        run = 1;
      }
    }
    out.push_back(text.substr(at(slice_start), at(c1) - at(slice_start)));
  }
  return out;
}

std::vector<std::string_view> Slices(std::string_view text) {
  std::vector<std::string_view> out;
  ForEachLongInputSlice(
      text,
      [](void* ctx, std::string_view s) {
        static_cast<std::vector<std::string_view>*>(ctx)->push_back(s);
      },
      &out);
  return out;
}

TEST(TokenizerEncode, LongInputCutMatchesAPortOfNemo) {
  EXPECT_TRUE(Slices("").empty());
  EXPECT_EQ(Slices("ab"), (std::vector<std::string_view>{"ab"}));
  // Runs of random lengths around the limit, of ASCII and non-ASCII (white)space and text,
  // Python-only spaces (U+001C), ill-formed bytes, and 400,000-character chunks.
  const std::vector<std::string> units = {" ",      "a",    "\n",     "\x1c", "\u3000",
                                          "\u00e9", "\xff", "\u0085", "x y"};
  std::mt19937 rng(11);
  for (int round = 0; round < 40; ++round) {
    std::string text;
    const size_t target = round % 4 == 0 ? 900000 : 120000;
    while (text.size() < target) {
      const std::string& u = units[rng() % units.size()];
      const size_t n = rng() % 3 == 0 ? 24990 + rng() % 20 : 1 + rng() % 40;
      for (size_t k = 0; k < n; ++k) text += u;
    }
    const auto want = ReferenceSlices(text);
    const auto got = Slices(text);
    ASSERT_EQ(got.size(), want.size()) << "round " << round;
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].data(), want[i].data()) << "round " << round << " slice " << i;
      ASSERT_EQ(got[i].size(), want[i].size()) << "round " << round << " slice " << i;
    }
  }
}

TEST(TokenizerEncode, ConcurrentEncodesAgree) {
  const std::string text =
      ReadFile(testing::TestDataPath("data/gsm8k/test.jsonl")) + "你好 мир 😀";
  const Ids want = Builtin().Encode(text);
  std::vector<Ids> got(8);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < got.size(); ++i) {
    threads.emplace_back([&, i] { got[i] = Builtin().Encode(text, i % 2 == 0); });
  }
  for (auto& th : threads) th.join();
  for (const Ids& g : got) EXPECT_EQ(g, want);
}

TEST(TokenizerEncode, PatternStringIsNemos) {
  const std::string_view p = KimiPatternString();
  EXPECT_EQ(p.substr(0, 11), "[\\p{Han}]+|");
  EXPECT_NE(p.find("&&[^\\p{Han}]]"), std::string_view::npos);
  EXPECT_EQ(p.substr(p.size() - 14), "|\\s+(?!\\S)|\\s+");
}

// ---------------------------------------------------------------------------------------------
// Agreement with the PyPI tiktoken library

bool PythonHasTiktoken() {
  return std::system("python3 -c 'import tiktoken, regex' >/dev/null 2>&1") == 0;
}

struct Reader {
  std::string data;
  size_t pos = 0;
  uint32_t U32() {
    uint32_t v = 0;
    if (pos + 4 <= data.size()) std::memcpy(&v, data.data() + pos, 4);
    pos += 4;
    return v;
  }
  std::string_view Bytes(size_t n) {
    std::string_view v = std::string_view(data).substr(std::min(pos, data.size()), n);
    pos += n;
    return v;
  }
  Ids IdArray() {
    Ids ids(U32());
    if (!ids.empty() && pos + ids.size() * 4 <= data.size())
      std::memcpy(ids.data(), data.data() + pos, ids.size() * 4);
    pos += ids.size() * 4;
    return ids;
  }
};

std::string Escape(std::string_view s) {
  std::string out;
  for (char c : s.substr(0, 160)) {
    const auto b = static_cast<uint8_t>(c);
    if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (b < 0x20 || b == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", b);
      out += buf;
    } else
      out += c;
  }
  return out + (s.size() > 160 ? "..." : "");
}

std::string IdsNear(const Ids& ids, size_t at, const Tokenizer& t) {
  std::string out;
  for (size_t i = at > 3 ? at - 3 : 0; i < std::min(ids.size(), at + 4); ++i) {
    out += std::to_string(ids[i]) + "(\"" + Escape(t.TokenBytes(ids[i])) + "\") ";
  }
  return out;
}

// What went wrong with one segment, for the failure message.
std::string Describe(const Tokenizer& t, std::string_view label, std::string_view text,
                     const Ids& got, const Ids& want) {
  size_t at = 0;
  while (at < got.size() && at < want.size() && got[at] == want[at]) ++at;
  size_t byte = 0;
  for (size_t i = 0; i < at; ++i) byte += t.TokenBytes(got[i]).size();
  std::string pieces;
  if (auto pre = Pretokenizer::Create(); pre.ok()) {
    size_t off = 0;
    (*pre)->ForEach(text, [&](std::string_view p) {
      if (off + p.size() + 24 >= byte && off <= byte + 24) pieces += "[" + Escape(p) + "] ";
      off += p.size();
    });
  }
  return "segment \"" + std::string(label) + "\" (" + std::to_string(text.size()) +
         " bytes), first difference at id " + std::to_string(at) + " (byte " +
         std::to_string(byte) + ")\n  text there: \"" +
         Escape(text.substr(byte > 16 ? byte - 16 : 0, 48)) + "\"\n  our pieces there: " + pieces +
         "\n  ours:     " + IdsNear(got, at, t) + "\n  tiktoken: " + IdsNear(want, at, t);
}

TEST(TokenizerVsTiktoken, MatchesOnCorpusAndUnicodeProbes) {
  ASSERT_TRUE(PythonHasTiktoken()) << "python3 with tiktoken and regex is not available (scripts/python_deps.sh installs them)";
  KIMIRT_REQUIRE_FILE(testing::TestDataPath("data/gsm8k/train.jsonl"));
  // KIMIRT_TIKTOKEN_REFERENCE=DIR reuses (or creates once) the reference in DIR, for iterating on
  // the C++ side; by default it goes to a fresh temporary directory that is removed afterwards.
  const char* keep = std::getenv("KIMIRT_TIKTOKEN_REFERENCE");
  std::string dir;
  if (keep != nullptr && *keep != '\0') {
    dir = keep;
  } else {
    std::string tmpl = ::testing::TempDir() + "/kimirt-vs-tiktoken-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir = tmpl;
  }
  if (keep == nullptr || !std::filesystem::exists(dir + "/manifest.json")) {
    const std::string cmd = "python3 " + std::string(KIMIRT_SOURCE_DIR) +
                            "/tests/python/tokenizer_vs_tiktoken.py --out " + dir + " --gsm8k " +
                            testing::TestDataPath("data/gsm8k") + " --builtin " + BuiltinDir() + " > " + dir +
                            "/log.txt 2>&1";
    std::filesystem::create_directories(dir);
    ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd << "\n" << ReadFile(dir + "/log.txt");
  }
  const nlohmann::json manifest = nlohmann::json::parse(ReadFile(dir + "/manifest.json"));
  // The reference used exactly the pattern string we publish.
  EXPECT_EQ(manifest["pattern"].get<std::string>(), KimiPatternString());
  std::printf("[ reference ] tiktoken %s, python side %s\n",
              manifest["tiktoken_version"].get<std::string>().c_str(),
              manifest["seconds"].dump().c_str());

  // Corpus suites: the built-in and the large vocabulary, plain text and with specials allowed.
  Reader corpus{ReadFile(dir + "/corpus.bin")};
  std::vector<std::pair<std::string, std::string>> segments(corpus.U32());
  size_t corpus_bytes = 0;
  for (auto& [label, text] : segments) {
    label = corpus.Bytes(corpus.U32());
    text = corpus.Bytes(corpus.U32());
    corpus_bytes += text.size();
  }
  ASSERT_EQ(segments.size(), manifest["corpus_segments"].get<size_t>());
  ASSERT_EQ(corpus_bytes, manifest["corpus_bytes"].get<size_t>());
  size_t pieces = 0;
  {
    auto pre = Pretokenizer::Create();
    ASSERT_TRUE(pre.ok());
    for (const auto& seg : segments)
      (*pre)->ForEach(seg.second, [&](std::string_view) { ++pieces; });
  }
  EXPECT_GE(corpus_bytes, 1u << 20);
  for (const auto& suite : manifest["suites"]) {
    auto tok = Tokenizer::Load(suite["vocab_dir"].get<std::string>());
    ASSERT_TRUE(tok.ok()) << tok.status().ToString();
    for (const char* mode : {"ordinary", "special"}) {
      Reader expected{ReadFile(dir + "/" + suite["expected"][mode].get<std::string>())};
      ASSERT_EQ(expected.U32(), segments.size());
      size_t mismatches = 0, tokens = 0, round_trip_failures = 0;
      std::string report;
      for (const auto& [label, text] : segments) {
        const Ids want = expected.IdArray();
        const Ids got = (*tok)->Encode(text, std::string_view(mode) == "special");
        tokens += want.size();
        if (got != want && ++mismatches <= 3)
          report += Describe(**tok, label, text, got, want) + "\n";
        if ((*tok)->Decode(got) != text) ++round_trip_failures;
      }
      EXPECT_EQ(round_trip_failures, 0u) << "Decode(Encode(x)) != x";
      std::printf(
          "[ vs tiktoken ] %-7s %-8s %zu bytes, %zu segments, %zu pieces, %zu tokens: %zu "
          "mismatches\n",
          suite["name"].get<std::string>().c_str(), mode, corpus_bytes, segments.size(), pieces,
          tokens, mismatches);
      EXPECT_EQ(mismatches, 0u) << suite["name"] << " " << mode << "\n" << report;
    }
  }

  // Unicode probes: one piece of evidence per code point and context.
  ASSERT_TRUE(manifest.contains("probes")) << "reference made with --no-probes";
  const auto& probes = manifest["probes"];
  auto tok = Tokenizer::Load(probes["vocab_dir"].get<std::string>());
  ASSERT_TRUE(tok.ok()) << tok.status().ToString();
  const std::string text = ReadFile(dir + "/" + probes["text"].get<std::string>());
  const std::string ids_bytes = ReadFile(dir + "/" + probes["ids"].get<std::string>());
  std::vector<uint16_t> ids16(ids_bytes.size() / 2);  // the probe vocabulary fits 16 bits
  std::memcpy(ids16.data(), ids_bytes.data(), ids16.size() * 2);
  const Ids want_all(ids16.begin(), ids16.end());
  const std::string sep = probes["separator"];
  const auto sep_id = probes["separator_id"].get<int32_t>();
  const auto contexts = probes["contexts"];
  const size_t per_context = probes["code_points"].get<size_t>();
  size_t count = 0, mismatches = 0, start = 0, w = 0;
  std::string report;
  for (;;) {
    size_t end = text.find(sep, start);
    if (end == std::string::npos) end = text.size();
    const std::string_view probe = std::string_view(text).substr(start, end - start);
    Ids want;
    for (; w < want_all.size() && want_all[w] != sep_id; ++w) want.push_back(want_all[w]);
    ++w;
    const Ids got = (*tok)->Encode(probe);
    if (got != want && ++mismatches <= 10) {
      report += "context \"" + contexts[count / per_context][0].get<std::string>() +
                "\": " + Describe(**tok, "probe", probe, got, want) + "\n";
    }
    ++count;
    if (end == text.size()) break;
    start = end + sep.size();
  }
  std::printf(
      "[ vs tiktoken ] probes: %zu code points x %zu contexts = %zu probes: %zu mismatches\n",
      per_context, contexts.size(), count, mismatches);
  EXPECT_EQ(count, probes["count"].get<size_t>());
  EXPECT_EQ(mismatches, 0u) << report;
  if (keep == nullptr) std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kimirt
