// PrefixCache (prefix_cache.h): the block tree, lookups, insertion and LRU eviction.
#include "kimirt/engine/prefix_cache.h"

#include <algorithm>
#include <limits>
#include <string>

#include "kimirt/core/check.h"
#include "kimirt/core/random.h"

namespace kimirt {

struct PrefixCache::Node {
  Node* parent = nullptr;
  uint64_t key = 0;
  std::vector<int32_t> tokens;  // the block's tokens, compared on every match
  int32_t block = -1;
  std::vector<std::unique_ptr<Node>> children;
  uint64_t last_use = 0;
  ModelRunner::SnapshotId snapshot = -1;
  std::list<Node*>::iterator in_lru;
};

namespace {

uint64_t Mix(uint64_t h, uint64_t v) {
  // SplitMix64's finalizer over the running hash and the next value.
  uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2));
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t BlockKey(uint64_t parent, std::span<const int32_t> tokens) {
  uint64_t h = parent;
  for (int32_t t : tokens) h = Mix(h, static_cast<uint32_t>(t));
  return h;
}

}  // namespace

uint64_t PrefixCacheSeed(const ModelConfig& c, KvCacheDType dtype, int block_size, int64_t prefill_chunk) {
  const std::string what = c.architecture + "/" + std::to_string(c.vocab_size) + "/" +
                           std::to_string(c.hidden_size) + "/" + std::to_string(c.num_hidden_layers) + "/" +
                           std::string(KvCacheDTypeName(dtype)) + "/" + std::to_string(block_size) + "/" +
                           std::to_string(prefill_chunk);
  return HashName(what);
}

PrefixCache::PrefixCache(ModelRunner& runner, PrefixCacheOptions options)
    : runner_(runner), opt_(options), block_size_(runner.kv_block_size()), root_(std::make_unique<Node>()) {
  root_->key = opt_.seed;
}

PrefixCache::~PrefixCache() {
  // Children before parents, so every node is a leaf when it goes.
  std::vector<Node*> order;
  std::vector<Node*> stack{root_.get()};
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    if (n != root_.get()) order.push_back(n);
    for (auto& c : n->children) stack.push_back(c.get());
  }
  for (auto it = order.rbegin(); it != order.rend(); ++it) Remove(*it);
}

PrefixCache::Node* PrefixCache::Child(Node* parent, std::span<const int32_t> block_tokens) const {
  const uint64_t key = BlockKey(parent->key, block_tokens);
  auto [lo, hi] = by_key_.equal_range(key);
  for (auto it = lo; it != hi; ++it) {
    Node* n = it->second;
    if (n->parent == parent && std::equal(n->tokens.begin(), n->tokens.end(), block_tokens.begin(), block_tokens.end())) {
      return n;
    }
  }
  return nullptr;
}

bool PrefixCache::Qualifies(int64_t begin, int64_t end) const {
  const int64_t C = opt_.prefill_chunk;
  return C > 1 && end - begin == C && end % C == 0 && end % block_size_ == 0;
}

PrefixCache::Match PrefixCache::Lookup(std::span<const int32_t> seq) {
  Match m;
  // Resume below the last token: its logits come from the forward that computes it.
  const int64_t limit = static_cast<int64_t>(seq.size()) - 1;
  std::vector<Node*> path;
  Node* n = root_.get();
  Node* best = nullptr;
  size_t best_depth = 0;
  for (int64_t end = block_size_; end <= limit; end += block_size_) {
    n = Child(n, seq.subspan(static_cast<size_t>(end - block_size_), static_cast<size_t>(block_size_)));
    if (n == nullptr) break;
    path.push_back(n);
    if (n->snapshot >= 0 && end % opt_.prefill_chunk == 0) {
      best = n;
      best_depth = path.size();
    }
  }
  if (best == nullptr) return m;
  m.tokens = static_cast<int64_t>(best_depth) * block_size_;
  m.snapshot = best->snapshot;
  for (size_t i = 0; i < best_depth; ++i) {
    m.blocks.push_back(path[i]->block);
    path[i]->last_use = ++clock_;
  }
  snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, best->in_lru);
  return m;
}

void PrefixCache::Apply(ModelRunner::Handle h, const Match& m, int64_t query) {
  queries_ += query;
  hits_ += m.tokens;
  if (m.tokens == 0) return;
  runner_.SharePrefix(h, m.blocks, m.tokens);
  runner_.RestoreKda(h, m.snapshot);
}

void PrefixCache::Insert(ModelRunner::Handle h, std::span<const int32_t> seq, int64_t end) {
  KIMIRT_CHECK(end % block_size_ == 0 && end % opt_.prefill_chunk == 0 && end <= static_cast<int64_t>(seq.size()));
  if (runner_.kda_snapshot_capacity() <= 0) return;  // no snapshot, no usable hit
  const std::vector<int32_t> table = runner_.BlockTable(h);
  KIMIRT_CHECK(static_cast<int64_t>(table.size()) * block_size_ >= end);
  // New nodes take the sequence's blocks only while every ancestor's block is the sequence's
  // own too: then whoever holds a cached block holds its ancestors', so a node no sequence holds
  // has no held descendants and eviction can go leaves first. (A node computed meanwhile by
  // another sequence holds equal bits, by the invariant; the walk continues through it.)
  bool own_path = true;
  Node* n = root_.get();
  for (int64_t d = 0; d * block_size_ < end; ++d) {
    const auto tokens = seq.subspan(static_cast<size_t>(d * block_size_), static_cast<size_t>(block_size_));
    Node* c = Child(n, tokens);
    const int32_t block = table[static_cast<size_t>(d)];
    if (c == nullptr) {
      if (!own_path) return;
      auto node = std::make_unique<Node>();
      node->parent = n;
      node->key = BlockKey(n->key, tokens);
      node->tokens.assign(tokens.begin(), tokens.end());
      node->block = block;
      runner_.RetainBlocks(std::span<const int32_t>(&block, 1));
      c = node.get();
      by_key_.emplace(c->key, c);
      n->children.push_back(std::move(node));
      ++nodes_;
    } else if (c->block != block) {
      own_path = false;
    }
    c->last_use = ++clock_;
    n = c;
  }
  if (n->snapshot >= 0) {
    snapshot_lru_.splice(snapshot_lru_.end(), snapshot_lru_, n->in_lru);
    return;
  }
  if (static_cast<int64_t>(snapshot_lru_.size()) >= runner_.kda_snapshot_capacity()) {
    DropSnapshot(snapshot_lru_.front());
  }
  n->snapshot = runner_.SnapshotKda(h);
  n->in_lru = snapshot_lru_.insert(snapshot_lru_.end(), n);
}

void PrefixCache::DropSnapshot(Node* n) {
  if (n->snapshot < 0) return;
  runner_.DropKdaSnapshot(n->snapshot);
  snapshot_lru_.erase(n->in_lru);
  n->snapshot = -1;
}

void PrefixCache::Remove(Node* n) {
  KIMIRT_CHECK(n->children.empty() && n->parent != nullptr);
  DropSnapshot(n);
  runner_.ReleaseBlocks(std::span<const int32_t>(&n->block, 1));
  auto [lo, hi] = by_key_.equal_range(n->key);
  for (auto it = lo; it != hi; ++it) {
    if (it->second == n) {
      by_key_.erase(it);
      break;
    }
  }
  auto& siblings = n->parent->children;
  siblings.erase(std::find_if(siblings.begin(), siblings.end(), [n](const auto& c) { return c.get() == n; }));
  --nodes_;
}

int64_t PrefixCache::evictable_blocks() const {
  int64_t n = 0;
  for (const auto& [key, node] : by_key_) n += runner_.kv_block_refs(node->block) == 1 ? 1 : 0;
  return n;
}

int64_t PrefixCache::EvictableAmong(std::span<const int32_t> blocks) const {
  int64_t n = 0;
  for (int32_t b : blocks) n += runner_.kv_block_refs(b) == 1 ? 1 : 0;
  return n;
}

int64_t PrefixCache::Evict(int64_t blocks) {
  int64_t freed = 0;
  while (freed < blocks) {
    // The least recently used leaf no sequence holds. A linear scan: eviction is rare next to
    // forwards, and the tree has at most the pool's blocks.
    Node* victim = nullptr;
    for (const auto& [key, node] : by_key_) {
      if (!node->children.empty() || runner_.kv_block_refs(node->block) != 1) continue;
      if (victim == nullptr || node->last_use < victim->last_use) victim = node;
    }
    if (victim == nullptr) break;
    Remove(victim);
    ++freed;
    ++evicted_;
  }
  return freed;
}

PrefixCacheStats PrefixCache::stats() const {
  PrefixCacheStats s;
  s.queries = queries_;
  s.hits = hits_;
  s.cached_blocks = nodes_;
  s.evictable_blocks = evictable_blocks();
  s.evicted_blocks = evicted_;
  s.snapshots = static_cast<int64_t>(snapshot_lru_.size());
  s.snapshot_bytes = static_cast<uint64_t>(s.snapshots) * runner_.kda_snapshot_bytes();
  return s;
}

}  // namespace kimirt
