// Incremental detokenizer and stop-string matcher (detokenizer.h states the text rules).
#include "kimirt/tokenizer/detokenizer.h"

#include <algorithm>
#include <utility>

#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD in UTF-8

}  // namespace

// Well-formed sequences per Unicode Table 3-7. The first byte fixes the range of the second
// (this is what rules out overlong forms, surrogates and code points above U+10FFFF); later
// continuation bytes are always 80..BF. An ill-formed subpart ends at the first byte that breaks
// the pattern, which starts the next step (Unicode §3.9 "maximal subpart" replacement).
Utf8Step Utf8Next(std::string_view bytes) {
  const auto b0 = static_cast<unsigned char>(bytes[0]);
  if (b0 < 0x80) return {Utf8Step::Kind::kValid, 1, b0};
  size_t need;  // continuation bytes
  unsigned char lo = 0x80, hi = 0xBF;  // range of the second byte
  char32_t cp;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
    cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Step::Kind::kInvalid, 1, 0};  // 80..C1, F5..FF never start a character
  }
  for (size_t k = 1; k <= need; ++k) {
    if (k >= bytes.size()) return {Utf8Step::Kind::kIncomplete, bytes.size(), 0};
    const auto b = static_cast<unsigned char>(bytes[k]);
    const unsigned char min = k == 1 ? lo : 0x80;
    const unsigned char max = k == 1 ? hi : 0xBF;
    if (b < min || b > max) return {Utf8Step::Kind::kInvalid, k, 0};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {Utf8Step::Kind::kValid, need + 1, cp};
}

std::string ReplaceInvalidUtf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  while (!bytes.empty()) {
    Utf8Step step = Utf8Next(bytes);
    if (step.kind == Utf8Step::Kind::kValid) {
      out.append(bytes.data(), step.length);
    } else {
      out += kReplacement;  // an incomplete tail is one maximal subpart at end of input
    }
    bytes.remove_prefix(step.length);
  }
  return out;
}

IncrementalDetokenizer::IncrementalDetokenizer(const Tokenizer& tokenizer, bool skip_special)
    : tokenizer_(tokenizer), skip_special_(skip_special) {}

std::string IncrementalDetokenizer::Push(int32_t id) {
  if (skip_special_ && tokenizer_.IsSpecial(id)) return {};
  pending_ += tokenizer_.TokenBytes(id);
  std::string out;
  std::string_view rest = pending_;
  while (!rest.empty()) {
    Utf8Step step = Utf8Next(rest);
    if (step.kind == Utf8Step::Kind::kIncomplete) break;  // may still complete: hold it
    if (step.kind == Utf8Step::Kind::kValid) {
      out.append(rest.data(), step.length);
    } else {
      out += kReplacement;
    }
    rest.remove_prefix(step.length);
  }
  pending_ = std::string(rest);
  return out;
}

std::string IncrementalDetokenizer::Flush() {
  std::string out = ReplaceInvalidUtf8(pending_);
  pending_.clear();
  return out;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (size_t i = 0; i < stops.size(); ++i) {
    if (stops[i].empty()) continue;
    stops_.push_back(std::move(stops[i]));
    original_index_.push_back(i);
  }
}

StopMatcher::Output StopMatcher::Push(std::string_view text) {
  Output out;
  if (stopped_) {
    out.stopped = true;
    return out;
  }
  std::string buf = std::move(held_);
  held_.clear();
  buf += text;

  size_t best_pos = std::string::npos;
  size_t best = 0;
  for (size_t i = 0; i < stops_.size(); ++i) {
    const size_t pos = buf.find(stops_[i]);
    if (pos < best_pos) {
      best_pos = pos;
      best = i;
    }
  }
  if (best_pos != std::string::npos) {
    buf.resize(best_pos);
    out.text = std::move(buf);
    out.stopped = true;
    out.stop_index = original_index_[best];
    stopped_ = true;
    return out;
  }

  // Hold the longest tail that is a proper prefix of some stop string; it may complete later.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    const size_t max_k = std::min(buf.size(), s.size() - 1);
    for (size_t k = max_k; k > hold; --k) {
      if (std::string_view(buf).substr(buf.size() - k) == std::string_view(s).substr(0, k)) {
        hold = k;
        break;
      }
    }
  }
  held_ = buf.substr(buf.size() - hold);
  buf.resize(buf.size() - hold);
  out.text = std::move(buf);
  return out;
}

std::string StopMatcher::Flush() {
  if (stopped_) return {};
  std::string out = std::move(held_);
  held_.clear();
  return out;
}

}  // namespace kimirt
