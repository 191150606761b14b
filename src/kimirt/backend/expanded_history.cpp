// ExpandedHistory (expanded_history.h): the bookkeeping of a storage's expanded MLA prefill rows.
#include "kimirt/backend/expanded_history.h"

#include <algorithm>

#include "kimirt/core/check.h"

namespace kimirt {

ExpandedHistory::ExpandedHistory(int layers, int block_size, int64_t row_bytes, int64_t cap_bytes, int max_entries)
    : layers_(layers), block_size_(block_size), row_bytes_(row_bytes), cap_bytes_(cap_bytes) {
  KIMIRT_CHECK(layers > 0 && block_size > 0 && row_bytes > 0 && max_entries > 0);
  entries_.resize(static_cast<size_t>(max_entries));
}

int ExpandedHistory::Find(std::span<const int32_t> table) const {
  for (size_t e = 0; e < entries_.size(); ++e) {
    const Entry& en = entries_[e];
    if (en.live && !en.blocks.empty() && !table.empty() && en.blocks[0] == table[0]) return static_cast<int>(e);
  }
  return -1;
}

int64_t ExpandedHistory::SharedRows(const Entry& en, std::span<const int32_t> table) const {
  size_t same = 0;
  while (same < en.blocks.size() && same < table.size() && en.blocks[same] == table[same]) ++same;
  return static_cast<int64_t>(same) * block_size_;
}

int ExpandedHistory::LeastRecentlyUsed(int except) const {
  int lru = -1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (static_cast<int>(i) == except || !entries_[i].live) continue;
    if (lru < 0 || entries_[i].used < entries_[static_cast<size_t>(lru)].used) lru = static_cast<int>(i);
  }
  return lru;
}

void ExpandedHistory::DropLayer(int e, int layer, Dropped* out) {
  Entry& en = entries_[static_cast<size_t>(e)];
  const size_t l = static_cast<size_t>(layer);
  if (en.cap[l] > 0) out->emplace_back(e, layer);
  en.rows[l] = en.cap[l] = 0;
}

void ExpandedHistory::Drop(int e, Dropped* out) {
  Entry& en = entries_[static_cast<size_t>(e)];
  if (!en.live) return;
  for (int l = 0; l < layers_; ++l) DropLayer(e, l, out);
  en = Entry();
}

ExpandedHistory::Plan ExpandedHistory::Begin(int layer, std::span<const int32_t> table, int64_t start, int64_t len) {
  KIMIRT_CHECK(layer >= 0 && layer < layers_ && start >= 0 && start <= len);
  Plan p;
  if (cap_bytes_ <= 0 || table.empty() || len == 0) return p;
  int e = Find(table);
  if (e < 0) {
    // A free slot, else the least recently used entry makes room.
    for (size_t i = 0; i < entries_.size() && e < 0; ++i) {
      if (!entries_[i].live) e = static_cast<int>(i);
    }
    if (e < 0) {
      e = LeastRecentlyUsed(-1);
      Drop(e, &p.dropped);
    }
    Entry& fresh = entries_[static_cast<size_t>(e)];
    fresh.live = true;
    fresh.rows.assign(static_cast<size_t>(layers_), 0);
    fresh.cap.assign(static_cast<size_t>(layers_), 0);
  }
  Entry& en = entries_[static_cast<size_t>(e)];
  // Every layer's rows stay valid below the first block where the tables part. This layer's
  // rows also only below `start`: positions from there on were written by this forward before
  // this call (another layer's rows there may already be this forward's own expansion).
  const int64_t shared = SharedRows(en, table);
  for (int64_t& r : en.rows) r = std::min(r, shared);
  const size_t l = static_cast<size_t>(layer);
  en.rows[l] = std::min(en.rows[l], start);
  en.blocks.assign(table.begin(), table.end());
  en.used = ++tick_;

  int64_t cap = en.cap[l];
  if (cap < len) {
    // bytes() counts this buffer at its present size `cap`.
    auto fits = [&](int64_t rows) { return bytes() + (rows - cap) * row_bytes_ <= cap_bytes_; };
    int64_t want = std::max(len, 2 * cap);
    if (!fits(want)) want = len;
    // Evict the least recently used other entries until it fits, unless it cannot fit even alone.
    int64_t own = 0;
    for (int64_t c : en.cap) own += c * row_bytes_;
    const bool alone_fits = own + (len - cap) * row_bytes_ <= cap_bytes_;
    while (alone_fits && !fits(want)) {
      const int lru = LeastRecentlyUsed(e);
      if (lru < 0) break;
      Drop(lru, &p.dropped);
    }
    if (!fits(want)) {
      DropLayer(e, layer, &p.dropped);
      return p;  // entry -1: this layer's history does not fit; expand into scratch
    }
    en.cap[l] = cap = want;
  }
  p.entry = e;
  p.reuse = en.rows[l];
  p.capacity = cap;
  return p;
}

void ExpandedHistory::Filled(int entry, int layer, int64_t len) {
  Entry& en = entries_.at(static_cast<size_t>(entry));
  KIMIRT_CHECK(en.live && layer >= 0 && layer < layers_ && len <= en.cap[static_cast<size_t>(layer)]);
  en.rows[static_cast<size_t>(layer)] = len;
}

ExpandedHistory::Dropped ExpandedHistory::Released(std::span<const int32_t> blocks) {
  Dropped out;
  if (blocks.empty()) return out;
  for (size_t e = 0; e < entries_.size(); ++e) {
    const Entry& en = entries_[e];
    if (!en.live) continue;
    const bool uses = std::any_of(en.blocks.begin(), en.blocks.end(), [&](int32_t b) {
      return std::find(blocks.begin(), blocks.end(), b) != blocks.end();
    });
    if (uses) Drop(static_cast<int>(e), &out);
  }
  return out;
}

ExpandedHistory::Dropped ExpandedHistory::Decoding(std::span<const int32_t> table, int64_t context) {
  Dropped out;
  const int e = Find(table);
  if (e < 0) return out;
  const Entry& en = entries_[static_cast<size_t>(e)];
  // The entry is this sequence's when every row it holds lies in blocks both tables share; one of
  // another sequence (sharing only a prompt prefix) holds rows past them and stays.
  const int64_t most = *std::max_element(en.rows.begin(), en.rows.end());
  if (most <= std::min(SharedRows(en, table), context)) Drop(e, &out);
  return out;
}

int64_t ExpandedHistory::bytes() const {
  int64_t b = 0;
  for (const Entry& en : entries_) {
    for (int64_t c : en.cap) b += c * row_bytes_;
  }
  return b;
}

int64_t ExpandedHistory::rows(int entry, int layer) const {
  const Entry& en = entries_.at(static_cast<size_t>(entry));
  return en.live ? en.rows.at(static_cast<size_t>(layer)) : 0;
}

int ExpandedHistory::live_entries() const {
  return static_cast<int>(std::count_if(entries_.begin(), entries_.end(), [](const Entry& en) { return en.live; }));
}

}  // namespace kimirt
