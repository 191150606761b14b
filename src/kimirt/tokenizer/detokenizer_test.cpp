// Tests for the UTF-8 step, the incremental detokenizer and the stop-string matcher: streamed
// text == one-shot decode for every split of the bytes into tokens (4-byte emoji, CJK, invalid
// bytes), skip_special, and stop strings across token boundaries.
#include "kimirt/tokenizer/detokenizer.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

// A tokenizer whose tokens are whatever byte strings the test adds: lets a test cut text into
// tokens at any byte position, as byte-level BPE can.
class PieceTokenizer : public Tokenizer {
 public:
  int32_t Add(std::string bytes, bool special = false) {
    pieces_.push_back({std::move(bytes), special});
    return static_cast<int32_t>(pieces_.size() - 1);
  }
  std::vector<int32_t> Encode(std::string_view, bool) const override { return {}; }
  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += TokenBytes(id);
    return out;
  }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }
  int32_t num_base_tokens() const override { return 0; }
  std::string_view TokenBytes(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? std::string_view(pieces_[id].bytes) : std::string_view();
  }
  std::optional<int32_t> SpecialTokenId(std::string_view) const override { return std::nullopt; }
  bool IsSpecial(int32_t id) const override { return id >= 0 && id < vocab_size() && pieces_[id].special; }

 private:
  struct Piece {
    std::string bytes;
    bool special;
  };
  std::vector<Piece> pieces_;
};

// Streams `ids` and returns the concatenated output, checking that at most 3 bytes are ever held.
std::string Stream(const Tokenizer& tok, const std::vector<int32_t>& ids, bool skip = false) {
  IncrementalDetokenizer d(tok, skip);
  std::string out;
  for (int32_t id : ids) {
    out += d.Push(id);
    EXPECT_LT(d.held_bytes(), 4u);
  }
  return out + d.Flush();
}

const std::vector<std::string>& Corpus() {
  static const std::vector<std::string> corpus = {
      "Hello, world",
      "你好世界，今天天气很好。",                       // CJK, 3-byte
      "😀🎉👩‍👩‍👧 emoji with ZWJ",                // 4-byte + joiners
      "mixed é ü ß ı — ∑ 𝔘 x",                        // 2/3/4-byte
      "\xe4\xbd" "A broken 3-byte",                    // truncated sequence then ASCII
      "\xed\xa0\x80 surrogate, \xc0\xaf overlong, \xff, \xf4\x90\x80\x80 too big",
      "ends mid-character \xf0\x9f\x98",
      "\x80\x80 leading continuations",
  };
  return corpus;
}

TEST(DetokUtf8, ReplacementFollowsPythonDecodeReplace) {
  // Expected strings from CPython: bytes.decode("utf-8", "replace").
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(ReplaceInvalidUtf8("\xe4\xbd" "A"), r + "A");
  EXPECT_EQ(ReplaceInvalidUtf8("\xed\xa0\x80"), r + r + r);
  EXPECT_EQ(ReplaceInvalidUtf8("\xf0\x9f\x98"), r);
  EXPECT_EQ(ReplaceInvalidUtf8("\xc0\xaf"), r + r);
  EXPECT_EQ(ReplaceInvalidUtf8("\xf4\x90\x80\x80"), r + r + r + r);
  EXPECT_EQ(ReplaceInvalidUtf8("\xe0\x80"), r + r);
  EXPECT_EQ(ReplaceInvalidUtf8("a\x80" "b"), "a" + r + "b");
  EXPECT_EQ(ReplaceInvalidUtf8("\xe2\x82\xac\xe2"), "\xe2\x82\xac" + r);
  EXPECT_EQ(ReplaceInvalidUtf8("\xf0\x9f\x98\x80"), "\xf0\x9f\x98\x80");

  Utf8Step s = Utf8Next("\xf0\x9f\x98\x80");
  EXPECT_EQ(s.kind, Utf8Step::Kind::kValid);
  EXPECT_EQ(s.code_point, U'\U0001F600');
  EXPECT_EQ(Utf8Next("\xf0\x9f").kind, Utf8Step::Kind::kIncomplete);
  EXPECT_EQ(Utf8Next("\xe0\x9f").kind, Utf8Step::Kind::kInvalid);  // overlong E0 80..9F
}

TEST(DetokStream, EverySplitIntoTwoOrThreeTokensMatchesOneShotDecode) {
  for (const std::string& text : Corpus()) {
    const std::string want = ReplaceInvalidUtf8(text);
    for (size_t i = 0; i <= text.size(); ++i) {
      for (size_t j = i; j <= text.size(); ++j) {
        PieceTokenizer tok;
        const std::vector<int32_t> ids = {tok.Add(text.substr(0, i)),
                                          tok.Add(text.substr(i, j - i)), tok.Add(text.substr(j))};
        ASSERT_EQ(Stream(tok, ids), want) << "split " << i << "," << j << " of " << text;
      }
    }
  }
}

TEST(DetokStream, ByteTokensEmitEachCharacterOnceItIsComplete) {
  PieceTokenizer tok;
  std::vector<int32_t> ids;
  for (char c : std::string("a\xe4\xbd\xa0" "b")) ids.push_back(tok.Add(std::string(1, c)));
  IncrementalDetokenizer d(tok);
  EXPECT_EQ(d.Push(ids[0]), "a");
  EXPECT_EQ(d.Push(ids[1]), "");
  EXPECT_EQ(d.Push(ids[2]), "");
  EXPECT_EQ(d.Push(ids[3]), "\xe4\xbd\xa0");  // 你
  EXPECT_EQ(d.Push(ids[4]), "b");
  EXPECT_EQ(d.Flush(), "");

  // An invalid byte is replaced as soon as it is known to be invalid, not later.
  IncrementalDetokenizer e(tok);
  EXPECT_EQ(e.Push(tok.Add("\xe4\xbd")), "");
  EXPECT_EQ(e.Push(tok.Add("A")), "\xEF\xBF\xBD" "A");
}

TEST(DetokStream, SkipSpecialDropsOnlySpecialIds) {
  PieceTokenizer tok;
  const int32_t a = tok.Add("\xe4\xbd");
  const int32_t eos = tok.Add("[EOS]", /*special=*/true);
  const int32_t open = tok.Add("<|open|>", /*special=*/false);  // K3 markers are special: false
  const int32_t b = tok.Add("\xa0");
  EXPECT_EQ(Stream(tok, {open, a, eos, b}, /*skip=*/true), "<|open|>\xe4\xbd\xa0");
  // Without skipping, the special name splits the character: the same text as a one-shot decode.
  EXPECT_EQ(Stream(tok, {open, a, eos, b}), ReplaceInvalidUtf8(tok.Decode(std::vector<int32_t>{
                                                open, a, eos, b})));
}

StopMatcher::Output Feed(StopMatcher* m, const std::vector<std::string>& deltas,
                         std::string* emitted) {
  StopMatcher::Output last;
  for (const std::string& d : deltas) {
    last = m->Push(d);
    *emitted += last.text;
    if (last.stopped) break;
  }
  if (!last.stopped) *emitted += m->Flush();
  return last;
}

TEST(StopMatcher, MatchAcrossTokenBoundariesIsNeverEmitted) {
  StopMatcher m({"STOP"});
  std::string out;
  EXPECT_EQ(m.Push("Hello ST").text, "Hello ");  // "ST" could begin STOP: held
  EXPECT_EQ(m.held_bytes(), 2u);
  StopMatcher::Output o = m.Push("OP and more");
  EXPECT_TRUE(o.stopped);
  EXPECT_EQ(o.text, "");
  EXPECT_TRUE(m.Push("later").text.empty());  // nothing after a stop
  EXPECT_EQ(m.Flush(), "");
}

TEST(StopMatcher, HeldTextIsReleasedWhenItStopsMatching) {
  StopMatcher m({"STOP"});
  std::string out;
  const StopMatcher::Output o = Feed(&m, {"a S", "T", "x", "ST"}, &out);
  EXPECT_FALSE(o.stopped);
  EXPECT_EQ(out, "a STxST");  // the trailing "ST" comes out at Flush
}

TEST(StopMatcher, EarliestMatchWinsThenListOrder) {
  {
    StopMatcher m({"world", "lo w"});
    std::string out;
    const StopMatcher::Output o = Feed(&m, {"hello world"}, &out);
    EXPECT_TRUE(o.stopped);
    EXPECT_EQ(o.stop_index, 1u);
    EXPECT_EQ(out, "hel");
  }
  {
    StopMatcher m({"", "ab", "abc"});  // empty ignored; same start: first listed
    std::string out;
    const StopMatcher::Output o = Feed(&m, {"xabc"}, &out);
    EXPECT_EQ(o.stop_index, 1u);
    EXPECT_EQ(out, "x");
  }
  {
    StopMatcher m({"\n\n"});
    std::string out;
    EXPECT_TRUE(Feed(&m, {"\n", "\n", "tail"}, &out).stopped);
    EXPECT_EQ(out, "");
  }
}

TEST(StopMatcher, EverySplitOfDetokenizedStreamGivesTheSameText) {
  // Multi-byte stop string; the text streamed through the detokenizer at every byte split.
  const std::string text = "答えは「東京」です。以上";
  const std::string stop = "」で";
  const std::string want = "答えは「東京";
  for (size_t i = 0; i <= text.size(); ++i) {
    for (size_t j = i; j <= text.size(); ++j) {
      PieceTokenizer tok;
      IncrementalDetokenizer d(tok);
      StopMatcher m({stop, "never"});
      std::string out;
      bool stopped = false;
      for (const std::string& piece : {text.substr(0, i), text.substr(i, j - i), text.substr(j)}) {
        StopMatcher::Output o = m.Push(d.Push(tok.Add(piece)));
        out += o.text;
        if ((stopped = o.stopped)) break;
      }
      ASSERT_TRUE(stopped) << i << "," << j;
      ASSERT_EQ(out, want) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace kimirt
