// Internals of the tiktoken-format tokenizer (tokenizer.h is the public interface): the
// `tiktoken.model` parser, the byte-string → rank table and tiktoken's byte-pair merge, exposed
// for tests and the benchmark.
#pragma once

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

// Parses tiktoken.model text: one `<base64 bytes> <rank>` per line (LF, CRLF or CR; empty
// lines skipped, as tiktoken's load_tiktoken_bpe does). Strict where tiktoken is lax or would
// panic later: standard base64 with correct padding, a decimal rank below the number of
// tokens, no duplicate rank or byte string, and every single byte present (byte-level BPE must
// be able to encode anything). Errors are kCorrupt and name the 1-based line.
// Returns the token bytes indexed by rank.
Result<std::vector<std::string>> ParseTiktokenModel(std::string_view text);

// NeMo's long-input cut (spec §10.1): calls fn(ctx, slice) for the slices tokenization_kimi.py
// hands to tiktoken one at a time: <= 400,000-character chunks, each cut before any character
// that would make a run of whitespace or of non-whitespace (Python's str.isspace()) longer than
// 25,000 characters. Characters are code points; each byte of ill-formed UTF-8 counts as one
// non-whitespace character. Nothing for an empty text.
void ForEachLongInputSlice(std::string_view text, void (*fn)(void* ctx, std::string_view slice),
                           void* ctx);

// Byte string → id, an open-addressing hash table over one byte arena (no per-token
// allocation; lookups hash a string_view). Strings of up to 8 bytes, which are most BPE lookups,
// live packed in their slot, so finding them touches one cache line. Immutable after
// construction.
class ByteStringTable {
 public:
  ByteStringTable() = default;
  // tokens[i] gets id i. Duplicate strings are a programmer error (checked).
  explicit ByteStringTable(const std::vector<std::string>& tokens);

  // The id of `bytes`, or -1.
  int32_t Find(std::string_view bytes) const {
    const size_t n = bytes.size();
    if (n <= 8) {
      const uint64_t packed = Pack(bytes);
      for (size_t i = MixShort(packed, n) & mask_;; i = (i + 1) & mask_) {
        const Slot& s = slots_[i];
        if (s.id < 0) return -1;
        if (s.len == n && s.key == packed) return s.id;
      }
    }
    const uint64_t h = HashLong(bytes);
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id < 0) return -1;
      if (s.len == n && s.key == h && Bytes(s.id) == bytes) return s.id;
    }
  }
  std::string_view Bytes(int32_t id) const {
    const auto i = static_cast<size_t>(id);
    return std::string_view(arena_).substr(offsets_[i], offsets_[i + 1] - offsets_[i]);
  }
  size_t size() const { return offsets_.empty() ? 0 : offsets_.size() - 1; }

 private:
  struct Slot {
    uint64_t key = 0;  // the bytes zero-padded (<= 8 bytes), else the full hash
    int32_t id = -1;   // -1: empty
    uint32_t len = 0;
  };

  // Little-endian, zero-padded, without reading past the string: two overlapping loads.
  static uint64_t Pack(std::string_view s) {
    const auto* p = reinterpret_cast<const unsigned char*>(s.data());
    const size_t n = s.size();
    if (n >= 4) {
      uint32_t lo, hi;
      std::memcpy(&lo, p, 4);
      std::memcpy(&hi, p + n - 4, 4);
      return uint64_t{lo} | uint64_t{hi} << (8 * (n - 4));
    }
    if (n == 0) return 0;
    return uint64_t{p[0]} | uint64_t{p[n / 2]} << (8 * (n / 2)) |
           uint64_t{p[n - 1]} << (8 * (n - 1));
  }
  static uint64_t MixShort(uint64_t packed, size_t n) {
    uint64_t h = (packed + n) * 0x9E3779B97F4A7C15ull;
    h ^= h >> 32;
    h *= 0xD6E8FEB86659FD93ull;
    return h ^ (h >> 32);
  }
  static uint64_t HashLong(std::string_view s);

  std::string arena_;
  std::vector<uint32_t> offsets_;
  std::vector<Slot> slots_{Slot{}};  // one empty slot: a default table finds nothing
  size_t mask_ = 0;
};

// The mergeable ranks of a tiktoken Encoding, with tiktoken's encoding of one piece.
class BpeRanks {
 public:
  explicit BpeRanks(const std::vector<std::string>& tokens_by_rank);

  // Appends the ranks of `piece` (non-empty) to *out exactly as tiktoken's CoreBPE does: the
  // whole piece if it is a token, else repeatedly merge the adjacent pair whose concatenation
  // has the lowest rank (leftmost on ties) until no pair is a token.
  void EncodePiece(std::string_view piece, std::vector<int32_t>* out) const;
  // The same merge rule with a heap (O(n log n)); EncodePiece uses it for long pieces. Public so
  // tests can check both give the same ranks.
  void MergeWithHeap(std::string_view piece, std::vector<int32_t>* out) const;
  void MergeQuadratic(std::string_view piece, std::vector<int32_t>* out) const;

  const ByteStringTable& table() const { return table_; }

 private:
  int32_t RankOf(std::string_view bytes) const {
    if (bytes.size() == 2) {
      return pair_rank_[static_cast<uint8_t>(bytes[0]) << 8 | static_cast<uint8_t>(bytes[1])];
    }
    return table_.Find(bytes);
  }

  ByteStringTable table_;
  int32_t byte_rank_[256];
  std::vector<int32_t> pair_rank_;  // 65,536 two-byte strings: the first merge pass
};

}  // namespace kimirt
