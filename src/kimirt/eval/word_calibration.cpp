#include "kimirt/eval/word_calibration.h"

#include <algorithm>
#include <cmath>

namespace kimirt::eval {

Result<WordCalibrationReport> CalibrateWords(OpenAiClient& client, const std::string& endpoint,
                                             const std::function<nlohmann::json(const std::string&)>& body_for,
                                             int64_t target) {
  WordCalibrationReport rep;
  auto tokens = [&](const std::string& text) -> Result<int64_t> {
    KIMIRT_ASSIGN_OR_RETURN(Completion c, client.Complete(endpoint, body_for(text)));
    return c.usage.prompt_tokens;
  };
  auto probe = [&](int64_t words, const WordCalibration& fit) -> Result<int64_t> {
    constexpr uint64_t kStream = 0x63616c6962726174ull;  // "calibrat"
    KIMIRT_ASSIGN_OR_RETURN(int64_t t, tokens(RandomWordsPrompt(words, kStream, fit.vocab)));
    rep.probes.emplace_back(words, t);
    return t;
  };

  WordCalibration fit;
  KIMIRT_ASSIGN_OR_RETURN(int64_t p16, tokens(RepeatedWordPrompt("the", 16)));
  if (p16 < 0) {
    rep.note = "the server reports no usage.prompt_tokens: one word per token assumed";
    return rep;
  }
  KIMIRT_ASSIGN_OR_RETURN(int64_t p8, tokens(RepeatedWordPrompt("the", 8)));
  bool screened = false;
  if (p16 - p8 == 8) {
    const int64_t overhead = p8 - 8;
    std::vector<std::string> kept;
    for (const std::string& w : fit.vocab) {
      int64_t p = p16;
      if (w != "the") {
        KIMIRT_ASSIGN_OR_RETURN(p, tokens(RepeatedWordPrompt(w, 16)));
      }
      if (p == overhead + 16) kept.push_back(w);
    }
    if (kept.size() >= 8) {
      rep.words_kept = kept.size();
      fit.vocab = std::move(kept);
      fit.intercept = static_cast<double>(overhead);
      fit.slope = 1;
      screened = true;
    }
  }
  if (!screened) {
    // Fit a line on two random prompts of the full word list.
    KIMIRT_ASSIGN_OR_RETURN(int64_t p1, probe(target, fit));
    const int64_t w2 = target / 2;
    if (w2 >= 2) {
      KIMIRT_ASSIGN_OR_RETURN(int64_t p2, probe(w2, fit));
      if (p2 >= 0 && p1 > p2) fit.slope = static_cast<double>(p1 - p2) / static_cast<double>(target - w2);
    }
    fit.intercept = static_cast<double>(p1) - fit.slope * static_cast<double>(target);
  }
  // Check the target, and walk the word count until a probe lands on it.
  int64_t words = fit.WordsFor(target);
  for (int step = 0; step < 4; ++step) {
    KIMIRT_ASSIGN_OR_RETURN(int64_t got, probe(words, fit));
    fit.intercept = static_cast<double>(got) - fit.slope * static_cast<double>(words);
    if (got == target) break;
    const auto delta = static_cast<int64_t>(std::llround(static_cast<double>(target - got) / fit.slope));
    words = std::max<int64_t>(1, words + (delta == 0 ? (target > got ? 1 : -1) : delta));
  }
  rep.performed = true;
  rep.fit = std::move(fit);
  const int64_t last = rep.probes.back().second;
  if (last != target) {
    if (rep.fit.intercept + rep.fit.slope >= static_cast<double>(target)) {
      rep.note = "the endpoint adds " + std::to_string(std::llround(rep.fit.intercept)) +
                 " tokens of its own (e.g. a chat template), so no prompt is as short as " + std::to_string(target) +
                 " tokens; prompts have " + std::to_string(last) + " (raise --input-len)";
    } else {
      rep.note = "the closest prompt has " + std::to_string(last) + " tokens for a target of " + std::to_string(target) +
                 (screened ? "" : " (the server's tokenizer splits the benchmark's words; lengths vary by request)");
    }
  }
  return rep;
}

}  // namespace kimirt::eval
