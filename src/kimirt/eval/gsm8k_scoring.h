// lm-eval's gsm8k scoring, reproduced rule by rule (EleutherAI/lm-evaluation-harness:
// lm_eval/tasks/gsm8k/gsm8k.yaml, lm_eval/filters/extraction.py RegexFilter,
// lm_eval/filters/selection.py TakeFirstFilter, lm_eval/api/metrics.py exact_match_hf_evaluate,
// mean_stderr). Hand-written matchers instead of std::regex: the two patterns are simple, and
// Python's `re` semantics (findall, group choice, '$') are easier to get exactly right by hand.
//
// Filters, applied to the raw generated text:
//   strict-match:     regex "#### (\-?[0-9\.\,]+)", the FIRST match's group, stripped.
//   flexible-extract: regex "(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select -1 = the LAST match;
//                     of its two groups the first non-empty one, stripped.
//   No match: "[invalid]".
// exact_match (ignore_case true, ignore_punctuation false), on the extracted answer and the full
// reference answer alike, in this order: re.sub(",", ""), re.sub("\$", ""), re.sub("(?s).*#### ",
// "") (everything up to the LAST "#### "), re.sub("\.$", "") (one '.' at the very end, or just
// before a final '\n'), lower-case, then string equality.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace kimirt::eval {

inline constexpr std::string_view kInvalidAnswer = "[invalid]";  // RegexFilter's fallback

std::string StrictMatchExtract(std::string_view response);
std::string FlexibleExtract(std::string_view response);
// The regexes_to_ignore and ignore_case steps above.
std::string NormalizeForExactMatch(std::string_view s);
bool ExactMatch(std::string_view prediction, std::string_view reference);

struct FilterScore {
  std::string extracted;
  bool correct = false;
};
struct Gsm8kScore {
  FilterScore strict_match;
  FilterScore flexible_extract;
};
// `reference` is the document's full answer (doc_to_target).
Gsm8kScore ScoreGsm8k(std::string_view response, std::string_view reference);

// lm-eval's stderr for a mean: sample standard deviation (n - 1) over sqrt(n). NaN for n < 2.
double MeanStderr(const std::vector<double>& values);

}  // namespace kimirt::eval
