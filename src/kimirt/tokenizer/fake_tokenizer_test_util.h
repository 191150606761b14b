// A byte-level Tokenizer for tests that need a Tokenizer but not the real vocabulary: ids
// 0..255 are the bytes, then the named specials from 256 on, in the order given. Encode with
// allow_special turns a special's name into its id; without it every byte is its own id. So a
// test sees exactly what goes through SpecialTokenId and what through plain encoding.
// Header-only, for *_test.cpp files (the tokenizer tests; the server tests' doubles too).
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt::testing {

class FakeTokenizer : public Tokenizer {
 public:
  // Every K3 and Kimi-Linear chat marker (spec §10.2), so either template encodes.
  static std::vector<std::string> AllChatMarkers() {
    // Ids 256.. in this order (the server tests' FakeTokenizer numbering).
    return {"<|open|>",
            "<|close|>",
            "<|sep|>",
            "<|end_of_msg|>",
            "<|im_end|>",
            "<|im_user|>",
            "<|im_assistant|>",
            "<|im_system|>",
            "<|im_middle|>",
            "<|tool_calls_section_begin|>",
            "<|tool_calls_section_end|>",
            "<|tool_call_begin|>",
            "<|tool_call_argument_begin|>",
            "<|tool_call_end|>"};
  }

  FakeTokenizer() : FakeTokenizer(AllChatMarkers()) {}
  explicit FakeTokenizer(std::vector<std::string> specials) : specials_(std::move(specials)) {}

  std::vector<int32_t> Encode(std::string_view text, bool allow_special) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size();) {
      bool matched = false;
      for (size_t s = 0; allow_special && s < specials_.size(); ++s) {
        if (text.substr(i).starts_with(specials_[s])) {
          ids.push_back(256 + static_cast<int32_t>(s));
          i += specials_[s].size();
          matched = true;
          break;
        }
      }
      if (!matched) ids.push_back(static_cast<unsigned char>(text[i++]));
    }
    return ids;
  }
  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += TokenBytes(id);
    return out;
  }
  int32_t vocab_size() const override { return 256 + static_cast<int32_t>(specials_.size()); }
  int32_t num_base_tokens() const override { return 256; }
  std::string_view TokenBytes(int32_t id) const override {
    if (id >= 0 && id < 256) return std::string_view(&kBytes[static_cast<size_t>(id)], 1);
    if (id >= 256 && id < vocab_size()) return specials_[static_cast<size_t>(id - 256)];
    return {};
  }
  std::optional<int32_t> SpecialTokenId(std::string_view name) const override {
    for (size_t s = 0; s < specials_.size(); ++s) {
      if (specials_[s] == name) return 256 + static_cast<int32_t>(s);
    }
    return std::nullopt;
  }
  bool IsSpecial(int32_t id) const override { return id >= 256; }

 private:
  static constexpr std::array<char, 256> kBytes = [] {
    std::array<char, 256> b{};
    for (size_t i = 0; i < b.size(); ++i) b[i] = static_cast<char>(i);
    return b;
  }();
  std::vector<std::string> specials_;
};

}  // namespace kimirt::testing
