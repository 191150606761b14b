// ExpandedHistory: which MLA history rows a storage still holds expanded from an earlier chunk of
// the same prefill (issue 14), so chunk c expands only its own new rows instead of all of them.
//
// Expanded prefill (spec §6.2, §6.4) attends over k_nope ‖ v = kv_b · c of every position of the
// sequence so far. Cut into chunks of C tokens, a prompt of L tokens used to expand
// C·(1 + 2 + … + L/C) ≈ L²/(2C) rows — at L = 32K and C = 2K, 278K rows for 32K positions, as much
// GEMM work as a third of the attention itself, and quadratic like it. The storage keeps each
// prefilling sequence's expanded rows (BF16, one buffer per MLA layer) between its chunks; this
// class is the host-side bookkeeping of those buffers: which rows are valid for which block
// table, how large a buffer must grow, what to drop. The device buffers are the storage's.
//
// Validity. An entry is keyed by the first block of the table it was filled for and remembers
// that table. Its rows [0, n) are the expansion of the latents those blocks held when they were
// written, and stay so while every block covering them stays allocated: a sequence writes only
// at and above its length, shared (prefix-cache) blocks are read-only (LatentKvCache), so a row
// changes only after its block went back to the pool. Hence:
//   - Released(blocks) (LatentKvCache::FreeBlocks, when a block's last reference goes) drops every
//     entry that uses one of them;
//   - a call reuses an entry's rows only below the first block where the tables differ, and below
//     the call's first new row (the forward wrote its rows from `start` on into this layer just
//     before the call, so the layer's rows there are older than the latents);
//   - Decoding(table, context) drops the entry of a sequence that has left prefill.
// Reused rows are bit-identical to re-expanded ones only if a row's expansion does not depend on
// the rows expanded with it: the storage must expand with a row-invariant GEMM (PrefillGemm).
//
// Room. All buffers together stay under `cap_bytes` (a buffer grows to max(len, 2 × its size) so
// a prompt's chunks cost O(log) copies, to len when doubling does not fit); the least recently
// used other entries are evicted to make room; a (entry, layer) that still does not fit gets no
// buffer and the call expands into scratch as before. At most `max_entries` entries.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace kimirt {

class ExpandedHistory {
 public:
  // row_bytes: one expanded row of one layer (k_nope ‖ v and k_s); cap_bytes ≤ 0 disables it.
  ExpandedHistory(int layers, int block_size, int64_t row_bytes, int64_t cap_bytes, int max_entries = 8);

  // (entry, layer) buffers the storage must free now (their rows are no longer wanted).
  using Dropped = std::vector<std::pair<int, int>>;

  struct Plan {
    int entry = -1;         // -1: no buffer for this call (expand every row into scratch)
    int64_t reuse = 0;      // rows [0, reuse) of the buffer hold this sequence's expansion
    int64_t capacity = 0;   // rows the buffer must hold: grow it (keeping [0, reuse)) if smaller
    Dropped dropped;        // to free before anything else (may include (entry, layer) itself)
  };
  // A prefill call of `layer` over positions [0, len) of the sequence whose block table is
  // `table`, positions [start, len) new.
  Plan Begin(int layer, std::span<const int32_t> table, int64_t start, int64_t len);
  // After the call: rows [0, len) of (entry, layer) hold the expansion (the buffer holds at least
  // the plan's capacity rows).
  void Filled(int entry, int layer, int64_t len);
  Dropped Released(std::span<const int32_t> blocks);
  Dropped Decoding(std::span<const int32_t> table, int64_t context);

  int64_t bytes() const;                      // all buffers, as planned
  int64_t rows(int entry, int layer) const;   // valid rows (tests)
  int live_entries() const;

 private:
  struct Entry {
    bool live = false;
    std::vector<int32_t> blocks;       // the table the rows belong to
    std::vector<int64_t> rows, cap;    // per layer: valid rows, buffer rows
    uint64_t used = 0;                 // Begin's tick, for LRU
  };
  void Drop(int e, Dropped* out);
  void DropLayer(int e, int layer, Dropped* out);
  int Find(std::span<const int32_t> table) const;
  // Rows in the leading blocks `table` shares with the entry's table.
  int64_t SharedRows(const Entry& en, std::span<const int32_t> table) const;
  // The live entry used longest ago, other than `except`; -1 if none.
  int LeastRecentlyUsed(int except) const;

  int layers_, block_size_;
  int64_t row_bytes_, cap_bytes_;
  std::vector<Entry> entries_;
  uint64_t tick_ = 0;
};

}  // namespace kimirt
