#include "kimirt/eval/gsm8k_scoring.h"

#include <cmath>
#include <limits>

namespace kimirt::eval {
namespace {

bool IsDigit(char c) { return c >= '0' && c <= '9'; }
bool InStrictClass(char c) { return IsDigit(c) || c == '.' || c == ','; }      // [0-9\.\,]
bool InFlexibleClass(char c) { return IsDigit(c) || c == '$' || c == '.' || c == ','; }  // [$0-9.,]

// Python's str.strip() for the characters these groups can hold: ASCII whitespace.
std::string Strip(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string_view::npos) return "";
  const size_t e = s.find_last_not_of(ws);
  return std::string(s.substr(b, e - b + 1));
}

size_t RunLength(std::string_view s, size_t pos, bool (*in_class)(char)) {
  size_t n = 0;
  while (pos + n < s.size() && in_class(s[pos + n])) ++n;
  return n;
}

// "(-?[$0-9.,]{2,})|(-?[0-9]+)" tried at `pos` as Python's backtracking engine would: the first
// alternative with and then without the '-', then the second alternative the same way. Returns
// the match length (0: no match) and the text of the group that matched.
size_t FlexibleMatchAt(std::string_view s, size_t pos, std::string_view* group) {
  const bool minus = s[pos] == '-';
  if (minus) {
    const size_t run = RunLength(s, pos + 1, InFlexibleClass);
    if (run >= 2) {
      *group = s.substr(pos, run + 1);
      return run + 1;
    }
  }
  // Without the optional '-': the class has no '-', so a leading '-' fails here.
  if (!minus) {
    const size_t run = RunLength(s, pos, InFlexibleClass);
    if (run >= 2) {
      *group = s.substr(pos, run);
      return run;
    }
  }
  if (minus) {
    const size_t digits = RunLength(s, pos + 1, IsDigit);
    if (digits >= 1) {
      *group = s.substr(pos, digits + 1);
      return digits + 1;
    }
  } else {
    const size_t digits = RunLength(s, pos, IsDigit);
    if (digits >= 1) {
      *group = s.substr(pos, digits);
      return digits;
    }
  }
  return 0;
}

std::string RemoveAll(std::string_view s, char c) {
  std::string out;
  out.reserve(s.size());
  for (char x : s) {
    if (x != c) out.push_back(x);
  }
  return out;
}

}  // namespace

std::string StrictMatchExtract(std::string_view response) {
  // findall scans left to right; the first match is the one kept (take_first, group_select 0).
  static constexpr std::string_view kMarker = "#### ";
  for (size_t pos = response.find(kMarker); pos != std::string_view::npos; pos = response.find(kMarker, pos + 1)) {
    size_t start = pos + kMarker.size();
    // "\-?" then "[0-9\.\,]+": with the '-' if a class character follows it, else without (and
    // then the '-' itself must be in the class, which it is not).
    if (start < response.size() && response[start] == '-') {
      const size_t run = RunLength(response, start + 1, InStrictClass);
      if (run >= 1) return Strip(response.substr(start, run + 1));
      continue;
    }
    const size_t run = RunLength(response, start, InStrictClass);
    if (run >= 1) return Strip(response.substr(start, run));
  }
  return std::string(kInvalidAnswer);
}

std::string FlexibleExtract(std::string_view response) {
  std::string_view last;
  bool found = false;
  size_t pos = 0;
  while (pos < response.size()) {
    std::string_view group;
    const size_t len = FlexibleMatchAt(response, pos, &group);
    if (len == 0) {
      ++pos;
      continue;
    }
    last = group;
    found = true;
    pos += len;  // findall resumes after a non-empty match
  }
  return found ? Strip(last) : std::string(kInvalidAnswer);
}

std::string NormalizeForExactMatch(std::string_view s) {
  std::string t = RemoveAll(s, ',');
  t = RemoveAll(t, '$');
  // "(?s).*#### ": the greedy match from the start ends at the last "#### "; the rest of the
  // string cannot match again.
  if (const size_t last = t.rfind("#### "); last != std::string::npos) t.erase(0, last + 5);
  // "\.$": Python's '$' matches at the end and before a final '\n'; at most one '.' qualifies.
  if (!t.empty() && t.back() == '.') {
    t.pop_back();
  } else if (t.size() >= 2 && t[t.size() - 1] == '\n' && t[t.size() - 2] == '.') {
    t.erase(t.size() - 2, 1);
  }
  // ignore_case: np.char.lower. Extracted answers are ASCII by construction; a non-ASCII
  // reference would need full Unicode lower-casing, which GSM8K's numeric answers never do.
  for (char& c : t) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return t;
}

bool ExactMatch(std::string_view prediction, std::string_view reference) {
  return NormalizeForExactMatch(prediction) == NormalizeForExactMatch(reference);
}

Gsm8kScore ScoreGsm8k(std::string_view response, std::string_view reference) {
  Gsm8kScore s;
  s.strict_match.extracted = StrictMatchExtract(response);
  s.strict_match.correct = ExactMatch(s.strict_match.extracted, reference);
  s.flexible_extract.extracted = FlexibleExtract(response);
  s.flexible_extract.correct = ExactMatch(s.flexible_extract.extracted, reference);
  return s;
}

double MeanStderr(const std::vector<double>& values) {
  const size_t n = values.size();
  if (n < 2) return std::numeric_limits<double>::quiet_NaN();
  double mean = 0;
  for (double v : values) mean += v;
  mean /= static_cast<double>(n);
  double ss = 0;
  for (double v : values) ss += (v - mean) * (v - mean);
  return std::sqrt(ss / static_cast<double>(n - 1)) / std::sqrt(static_cast<double>(n));
}

}  // namespace kimirt::eval
