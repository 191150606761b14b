// Pre-tokenizer tests: hand-derived piece lists for each alternative of the K3 pattern (spec
// §10.1), the PCRE2-specific pitfalls (Script vs Script_Extensions Han, `\s` vs White_Space),
// ill-formed UTF-8, and the ASCII fast path against the PCRE2-only path. Agreement with tiktoken
// itself is TokenizerVsTiktoken's job (tokenizer_test.cpp).
#include "kimirt/tokenizer/pretokenizer.h"

#include <gtest/gtest.h>

#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/testing/test_data.h"

namespace kimirt {
namespace {

using Pieces = std::vector<std::string>;

const Pretokenizer& Pre() {
  static const std::unique_ptr<Pretokenizer> p = [] {
    auto r = Pretokenizer::Create();
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    return std::move(r).value();
  }();
  return *p;
}

Pieces Split(std::string_view text, bool fast) {
  Pieces out;
  for (std::string_view p : Pre().Split(text, fast)) out.emplace_back(p);
  return out;
}

// Checks both paths against the expected pieces.
void ExpectPieces(std::string_view text, const Pieces& want) {
  EXPECT_EQ(Split(text, /*fast=*/true), want) << "fast path, text: \"" << text << "\"";
  EXPECT_EQ(Split(text, /*fast=*/false), want) << "PCRE2 path, text: \"" << text << "\"";
}

TEST(Pretokenizer, PatternCompiles) {
  EXPECT_FALSE(KimiPatternPcre2().empty());
  EXPECT_TRUE(Pretokenizer::Create().ok());
}

TEST(Pretokenizer, EmptyText) { ExpectPieces("", {}); }

TEST(Pretokenizer, WordsTakeTheirLeadingSpace) {
  // Alt 2: an optional non-letter/digit/newline prefix, then letters.
  ExpectPieces("Hello world", {"Hello", " world"});
  ExpectPieces("The capital of France is", {"The", " capital", " of", " France", " is"});
  ExpectPieces("\thello", {"\thello"});
  ExpectPieces("(hello)", {"(hello", ")"});
  ExpectPieces("!!!hello", {"!!!", "hello"});  // the prefix is at most one character
  ExpectPieces("naïve café", {"naïve", " café"});
}

TEST(Pretokenizer, CaseRuns) {
  // Alt 2 takes uppercase then lowercase; alt 3 an uppercase run with no lowercase after it.
  ExpectPieces("HelloWorld", {"Hello", "World"});
  ExpectPieces("ABCdef", {"ABCdef"});
  ExpectPieces("XMLHttpRequest", {"XMLHttp", "Request"});
  ExpectPieces("ABC DEF", {"ABC", " DEF"});
  ExpectPieces("iPhone", {"i", "Phone"});
}

TEST(Pretokenizer, Contractions) {
  ExpectPieces("don't", {"don't"});
  ExpectPieces("DON'T", {"DON'T"});
  ExpectPieces("I'm you're we'll they've he'd it's",
               {"I'm", " you're", " we'll", " they've", " he'd", " it's"});
  ExpectPieces("they'VE we'Ll she'D", {"they'VE", " we'Ll", " she'D"});
  // Not contractions: the apostrophe starts the next piece.
  ExpectPieces("rock'n'roll", {"rock", "'n", "'roll"});
  ExpectPieces("we'lx", {"we", "'lx"});
  ExpectPieces("'s", {"'s"});
  ExpectPieces("x 's", {"x", " '", "s"});
  // U+017F (long s) case-folds to s, so "'ſ" is a contraction too.
  ExpectPieces("it'\u017f", {"it'\u017f"});
}

TEST(Pretokenizer, DigitsInGroupsOfThree) {
  ExpectPieces("1234567", {"123", "456", "7"});
  ExpectPieces("x12y", {"x", "12", "y"});
  ExpectPieces("$1,000.50", {"$", "1", ",", "000", ".", "50"});
  ExpectPieces("a 1", {"a", " ", "1"});
  // Non-ASCII \p{N}: Arabic-Indic digits join ASCII ones; superscript two is No.
  ExpectPieces("12\u0663\u0664", {"12\u0663", "\u0664"});
  ExpectPieces("x\u00b2", {"x", "\u00b2"});
}

TEST(Pretokenizer, Whitespace) {
  // Alt 7 `\s+(?!\S)` leaves the last space to prefix the next word; at the end it takes all.
  ExpectPieces("a   b", {"a", "  ", " b"});
  ExpectPieces("a   ", {"a", "   "});
  ExpectPieces("a \tb", {"a", " ", "\tb"});
  ExpectPieces("a \t1", {"a", " ", "\t", "1"});
  ExpectPieces("a\t1", {"a", "\t", "1"});  // alt 8: a single whitespace before non-space
  // Alt 6 `\s*[\r\n]+` ends at the last newline of the run.
  ExpectPieces("a\n\n b", {"a", "\n\n", " b"});
  ExpectPieces("a \n  b", {"a", " \n", " ", " b"});
  ExpectPieces("a\r\n\r\nb", {"a", "\r\n\r\n", "b"});
  ExpectPieces("\n\n\n", {"\n\n\n"});
  // Alt 5 takes trailing newlines after symbols; a space joins symbols, a tab does not.
  ExpectPieces("hello!\n\nworld", {"hello", "!\n\n", "world"});
  ExpectPieces("a += 1", {"a", " +=", " ", "1"});
  ExpectPieces("a\t+= 1", {"a", "\t", "+=", " ", "1"});
}

TEST(Pretokenizer, UnicodeWhitespaceIsRustsWhiteSpace) {
  // NBSP and U+3000 are \s; as a prefix they join the next word.
  ExpectPieces("x\u00a0y", {"x", "\u00a0y"});
  ExpectPieces("x\u3000\u3000y", {"x", "\u3000", "\u3000y"});
  // U+0085 (NEL) is \s: two of them split like two spaces.
  ExpectPieces("a\u0085\u0085b", {"a", "\u0085", "\u0085b"});
  // U+180E is not White_Space (PCRE2's \s would say it is): it is a symbol here.
  ExpectPieces("a\u180e\u180eb", {"a", "\u180e\u180e", "b"});
  // U+001C..U+001F are not \s either (Python's isspace() disagrees; that only matters for
  // NeMo's long-run split).
  ExpectPieces("a\x1c\x1c b", {"a", "\x1c\x1c", " b"});
}

TEST(Pretokenizer, HanRunsAreScriptHanOnly) {
  ExpectPieces("你好世界", {"你好世界"});
  ExpectPieces("Hello你好world", {"Hello", "你好", "world"});
  // "，" and "、" are not Script=Han (PCRE2's bare \p{Han} is Script_Extensions and would join
  // "、" to the run).
  ExpectPieces("你好，世界", {"你好", "，", "世界"});
  ExpectPieces("你、我", {"你", "、", "我"});
  // Kana are Lo but not Han: they take the letter alternatives.
  ExpectPieces("日本語とEnglish", {"日本語", "とEnglish"});
  // 々 (Lm, Script=Han) and 〇 (Nl, Script=Han) are Han; 〇 is also \p{N}.
  ExpectPieces("人々", {"人々"});
  ExpectPieces("一〇", {"一〇"});
  // CJK Extension H (Unicode 15) is Han for tiktoken although PCRE2 10.42 does not know it.
  ExpectPieces("你\U00031350", {"你\U00031350"});
}

TEST(Pretokenizer, LettersAndMarks) {
  // Lm/Lo are in both letter classes: "Aʰ" backtracks U* so L+ gets ʰ.
  ExpectPieces("A\u02b0", {"A\u02b0"});
  ExpectPieces("e\u0301x", {"e\u0301x"});  // a combining mark stays in the word
  ExpectPieces("\u0301x", {"\u0301x"});    // ...and is a letter-class member itself
  ExpectPieces("\u0915\u094d\u0937", {"\u0915\u094d\u0937"});
  ExpectPieces("\u01c5ungla", {"\u01c5ungla"});  // Lt
  ExpectPieces("😀😀 hi", {"😀😀", " hi"});
}

TEST(Pretokenizer, IllFormedUtf8BytesArePiecesOfTheirOwn) {
  ExpectPieces(
      "ab\xff"
      "cd",
      {"ab", "\xff", "cd"});
  ExpectPieces("\xe4\xbd", {"\xe4", "\xbd"});  // truncated 你
  ExpectPieces("a\xc3", {"a", "\xc3"});
  ExpectPieces("\xc0\xaf", {"\xc0", "\xaf"});                    // overlong
  ExpectPieces("\xed\xa0\x80x", {"\xed", "\xa0", "\x80", "x"});  // surrogate
  // An ill-formed byte is a barrier, like the end of the text, for `\s+(?!\S)`.
  ExpectPieces("a  \xff", {"a", "  ", "\xff"});
  ExpectPieces("\xff\xfe", {"\xff", "\xfe"});
}

// Pieces always tile the input.
void ExpectTiles(std::string_view text) {
  for (bool fast : {true, false}) {
    std::string joined;
    size_t n = 0;
    Pre().ForEach(
        text,
        [&](std::string_view p) {
          EXPECT_FALSE(p.empty());
          EXPECT_EQ(p.data(), text.data() + joined.size());
          joined += p;
          ++n;
        },
        fast);
    EXPECT_EQ(joined, text);
  }
}

std::string RandomText(std::mt19937& rng, const std::vector<std::string>& alphabet, size_t n) {
  std::string s;
  std::uniform_int_distribution<size_t> pick(0, alphabet.size() - 1);
  for (size_t i = 0; i < n; ++i) s += alphabet[pick(rng)];
  return s;
}

TEST(Pretokenizer, FastPathMatchesPcre2OnRandomText) {
  // Every ASCII class the fast path distinguishes, the contraction letters in both cases, and
  // non-ASCII characters of each class it must hand to PCRE2.
  const std::vector<std::string> alphabet = {
      "a",      "b",      "A",      "B",      "s",          "S",      "t",      "T",
      "r",      "R",      "e",      "E",      "v",          "V",      "m",      "M",
      "l",      "L",      "d",      "D",      "0",          "7",      "'",      "'",
      "'",      " ",      " ",      " ",      "\t",         "\n",     "\r",     "\v",
      "\f",     "!",      ".",      "-",      "\x1c",       "\x00",   "\x7f",   "\u00a0",
      "\u3000", "\u0085", "\u00e9", "\u00c9", "\u02b0",     "\u0301", "\u4e00", "\u3001",
      "\u00b2", "\u0663", "\u017f", "\u212a", "\U0001f600", "\u180e", "\xff",   "\xe4\xbd"};
  std::mt19937 rng(12345);
  std::uniform_int_distribution<size_t> len(1, 24);
  for (int i = 0; i < 200000; ++i) {
    std::string s = RandomText(rng, alphabet, len(rng));
    if (Split(s, true) != Split(s, false)) {
      ADD_FAILURE() << "fast path and PCRE2 differ on \"" << s << "\"";
      break;
    }
  }
  // ASCII-only text stresses the fast path's own decisions.
  const std::vector<std::string> ascii = {"a", "B",  "s",  "S",  "l", "L", "e", "'", " ",
                                          " ", "\t", "\n", "\r", "1", "2", "!", "?", "\x1c"};
  for (int i = 0; i < 200000; ++i) {
    std::string s = RandomText(rng, ascii, len(rng));
    if (Split(s, true) != Split(s, false)) {
      ADD_FAILURE() << "fast path and PCRE2 differ on \"" << s << "\"";
      break;
    }
  }
}

TEST(Pretokenizer, FastPathMatchesPcre2OnGsm8k) {
  const std::string path = testing::TestDataPath("data/gsm8k/test.jsonl");
  KIMIRT_REQUIRE_FILE(path);
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  const auto fast = Pre().Split(text, true);
  const auto slow = Pre().Split(text, false);
  ASSERT_EQ(fast.size(), slow.size());
  for (size_t i = 0; i < fast.size(); ++i) {
    ASSERT_EQ(fast[i], slow[i]) << "piece " << i;
    ASSERT_EQ(fast[i].data(), slow[i].data()) << "piece " << i;
  }
  ExpectTiles(text);
}

TEST(Pretokenizer, LongPiecesDoNotFail) {
  // 25,000-character pieces (NeMo's run limit) through PCRE2's letter alternatives with a
  // lookahead group per character: more than the JIT's default stack would hold.
  for (const std::string unit : {"\u0627", "\u00e9", "A\u02b0", "\u4e00", "\u0301"}) {
    std::string s;
    for (int i = 0; i < 25000; ++i) s += unit;
    const auto pieces = Pre().Split(s);
    ExpectTiles(s);
    EXPECT_LE(pieces.size(), 2u) << "unit " << unit;
  }
}

}  // namespace
}  // namespace kimirt
