// OpenAI logprobs formatting (logprobs_format.h).
#include "kimirt/server/logprobs_format.h"

#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "kimirt/tokenizer/detokenizer.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {
namespace {

Json ByteArray(std::string_view bytes) {
  Json a = Json::array();
  for (char c : bytes) a.push_back(static_cast<unsigned char>(c));
  return a;
}

}  // namespace

int64_t CodePoints(std::string_view utf8) {
  int64_t n = 0;
  for (char c : utf8) n += (static_cast<unsigned char>(c) & 0xC0) != 0x80;
  return n;
}

std::string TokenDisplayText(const Tokenizer& tokenizer, int32_t id) {
  const std::string_view bytes = tokenizer.TokenBytes(id);
  if (ReplaceInvalidUtf8(bytes) == bytes) return std::string(bytes);
  std::string out = "bytes:";
  char buf[8];
  for (char c : bytes) {
    std::snprintf(buf, sizeof(buf), "\\x%02x", static_cast<unsigned char>(c));
    out += buf;
  }
  return out;
}

double JsonLogprob(float logprob) {
  if (std::isnan(logprob) || logprob < -9999.0f) return -9999.0;
  return static_cast<double>(logprob);
}

LegacyLogprobs::LegacyLogprobs(const Tokenizer& tokenizer, int64_t initial_text_offset)
    : tokenizer_(tokenizer), offset_(initial_text_offset) {}

void LegacyLogprobs::AddToken(int32_t id, Entry entry) {
  entry.token = TokenDisplayText(tokenizer_, id);
  entry.text_offset = offset_;
  // Generated special tokens are not in the completion text (the engine detokenizes with
  // skip_special, as vLLM does); a prompt's are, as the client wrote them.
  if (entry.is_prompt || !tokenizer_.IsSpecial(id)) {
    offset_ += CodePoints(ReplaceInvalidUtf8(tokenizer_.TokenBytes(id)));
  }
  pending_.push_back(std::move(entry));
}

void LegacyLogprobs::AddPromptToken(int32_t id) {
  Entry e;
  e.is_prompt = true;
  e.scored = false;
  AddToken(id, std::move(e));
}

void LegacyLogprobs::AddPromptToken(const SampleResult& scored) {
  Entry e = Scored(scored);
  e.is_prompt = true;
  AddToken(scored.token, std::move(e));
}

void LegacyLogprobs::AddSampled(const SampleResult& sample) { AddToken(sample.token, Scored(sample)); }

LegacyLogprobs::Entry LegacyLogprobs::Scored(const SampleResult& sample) const {
  Entry e;
  e.logprob = JsonLogprob(sample.logprob);
  for (const TokenLogprob& t : sample.top) e.top.emplace_back(TokenDisplayText(tokenizer_, t.token), JsonLogprob(t.logprob));
  e.top.emplace_back(TokenDisplayText(tokenizer_, sample.token), e.logprob);  // dropped if already listed
  return e;
}

Json LegacyLogprobs::TakeJson() {
  Json tokens = Json::array(), logprobs = Json::array(), tops = Json::array(), offsets = Json::array();
  for (Entry& e : pending_) {
    tokens.push_back(std::move(e.token));
    offsets.push_back(e.text_offset);
    if (!e.scored) {
      logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    logprobs.push_back(e.logprob);
    Json top = Json::object();
    for (auto& [token, lp] : e.top) {
      if (!top.contains(token)) top[token] = lp;
    }
    tops.push_back(std::move(top));
  }
  pending_.clear();
  Json out = Json::object();
  out["tokens"] = std::move(tokens);
  out["token_logprobs"] = std::move(logprobs);
  out["top_logprobs"] = std::move(tops);
  out["text_offset"] = std::move(offsets);
  return out;
}

Json ChatLogprobsContent(const Tokenizer& tokenizer, std::span<const SampleResult> samples, int32_t top_logprobs) {
  Json content = Json::array();
  for (const SampleResult& s : samples) {
    Json entry = Json::object();
    entry["token"] = TokenDisplayText(tokenizer, s.token);
    entry["logprob"] = JsonLogprob(s.logprob);
    entry["bytes"] = ByteArray(tokenizer.TokenBytes(s.token));
    Json top = Json::array();
    for (size_t i = 0; i < s.top.size() && static_cast<int32_t>(i) < top_logprobs; ++i) {
      const TokenLogprob& t = s.top[i];
      top.push_back({{"token", TokenDisplayText(tokenizer, t.token)},
                     {"logprob", JsonLogprob(t.logprob)},
                     {"bytes", ByteArray(tokenizer.TokenBytes(t.token))}});
    }
    entry["top_logprobs"] = std::move(top);
    content.push_back(std::move(entry));
  }
  return content;
}

}  // namespace kimirt
