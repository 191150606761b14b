// ExpandedHistory (expanded_history.h): which expanded MLA rows a storage may reuse between the
// chunks of a prefill, and when they must go. The CUDA storage's end-to-end check (reused rows give
// the bits of re-expanded ones, stale blocks are not read) is mla_prefill_test.cpp's.
#include "kimirt/backend/expanded_history.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace kimirt {
namespace {

constexpr int kLayers = 2, kBlock = 16;
constexpr int64_t kRowBytes = 100;

bool Has(const ExpandedHistory::Dropped& d, int entry, int layer) {
  return std::find(d.begin(), d.end(), std::make_pair(entry, layer)) != d.end();
}

// Chunks of one sequence: each layer reuses exactly the rows its previous chunk filled, buffers
// double (so a prompt costs a few copies), and the last chunk may be short.
TEST(ExpandedHistory, ChunksOfOneSequenceReuseTheirRows) {
  ExpandedHistory h(kLayers, kBlock, kRowBytes, 1 << 30);
  std::vector<int32_t> table = {7, 3};
  int64_t start = 0;
  const std::vector<int64_t> chunks = {20, 12, 40, 1, 30};
  std::vector<int64_t> caps;
  for (int64_t n : chunks) {
    while (static_cast<int64_t>(table.size()) * kBlock < start + n) {
      table.push_back(static_cast<int32_t>(10 + table.size()));
    }
    for (int l = 0; l < kLayers; ++l) {
      const ExpandedHistory::Plan p = h.Begin(l, table, start, start + n);
      ASSERT_EQ(p.entry, 0);
      EXPECT_EQ(p.reuse, start) << "layer " << l << " at " << start;
      EXPECT_GE(p.capacity, start + n);
      EXPECT_TRUE(p.dropped.empty());
      h.Filled(p.entry, l, start + n);
      if (l == 0) caps.push_back(p.capacity);
    }
    start += n;
  }
  EXPECT_EQ(caps, (std::vector<int64_t>{20, 40, 80, 80, 160}));
  EXPECT_EQ(h.bytes(), kLayers * 160 * kRowBytes);
}

// Positions at and past `start` were just written: never reused, even if an entry held them.
TEST(ExpandedHistory, RowsFromStartOnAreNeverReused) {
  ExpandedHistory h(kLayers, kBlock, kRowBytes, 1 << 30);
  const std::vector<int32_t> table = {4, 5, 6};
  for (int l = 0; l < kLayers; ++l) h.Filled(h.Begin(l, table, 0, 40).entry, l, 40);
  const ExpandedHistory::Plan p = h.Begin(0, table, 24, 30);
  EXPECT_EQ(p.reuse, 24);
  EXPECT_EQ(h.rows(0, 1), 40) << "layer 1's rows are clamped at its own call";
  EXPECT_EQ(h.Begin(1, table, 24, 30).reuse, 24);
}

// Another table with the same first block (a prompt prefix shared through the prefix cache) reuses
// only the rows in the blocks both tables hold.
TEST(ExpandedHistory, ASharedPrefixIsReusedUpToTheFirstDifferentBlock) {
  ExpandedHistory h(kLayers, kBlock, kRowBytes, 1 << 30);
  for (int l = 0; l < kLayers; ++l) h.Filled(h.Begin(l, std::vector<int32_t>{1, 2, 3}, 0, 45).entry, l, 45);
  const ExpandedHistory::Plan p = h.Begin(1, std::vector<int32_t>{1, 2, 9, 8}, 45, 60);
  EXPECT_EQ(p.reuse, 32);
  EXPECT_EQ(h.rows(p.entry, 0), 32);
  const ExpandedHistory::Plan other = h.Begin(0, std::vector<int32_t>{5, 2, 3}, 45, 50);
  EXPECT_NE(other.entry, p.entry);
  EXPECT_EQ(other.reuse, 0);
}

// A block that went back to the pool may hold new rows: every entry that used it goes.
TEST(ExpandedHistory, ReleasedBlocksDropTheirEntries) {
  ExpandedHistory h(kLayers, kBlock, kRowBytes, 1 << 30);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  for (int l = 0; l < kLayers; ++l) {
    h.Filled(h.Begin(l, a, 0, 20).entry, l, 20);
    h.Filled(h.Begin(l, b, 0, 20).entry, l, 20);
  }
  const ExpandedHistory::Dropped d = h.Released(std::vector<int32_t>{9, 2});
  EXPECT_EQ(d.size(), 2u);
  EXPECT_TRUE(Has(d, 0, 0) && Has(d, 0, 1));
  EXPECT_EQ(h.live_entries(), 1);
  EXPECT_EQ(h.Begin(0, a, 20, 30).reuse, 0) << "rows of a released block reused";
  EXPECT_EQ(h.Begin(0, b, 20, 30).reuse, 20);
}

// A sequence that decodes has left prefill: its entry goes; one that only shares its first block
// (another prompt with the same system prompt) stays.
TEST(ExpandedHistory, DecodingDropsOnlyThatSequencesEntry) {
  ExpandedHistory h(kLayers, kBlock, kRowBytes, 1 << 30);
  for (int l = 0; l < kLayers; ++l) h.Filled(h.Begin(l, std::vector<int32_t>{1, 2, 3}, 0, 40).entry, l, 40);
  EXPECT_TRUE(h.Decoding(std::vector<int32_t>{1, 2, 7}, 41).empty());
  EXPECT_EQ(h.live_entries(), 1);
  const ExpandedHistory::Dropped d = h.Decoding(std::vector<int32_t>{1, 2, 3}, 41);
  EXPECT_EQ(d.size(), 2u);
  EXPECT_EQ(h.live_entries(), 0);
  EXPECT_EQ(h.bytes(), 0);
}

// Under the cap: doubling gives way to the exact size, then the least recently used other entry is
// evicted; a buffer larger than the cap by itself is dropped (the call expands into scratch) and
// evicts nothing.
TEST(ExpandedHistory, TheCapEvictsTheLeastRecentlyUsed) {
  ExpandedHistory h(1, kBlock, kRowBytes, 100 * kRowBytes, /*max_entries=*/3);
  const std::vector<int32_t> a = {1, 4, 7, 10, 13, 16, 19}, b = {2, 5, 8, 11, 14, 17, 20}, c = {3, 6, 9, 12, 15, 18, 21};
  h.Filled(h.Begin(0, a, 0, 30).entry, 0, 30);
  h.Filled(h.Begin(0, b, 0, 30).entry, 0, 30);
  ExpandedHistory::Plan p = h.Begin(0, c, 0, 30);
  h.Filled(p.entry, 0, 30);
  EXPECT_EQ(h.bytes(), 90 * kRowBytes);
  p = h.Begin(0, b, 30, 45);  // doubling to 60 would not fit; 45 does after evicting a (the oldest)
  EXPECT_EQ(p.capacity, 45);
  EXPECT_EQ(p.reuse, 30);
  EXPECT_EQ(p.dropped, (ExpandedHistory::Dropped{{0, 0}}));
  h.Filled(p.entry, 0, 45);
  p = h.Begin(0, c, 30, 101);  // more than the cap alone: nothing else is evicted for it
  EXPECT_EQ(p.entry, -1);
  EXPECT_EQ(p.dropped, (ExpandedHistory::Dropped{{2, 0}}));
  EXPECT_EQ(h.bytes(), 45 * kRowBytes);
  // A fourth sequence with every slot live takes the least recently used slot.
  ExpandedHistory g(1, kBlock, kRowBytes, 1 << 30, 2);
  g.Filled(g.Begin(0, a, 0, 5).entry, 0, 5);
  g.Filled(g.Begin(0, b, 0, 5).entry, 0, 5);
  g.Begin(0, a, 5, 6);
  p = g.Begin(0, c, 0, 5);
  EXPECT_EQ(p.dropped, (ExpandedHistory::Dropped{{1, 0}}));
  EXPECT_EQ(p.entry, 1);
  EXPECT_EQ(p.reuse, 0);
}

TEST(ExpandedHistory, ACapOfZeroHoldsNothing) {
  ExpandedHistory h(kLayers, kBlock, kRowBytes, 0);
  const ExpandedHistory::Plan p = h.Begin(0, std::vector<int32_t>{1}, 0, 10);
  EXPECT_EQ(p.entry, -1);
  EXPECT_EQ(h.bytes(), 0);
}

}  // namespace
}  // namespace kimirt
