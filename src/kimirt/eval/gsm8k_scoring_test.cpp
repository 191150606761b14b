// Each expectation follows by hand from the rules in gsm8k_scoring.h (lm-eval's gsm8k.yaml);
// the comment says which rule decides the case.
#include "kimirt/eval/gsm8k_scoring.h"

#include <gtest/gtest.h>

#include <cmath>

namespace kimirt::eval {
namespace {

struct Case {
  const char* response;
  const char* reference;
  const char* strict;    // extracted by strict-match
  const char* flexible;  // extracted by flexible-extract
  bool strict_ok;
  bool flexible_ok;
  const char* why;
};

const Case kCases[] = {
    {"Natalia sold 24 clips in May.\n#### 72", "She sold 72 clips.\n#### 72", "72", "72", true, true,
     "the reference keeps only what follows the last \"#### \""},
    {"#### 1,000", "#### 1000", "1,000", "1,000", true, true, "commas are removed before comparing"},
    {"The total is $1,200.", "#### 1200", "[invalid]", "$1,200.", false, true,
     "no \"#### \": strict fails; flexible keeps $ and the trailing period, normalisation drops both"},
    {"#### $5", "#### 5", "[invalid]", "$5", false, true, "strict's class has no '$'; flexible's has"},
    {"#### -3", "#### -3", "-3", "-3", true, true, "negative numbers: the optional '-'"},
    {"#### - 3", "#### -3", "[invalid]", "3", false, false, "a '-' must touch the digits"},
    {"####-3 and ####  4", "#### 4", "[invalid]", "4", false, true, "strict needs exactly \"#### \" then the number"},
    {"So she has 5 apples and 12 pears, 17 fruits.", "#### 17", "[invalid]", "17", false, true,
     "several numbers: flexible takes the last match (group_select -1)"},
    {"The answer is 42.", "#### 42", "[invalid]", "42.", false, true, "a trailing period is dropped (\\.$)"},
    {"I do not know.", "#### 42", "[invalid]", "[invalid]", false, false, "no number: the fallback [invalid]"},
    {"#### 5\nThen 7 more", "#### 5", "5", "7", true, false, "strict takes the first match, flexible the last"},
    {"#### 5.5.", "#### 5.5", "5.5.", "5.5.", true, true, "only one trailing period goes"},
    {"The result is 10..", "#### 10.", "[invalid]", "10..", false, false, "\"10..\" → \"10.\" vs \"10\""},
    {"It costs -$4.50 each", "#### -4.50", "[invalid]", "-$4.50", false, true, "'-' then the [$0-9.,] run"},
    {"Answer: -7", "#### -7", "[invalid]", "-7", false, true, "a single digit matches flexible's second group"},
    {"a . b $ c", "#### 3", "[invalid]", "[invalid]", false, false, "lone '.' or '$' is shorter than {2,}"},
    {"##### 18", "#### 18", "18", "18", true, true, "\"#### \" found inside \"##### \""},
    {"#### 18\n#### 19", "#### 19", "18", "19", false, true, "strict: first of several \"#### \" answers"},
    {"#### 3,5", "#### 35", "3,5", "3,5", true, true, "commas vanish wherever they are"},
    {"x = 3 - 5", "#### 5", "[invalid]", "5", false, true, "a spaced minus is an operator, not a sign"},
    {"first 12 then 1", "#### 1", "[invalid]", "1", false, true, "the last match may be a single digit"},
    {"#### 0.25", "#### .25", "0.25", "0.25", false, false, "no numeric equality: strings are compared"},
    {"#### 12 DOLLARS", "#### 12 dollars", "12", "12", false, false, "ignore_case applies, but the unit was not extracted"},
    {"--5", "#### -5", "[invalid]", "-5", false, true, "the second '-' starts the match"},
};

TEST(Gsm8kScoring, CraftedOutputs) {
  for (const Case& c : kCases) {
    const Gsm8kScore s = ScoreGsm8k(c.response, c.reference);
    EXPECT_EQ(s.strict_match.extracted, c.strict) << c.response << " — " << c.why;
    EXPECT_EQ(s.flexible_extract.extracted, c.flexible) << c.response << " — " << c.why;
    EXPECT_EQ(s.strict_match.correct, c.strict_ok) << c.response << " — " << c.why;
    EXPECT_EQ(s.flexible_extract.correct, c.flexible_ok) << c.response << " — " << c.why;
  }
}

TEST(Gsm8kScoring, Normalisation) {
  EXPECT_EQ(NormalizeForExactMatch("A #### B #### $1,000."), "1000");  // the LAST "#### " wins
  EXPECT_EQ(NormalizeForExactMatch("#### 5.\n"), "5\n");                 // '$' also matches before a final \n
  EXPECT_EQ(NormalizeForExactMatch("5.."), "5.");
  EXPECT_EQ(NormalizeForExactMatch("Abc.\n\n"), "abc.\n\n");            // not before two newlines
  EXPECT_EQ(NormalizeForExactMatch("x.\ny."), "x.\ny");
  EXPECT_EQ(NormalizeForExactMatch("[INVALID]"), "[invalid]");
  EXPECT_TRUE(ExactMatch("[invalid]", "[INVALID]"));
}

TEST(Gsm8kScoring, MeanStderrIsSampleStdOverRootN) {
  // [1, 0, 1, 1]: mean 0.75, sample variance 0.25, stderr sqrt(0.25) / 2 = 0.25.
  EXPECT_DOUBLE_EQ(MeanStderr({1, 0, 1, 1}), 0.25);
  // 50 samples, 37 right: sqrt(p(1-p) n/(n-1)) / sqrt(n) with p = 0.74.
  std::vector<double> v(50, 0.0);
  for (int i = 0; i < 37; ++i) v[static_cast<size_t>(i)] = 1;
  EXPECT_NEAR(MeanStderr(v), std::sqrt(0.74 * 0.26 * 50.0 / 49.0) / std::sqrt(50.0), 1e-15);
  EXPECT_TRUE(std::isnan(MeanStderr({1})));
}

}  // namespace
}  // namespace kimirt::eval
