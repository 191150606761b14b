// Kimi's tiktoken-format tokenizer (spec §10.1-10.2): tiktoken.model parsing, special tokens
// from tokenizer_config.json, and Encode/Decode byte-identical to the PyPI tiktoken library as
// NeMo's tokenization_kimi.py drives it.
#include "kimirt/tokenizer/tiktoken_bpe.h"

#include <algorithm>
#include <array>
#include <bit>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <queue>
#include <sstream>

#include "kimirt/core/check.h"
#include "kimirt/tokenizer/pretokenizer.h"
#include "kimirt/tokenizer/tokenizer.h"

namespace kimirt {

namespace {

constexpr uint32_t kNoRank = std::numeric_limits<uint32_t>::max();

// ---------------------------------------------------------------------------------------------
// base64 (RFC 4648 standard alphabet, padded), as tiktoken.model stores token bytes.

constexpr std::array<int8_t, 256> MakeBase64Table() {
  std::array<int8_t, 256> t{};
  for (auto& v : t) v = -1;
  const char* alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  for (int i = 0; i < 64; ++i) t[static_cast<uint8_t>(alphabet[i])] = static_cast<int8_t>(i);
  return t;
}
constexpr std::array<int8_t, 256> kBase64 = MakeBase64Table();

bool DecodeBase64(std::string_view in, std::string* out) {
  out->clear();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t pad = 0;
  if (in.back() == '=') pad = in[in.size() - 2] == '=' ? 2 : 1;
  for (size_t i = 0; i < in.size(); i += 4) {
    const bool last = i + 4 == in.size();
    uint32_t v = 0;
    for (size_t k = 0; k < 4; ++k) {
      const char c = in[i + k];
      int8_t d;
      if (c == '=' && last && k >= 4 - pad) {
        d = 0;
      } else {
        d = kBase64[static_cast<uint8_t>(c)];
        if (d < 0) return false;
      }
      v = v << 6 | static_cast<uint32_t>(d);
    }
    out->push_back(static_cast<char>(v >> 16));
    if (!last || pad < 2) out->push_back(static_cast<char>(v >> 8 & 0xFF));
    if (!last || pad < 1) out->push_back(static_cast<char>(v & 0xFF));
    // Canonical encodings only: the bits under the padding must be zero.
    if (last && ((pad == 1 && (v & 0xFF) != 0) || (pad == 2 && (v & 0xFFFF) != 0))) return false;
  }
  return true;
}

std::string LineError(size_t line, std::string_view what) {
  return "line " + std::to_string(line) + ": " + std::string(what);
}

std::string HexByte(uint8_t b) {
  static const char* kHex = "0123456789abcdef";
  return std::string("0x") + kHex[b >> 4] + kHex[b & 15];
}

// ---------------------------------------------------------------------------------------------
// UTF-8 characters, as Python counts them for the long-input split (spec §10.1).

// The length of the character at s[i] if it is well-formed UTF-8 (Unicode Table 3-7), else 0;
// *cp gets the code point.
size_t Utf8Char(std::string_view s, size_t i, char32_t* cp) {
  const auto b0 = static_cast<uint8_t>(s[i]);
  if (b0 < 0x80) {
    *cp = b0;
    return 1;
  }
  size_t len;
  char32_t c;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    const auto b = static_cast<uint8_t>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    c = c << 6 | (b & 0x3F);
  }
  *cp = c;
  return len;
}

// Python's str.isspace(): bidi class WS, B or S, or category Zs. Unlike the regex's `\s` it
// includes U+001C..U+001F.
constexpr bool PythonIsSpace(char32_t c) {
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// NeMo's _encode_text_piece hands tiktoken at most 400,000 characters at a time, and cuts each
// such chunk wherever a run of whitespace or of non-whitespace would exceed 25,000 characters
// (`_split_whitespaces_or_nonwhitespaces`, spec §10.1). The cut points move BPE and regex
// boundaries, so we cut at the same characters. A character is a code point; each byte of
// ill-formed UTF-8 counts as one non-whitespace character (Python would hold it as one
// surrogate-escaped code point).
constexpr std::array<bool, 128> MakeAsciiIsSpace() {
  std::array<bool, 128> t{};
  for (char32_t c = 0; c < 128; ++c) t[c] = PythonIsSpace(c);
  return t;
}
constexpr std::array<bool, 128> kAsciiIsSpace = MakeAsciiIsSpace();

constexpr size_t kMaxEncodeChars = 400000;
constexpr size_t kMaxConsecutiveChars = 25000;

// Python's isspace() for 8 ASCII bytes at once: 0x80 in each byte that is 0x09-0x0D or 0x1C-0x20.
// (x + 0x80 - a has its high bit set iff x >= a, with no carry out of a byte below 0x80.)
inline uint64_t AsciiSpaceFlags(uint64_t w) {
  constexpr uint64_t k01 = 0x0101010101010101ull, k80 = 0x8080808080808080ull;
  const auto at_least = [w](uint64_t a) { return (w + k01 * (0x80 - a)) & k80; };
  return (at_least(0x09) & ~at_least(0x0E)) | (at_least(0x1C) & ~at_least(0x21));
}

template <typename F>
void ForEachLongInputSliceImpl(std::string_view text, F&& f) {
  // A run can only exceed the limit in a text longer than it (characters <= bytes).
  if (text.size() <= kMaxConsecutiveChars) {
    if (!text.empty()) f(text);
    return;
  }
  constexpr uint64_t k80 = 0x8080808080808080ull;
  size_t slice_start = 0, chars_in_chunk = 0, run = 0;
  bool run_is_space = false;
  const auto* bytes = reinterpret_cast<const uint8_t*>(text.data());
  for (size_t pos = 0; pos < text.size();) {
    // Eight ASCII characters at a time where no cut can fall among them: the run only
    // continues or restarts (this scan touches every byte of long inputs).
    if (chars_in_chunk != 0 && pos + 8 <= text.size() && run + 8 <= kMaxConsecutiveChars &&
        chars_in_chunk + 8 < kMaxEncodeChars) {
      uint64_t w;
      std::memcpy(&w, bytes + pos, 8);
      if ((w & k80) == 0) {
        const uint64_t flags = AsciiSpaceFlags(w);
        const bool last = (flags >> 63) != 0;
        const uint64_t differ = last ? (~flags & k80) : flags;  // bytes unlike the last one
        if (differ == 0) {
          run = last == run_is_space ? run + 8 : 8;
        } else {
          run = 7 - static_cast<size_t>(63 - std::countl_zero(differ)) / 8;
        }
        run_is_space = last;
        chars_in_chunk += 8;
        pos += 8;
        continue;
      }
    }
    size_t len = 1;
    bool space;
    if (bytes[pos] < 0x80) {
      space = kAsciiIsSpace[bytes[pos]];
    } else {
      char32_t cp = 0;
      len = Utf8Char(text, pos, &cp);
      space = len != 0 && PythonIsSpace(cp);
      if (len == 0) len = 1;
    }
    if (chars_in_chunk == kMaxEncodeChars) {  // the next 400,000-character chunk
      f(text.substr(slice_start, pos - slice_start));
      slice_start = pos;
      chars_in_chunk = 0;
    }
    if (chars_in_chunk == 0) {
      run_is_space = space;
      run = 0;
    }
    run = space == run_is_space ? run + 1 : 1;
    run_is_space = space;
    if (run > kMaxConsecutiveChars) {
      f(text.substr(slice_start, pos - slice_start));
      slice_start = pos;
      run = 1;
    }
    ++chars_in_chunk;
    pos += len;
  }
  f(text.substr(slice_start));
}

// ---------------------------------------------------------------------------------------------
// The tokenizer

class TiktokenTokenizer final : public Tokenizer {
 public:
  TiktokenTokenizer(std::vector<std::string> tokens, std::vector<std::string> special_names,
                    std::vector<bool> special_flags, std::unique_ptr<Pretokenizer> pretokenizer)
      : ranks_(tokens),
        num_base_(static_cast<int32_t>(tokens.size())),
        special_names_(std::move(special_names)),
        special_flags_(std::move(special_flags)),
        specials_(special_names_),
        pretokenizer_(std::move(pretokenizer)) {
    for (const std::string& name : special_names_) {
      special_first_byte_[static_cast<uint8_t>(name[0])] = true;
      special_lengths_.push_back(name.size());
    }
    std::sort(special_lengths_.begin(), special_lengths_.end(), std::greater<>());
    special_lengths_.erase(std::unique(special_lengths_.begin(), special_lengths_.end()),
                           special_lengths_.end());
  }

  std::vector<int32_t> Encode(std::string_view text, bool allow_special) const override {
    std::vector<int32_t> ids;
    ids.reserve(text.size() / 3 + 1);
    ForEachLongInputSliceImpl(text, [&](std::string_view slice) {
      if (allow_special) {
        EncodeWithSpecials(slice, &ids);
      } else {
        EncodeOrdinary(slice, &ids);
      }
    });
    return ids;
  }

  std::string Decode(std::span<const int32_t> ids) const override {
    std::string out;
    for (int32_t id : ids) out += TokenBytes(id);  // ids out of range decode to nothing
    return out;
  }

  int32_t vocab_size() const override {
    return num_base_ + static_cast<int32_t>(special_names_.size());
  }
  int32_t num_base_tokens() const override { return num_base_; }

  std::string_view TokenBytes(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return {};
    if (id < num_base_) return ranks_.table().Bytes(id);
    return special_names_[static_cast<size_t>(id - num_base_)];
  }

  std::optional<int32_t> SpecialTokenId(std::string_view name) const override {
    const int32_t i = specials_.Find(name);
    if (i < 0) return std::nullopt;
    return num_base_ + i;
  }

  bool IsSpecial(int32_t id) const override {
    if (id < num_base_ || id >= vocab_size()) return false;
    return special_flags_[static_cast<size_t>(id - num_base_)];
  }

 private:
  void EncodeOrdinary(std::string_view text, std::vector<int32_t>* ids) const {
    pretokenizer_->ForEach(text, [&](std::string_view piece) { ranks_.EncodePiece(piece, ids); });
  }

  // tiktoken's encode with allowed_special="all": ordinary text between special-token strings,
  // each stretch pre-tokenized on its own (the regex never looks across a special token).
  // tiktoken takes the leftmost occurrence; where names overlap at one position its regex
  // alternation order is a hash order, so we take the longest (K3's names never overlap).
  void EncodeWithSpecials(std::string_view text, std::vector<int32_t>* ids) const {
    size_t start = 0;
    for (size_t i = 0; i < text.size(); ++i) {
      if (!special_first_byte_[static_cast<uint8_t>(text[i])]) continue;
      for (size_t len : special_lengths_) {
        if (len > text.size() - i) continue;
        const int32_t s = specials_.Find(text.substr(i, len));
        if (s < 0) continue;
        EncodeOrdinary(text.substr(start, i - start), ids);
        ids->push_back(num_base_ + s);
        start = i + len;
        i = start - 1;
        break;
      }
    }
    EncodeOrdinary(text.substr(start), ids);
  }

  BpeRanks ranks_;
  int32_t num_base_;
  std::vector<std::string> special_names_;  // index = id - num_base_
  std::vector<bool> special_flags_;
  ByteStringTable specials_;
  std::array<bool, 256> special_first_byte_{};
  std::vector<size_t> special_lengths_;  // distinct name lengths, longest first
  std::unique_ptr<Pretokenizer> pretokenizer_;
};

Result<std::string> ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound("cannot open " + path);
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return IoError("cannot read " + path);
  return ss.str();
}

}  // namespace

void ForEachLongInputSlice(std::string_view text, void (*fn)(void* ctx, std::string_view slice),
                           void* ctx) {
  ForEachLongInputSliceImpl(text, [&](std::string_view slice) { fn(ctx, slice); });
}

// ---------------------------------------------------------------------------------------------
// tiktoken.model

Result<std::vector<std::string>> ParseTiktokenModel(std::string_view text) {
  struct Entry {
    std::string bytes;
    uint64_t rank;
    size_t line;
  };
  std::vector<Entry> entries;
  std::string decoded;
  size_t line_no = 0;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find_first_of("\r\n", pos);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(pos, end - pos);
    ++line_no;
    pos = end;
    if (pos < text.size())
      pos += (text[pos] == '\r' && pos + 1 < text.size() && text[pos + 1] == '\n') ? 2 : 1;
    if (line.empty()) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string_view::npos || sp == 0 || sp + 1 == line.size()) {
      return Corrupt(LineError(line_no, "expected \"<base64> <rank>\""));
    }
    const std::string_view b64 = line.substr(0, sp), rank_text = line.substr(sp + 1);
    if (!DecodeBase64(b64, &decoded)) {
      return Corrupt(
          LineError(line_no, "malformed base64 \"" + std::string(b64.substr(0, 64)) + "\""));
    }
    uint64_t rank = 0;
    for (char c : rank_text) {
      if (c < '0' || c > '9' || rank > (uint64_t{1} << 40)) {
        return Corrupt(
            LineError(line_no, "malformed rank \"" + std::string(rank_text.substr(0, 32)) + "\""));
      }
      rank = rank * 10 + static_cast<uint64_t>(c - '0');
    }
    entries.push_back({decoded, rank, line_no});
  }
  if (entries.empty()) return Corrupt("no tokens");
  if (entries.size() > static_cast<size_t>(std::numeric_limits<int32_t>::max() / 2)) {
    return Corrupt("too many tokens");
  }
  std::vector<std::string> tokens(entries.size());
  std::vector<size_t> line_of_rank(entries.size(), 0);
  for (Entry& e : entries) {
    if (e.rank >= entries.size()) {
      return Corrupt(LineError(e.line, "rank " + std::to_string(e.rank) +
                                           " is not below the number of tokens (" +
                                           std::to_string(entries.size()) + ")"));
    }
    const auto r = static_cast<size_t>(e.rank);
    if (line_of_rank[r] != 0) {
      return Corrupt(LineError(e.line, "rank " + std::to_string(r) + " already given on line " +
                                           std::to_string(line_of_rank[r])));
    }
    line_of_rank[r] = e.line;
    tokens[r] = std::move(e.bytes);
  }
  // Duplicate byte strings: sort rank indices by bytes and compare neighbours.
  std::vector<uint32_t> order(tokens.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  std::sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
    return tokens[a] != tokens[b] ? tokens[a] < tokens[b] : line_of_rank[a] < line_of_rank[b];
  });
  for (size_t i = 1; i < order.size(); ++i) {
    if (tokens[order[i]] == tokens[order[i - 1]]) {
      return Corrupt(
          LineError(line_of_rank[order[i]],
                    "the same bytes as line " + std::to_string(line_of_rank[order[i - 1]])));
    }
  }
  std::array<bool, 256> have_byte{};
  for (const std::string& t : tokens) {
    if (t.size() == 1) have_byte[static_cast<uint8_t>(t[0])] = true;
  }
  for (int b = 0; b < 256; ++b) {
    if (!have_byte[static_cast<size_t>(b)]) {
      return Corrupt("no token for the single byte " + HexByte(static_cast<uint8_t>(b)) +
                     " (byte-level BPE needs all 256)");
    }
  }
  return tokens;
}

// ---------------------------------------------------------------------------------------------
// ByteStringTable

uint64_t ByteStringTable::HashLong(std::string_view s) {
  constexpr uint64_t k = 0x9E3779B97F4A7C15ull;
  uint64_t h = s.size() * k;
  const char* p = s.data();
  size_t n = s.size();
  for (; n >= 8; p += 8, n -= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * k;
    h ^= h >> 32;
  }
  if (n > 0) h = (h ^ Pack(std::string_view(p, n))) * k;
  // splitmix64's finalizer: the low bits pick the slot.
  h ^= h >> 30;
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 27;
  h *= 0x94D049BB133111EBull;
  h ^= h >> 31;
  return h;
}

ByteStringTable::ByteStringTable(const std::vector<std::string>& tokens) {
  size_t total = 0;
  for (const std::string& t : tokens) total += t.size();
  KIMIRT_CHECK(total < std::numeric_limits<uint32_t>::max());
  arena_.reserve(total);
  offsets_.reserve(tokens.size() + 1);
  for (const std::string& t : tokens) {
    offsets_.push_back(static_cast<uint32_t>(arena_.size()));
    arena_ += t;
  }
  offsets_.push_back(static_cast<uint32_t>(arena_.size()));
  size_t cap = 16;
  while (cap < 2 * tokens.size()) cap *= 2;
  slots_.assign(cap, Slot{});
  mask_ = cap - 1;
  for (size_t id = 0; id < tokens.size(); ++id) {
    KIMIRT_CHECK_MSG(Find(tokens[id]) < 0, "duplicate byte string");
    const std::string_view t = tokens[id];
    Slot slot;
    slot.id = static_cast<int32_t>(id);
    slot.len = static_cast<uint32_t>(t.size());
    uint64_t h;
    if (t.size() <= 8) {
      slot.key = Pack(t);
      h = MixShort(slot.key, t.size());
    } else {
      h = slot.key = HashLong(t);
    }
    size_t i = h & mask_;
    while (slots_[i].id >= 0) i = (i + 1) & mask_;
    slots_[i] = slot;
  }
}

// ---------------------------------------------------------------------------------------------
// BpeRanks

BpeRanks::BpeRanks(const std::vector<std::string>& tokens_by_rank)
    : table_(tokens_by_rank), pair_rank_(65536, -1) {
  std::fill(std::begin(byte_rank_), std::end(byte_rank_), -1);
  for (size_t r = 0; r < tokens_by_rank.size(); ++r) {
    const std::string& t = tokens_by_rank[r];
    if (t.size() == 1) byte_rank_[static_cast<uint8_t>(t[0])] = static_cast<int32_t>(r);
    if (t.size() == 2) {
      pair_rank_[static_cast<uint8_t>(t[0]) << 8 | static_cast<uint8_t>(t[1])] =
          static_cast<int32_t>(r);
    }
  }
}

void BpeRanks::EncodePiece(std::string_view piece, std::vector<int32_t>* out) const {
  if (piece.size() == 1) {
    out->push_back(byte_rank_[static_cast<uint8_t>(piece[0])]);
    return;
  }
  // tiktoken looks the whole piece up first; BPE might not rebuild a token from its bytes.
  const int32_t whole = table_.Find(piece);
  if (whole >= 0) {
    out->push_back(whole);
    return;
  }
  // The quadratic loop is faster for typical word-sized pieces (it stays in one cache line or
  // two); the heap wins once pieces get long (runs of digits-free symbols, base64 blobs...).
  if (piece.size() <= 128) {
    MergeQuadratic(piece, out);
  } else {
    MergeWithHeap(piece, out);
  }
}

void BpeRanks::MergeQuadratic(std::string_view piece, std::vector<int32_t>* out) const {
  // parts[i] = (start of part i, rank of part i joined with part i + 1); a sentinel part at
  // the end, as in tiktoken's _byte_pair_merge.
  struct Part {
    uint32_t start;
    uint32_t rank;
  };
  constexpr size_t kStack = 130;
  Part stack_parts[kStack];
  std::vector<Part> heap_parts;
  const size_t n = piece.size();
  Part* parts = stack_parts;
  if (n + 1 > kStack) {
    heap_parts.resize(n + 1);
    parts = heap_parts.data();
  }
  auto rank_of = [&](size_t begin, size_t end) -> uint32_t {
    const int32_t r = RankOf(piece.substr(begin, end - begin));
    return r < 0 ? kNoRank : static_cast<uint32_t>(r);
  };
  size_t count = n + 1;
  for (size_t i = 0; i + 1 < n; ++i) parts[i] = {static_cast<uint32_t>(i), rank_of(i, i + 2)};
  parts[n - 1] = {static_cast<uint32_t>(n - 1), kNoRank};
  parts[n] = {static_cast<uint32_t>(n), kNoRank};
  for (;;) {
    uint32_t best = kNoRank;
    size_t i = 0;
    for (size_t k = 0; k + 1 < count; ++k) {
      if (parts[k].rank < best) {
        best = parts[k].rank;
        i = k;
      }
    }
    if (best == kNoRank) break;
    // Part i absorbs part i + 1; its pair now reaches to the start of part i + 3.
    parts[i].rank = i + 3 < count ? rank_of(parts[i].start, parts[i + 3].start) : kNoRank;
    if (i > 0) parts[i - 1].rank = rank_of(parts[i - 1].start, parts[i + 2].start);
    std::memmove(parts + i + 1, parts + i + 2, (count - i - 2) * sizeof(Part));
    --count;
  }
  for (size_t k = 0; k + 1 < count; ++k) {
    const std::string_view bytes =
        piece.substr(parts[k].start, parts[k + 1].start - parts[k].start);
    out->push_back(bytes.size() == 1 ? byte_rank_[static_cast<uint8_t>(bytes[0])]
                                     : table_.Find(bytes));
  }
}

void BpeRanks::MergeWithHeap(std::string_view piece, std::vector<int32_t>* out) const {
  // Parts are a linked list over their start offsets; the heap holds (rank, start) of every
  // current pair, smallest rank first and the leftmost on ties, as tiktoken's linear scan picks.
  // Entries whose rank no longer matches their part are stale and skipped: a part only grows,
  // and distinct byte strings have distinct ranks, so a matching rank means a current pair.
  const size_t n = piece.size();
  std::vector<uint32_t> next(n), prev(n), pair_rank(n, kNoRank);
  std::vector<bool> alive(n, true);
  auto rank_of = [&](size_t begin, size_t end) -> uint32_t {
    const int32_t r = RankOf(piece.substr(begin, end - begin));
    return r < 0 ? kNoRank : static_cast<uint32_t>(r);
  };
  std::vector<uint64_t> initial;
  initial.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    next[i] = static_cast<uint32_t>(i + 1);
    prev[i] = static_cast<uint32_t>(i == 0 ? 0 : i - 1);
    if (i + 1 < n) {
      pair_rank[i] = rank_of(i, i + 2);
      if (pair_rank[i] != kNoRank) initial.push_back(uint64_t{pair_rank[i]} << 32 | i);
    }
  }
  std::priority_queue<uint64_t, std::vector<uint64_t>, std::greater<>> heap(std::greater<>(),
                                                                            std::move(initial));
  while (!heap.empty()) {
    const uint64_t top = heap.top();
    heap.pop();
    const auto i = static_cast<uint32_t>(top & 0xFFFFFFFFu);
    const auto r = static_cast<uint32_t>(top >> 32);
    if (!alive[i] || pair_rank[i] != r) continue;
    const uint32_t j = next[i];
    const uint32_t k = next[j];
    alive[j] = false;
    next[i] = k;
    if (k < n) prev[k] = i;
    pair_rank[i] = k < n ? rank_of(i, next[k]) : kNoRank;
    if (pair_rank[i] != kNoRank) heap.push(uint64_t{pair_rank[i]} << 32 | i);
    if (i > 0) {
      const uint32_t p = prev[i];
      pair_rank[p] = rank_of(p, k);
      if (pair_rank[p] != kNoRank) heap.push(uint64_t{pair_rank[p]} << 32 | p);
    }
  }
  for (size_t i = 0; i < n; i = next[i]) {
    const std::string_view bytes = piece.substr(i, next[i] - i);
    out->push_back(bytes.size() == 1 ? byte_rank_[static_cast<uint8_t>(bytes[0])]
                                     : table_.Find(bytes));
  }
}

// ---------------------------------------------------------------------------------------------
// Tokenizer

Result<std::unique_ptr<Tokenizer>> Tokenizer::FromStrings(std::string_view tiktoken_model,
                                                          std::string_view tokenizer_config_json,
                                                          int num_reserved) {
  if (num_reserved < 0 || num_reserved > (1 << 20)) {
    return InvalidArgument("num_reserved " + std::to_string(num_reserved) + " out of range");
  }
  Result<std::vector<std::string>> parsed = ParseTiktokenModel(tiktoken_model);
  if (!parsed.ok()) return parsed.status().WithContext("tiktoken.model");
  std::vector<std::string> tokens = std::move(parsed).value();
  const auto num_base = static_cast<int64_t>(tokens.size());

  // Reserved ids follow the base vocabulary; names come from added_tokens_decoder, unnamed ones
  // are "<|reserved_token_{id}|>" with the id itself (NeMo tokenization_kimi.py, spec §10.1).
  // Entries outside the reserved range are ignored, as NeMo does.
  std::vector<std::string> names(static_cast<size_t>(num_reserved));
  std::vector<bool> flags(static_cast<size_t>(num_reserved), true);
  for (int i = 0; i < num_reserved; ++i) {
    names[static_cast<size_t>(i)] = "<|reserved_token_" + std::to_string(num_base + i) + "|>";
  }
  if (!tokenizer_config_json.empty()) {
    const auto ctx = [](const std::string& m) { return Corrupt("tokenizer_config.json: " + m); };
    const nlohmann::json root = nlohmann::json::parse(tokenizer_config_json, nullptr, false);
    if (root.is_discarded() || !root.is_object()) return ctx("not a JSON object");
    const auto it = root.find("added_tokens_decoder");
    if (it != root.end()) {
      if (!it->is_object()) return ctx("added_tokens_decoder is not an object");
      for (const auto& [key, entry] : it->items()) {
        int64_t id = 0;
        bool key_ok = !key.empty() && key.size() <= 12;
        for (char c : key) {
          key_ok = key_ok && c >= '0' && c <= '9';
          id = id * 10 + (c - '0');
        }
        if (!key_ok) return ctx("added_tokens_decoder key \"" + key + "\" is not a token id");
        if (!entry.is_object())
          return ctx("added_tokens_decoder[\"" + key + "\"] is not an object");
        const auto content = entry.find("content");
        if (content == entry.end() || !content->is_string()) {
          return ctx("added_tokens_decoder[\"" + key + "\"] has no string \"content\"");
        }
        const auto special = entry.find("special");
        if (special != entry.end() && !special->is_boolean()) {
          return ctx("added_tokens_decoder[\"" + key + "\"].special is not a boolean");
        }
        if (id < num_base || id >= num_base + num_reserved) continue;
        const std::string name = content->get<std::string>();
        if (name.empty()) return ctx("added_tokens_decoder[\"" + key + "\"] has an empty name");
        names[static_cast<size_t>(id - num_base)] = name;
        // "special": false marks K3's XTML markers, which skip_special must keep (spec §10.4).
        flags[static_cast<size_t>(id - num_base)] =
            special == entry.end() ? true : special->get<bool>();
      }
    }
  }
  {
    std::vector<size_t> order(names.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return names[a] != names[b] ? names[a] < names[b] : a < b;
    });
    for (size_t i = 1; i < order.size(); ++i) {
      if (names[order[i]] == names[order[i - 1]]) {
        return Corrupt("tokenizer_config.json: ids " + std::to_string(num_base + order[i - 1]) +
                       " and " + std::to_string(num_base + order[i]) + " are both named \"" +
                       names[order[i]] + "\"");
      }
    }
  }
  KIMIRT_ASSIGN_OR_RETURN(std::unique_ptr<Pretokenizer> pretokenizer, Pretokenizer::Create());
  return std::unique_ptr<Tokenizer>(new TiktokenTokenizer(
      std::move(tokens), std::move(names), std::move(flags), std::move(pretokenizer)));
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::Load(const std::string& dir) {
  const std::string model_path = dir + "/tiktoken.model";
  const std::string config_path = dir + "/tokenizer_config.json";
  KIMIRT_ASSIGN_OR_RETURN(std::string model, ReadWholeFile(model_path));
  std::string config;
  if (std::ifstream(config_path).good()) {
    KIMIRT_ASSIGN_OR_RETURN(config, ReadWholeFile(config_path));
  }
  Result<std::unique_ptr<Tokenizer>> tok = FromStrings(model, config);
  if (!tok.ok()) return tok.status().WithContext(dir);
  return tok;
}

std::string_view KimiPatternString() {
  // NeMo's _build_kimi_k3_pat_str, verbatim (spec §10.1); `&&` is class intersection.
  static constexpr char kPattern[] =
      R"([\p{Han}]+)"
      R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
      R"(|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
      R"(|\p{N}{1,3})"
      R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
      R"(|\s*[\r\n]+)"
      R"(|\s+(?!\S))"
      R"(|\s+)";
  return kPattern;
}

}  // namespace kimirt
