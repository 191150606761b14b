// PrefixCache: full blocks of prompt latents and KDA snapshots that later requests with the same
// prefix resume from instead of recomputing (docs/prefix-caching.md).
//
// The cache is a tree of full latent blocks: a node is one block of `block_size` tokens, keyed
// by a hash chain of its tokens and its parent's key (seeded with the model, the config and
// the cache dtype: PrefixCacheOptions::seed), and the node's tokens are compared on every match,
// so a hash collision can never give a sequence another prefix's latents. A node holds one
// reference to its block (LatentKvCache is reference counted); a running sequence that resumed
// from it holds another. A node at a position that is a multiple of the prefill chunk may carry
// a KDA snapshot (ModelRunner::SnapshotKda): every KDA layer's recurrent state and conv window
// after exactly the chunks an uncached run forwards.
//
// The invariant that makes a hit bit-identical to no caching: blocks and snapshots are inserted
// only at the end of a full prefill chunk [kC - C, kC) whose end is also a block boundary, by a
// sequence whose every earlier forward was a full chunk of the same grid (scheduler.h
// NextChunkEnd); a hit resumes at such a position P < the sequence's length (the last token is
// always recomputed, so logits exist), and the sequence then forwards [P, P + C), ... exactly as
// the uncached run does from P. Everything before P is what the uncached run computes, by the
// same ops in the same order.
//
// Eviction is LRU over nodes no sequence holds (their block's only reference is the node's),
// leaves first; snapshots are LRU within ModelRunner::kda_snapshot_capacity.
//
// Thread safety: none; the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "kimirt/engine/model_runner.h"

namespace kimirt {

struct PrefixCacheOptions {
  int64_t prefill_chunk = 256;
  uint64_t seed = 0;  // the model, config and cache dtype (PrefixCacheSeed)
};

// A seed naming what a cached block's bytes depend on besides its tokens.
uint64_t PrefixCacheSeed(const ModelConfig& config, KvCacheDType dtype, int block_size, int64_t prefill_chunk);

struct PrefixCacheStats {
  int64_t queries = 0;          // prompt tokens looked up (vllm:prefix_cache_queries_total)
  int64_t hits = 0;             // of them, found (vllm:prefix_cache_hits_total)
  int64_t cached_blocks = 0;    // blocks the cache holds
  int64_t evictable_blocks = 0; // of them, held by no sequence
  int64_t evicted_blocks = 0;   // total
  int64_t snapshots = 0;
  uint64_t snapshot_bytes = 0;  // device bytes of the snapshots, per rank
};

class PrefixCache {
 public:
  PrefixCache(ModelRunner& runner, PrefixCacheOptions options);
  ~PrefixCache();  // gives every block reference and snapshot back to the runner

  // What a sequence of `tokens` can resume from: the first `tokens` positions' blocks and the
  // snapshot after them. tokens == 0: nothing.
  struct Match {
    int64_t tokens = 0;
    std::vector<int32_t> blocks;
    ModelRunner::SnapshotId snapshot = -1;
  };
  // The longest usable prefix of `seq` (below its last token); marks it recently used.
  Match Lookup(std::span<const int32_t> seq);
  // Resumes runner sequence `h` (fresh) from `m` and counts the query: `query` tokens asked,
  // m.tokens found.
  void Apply(ModelRunner::Handle h, const Match& m, int64_t query);

  // After sequence `h` forwarded the full chunk that ends at `end` (a multiple of the chunk and
  // the block size): caches its blocks up to `end` and a snapshot at `end`.
  void Insert(ModelRunner::Handle h, std::span<const int32_t> seq, int64_t end);
  // Whether a forwarded prefill chunk [begin, end) ends where Insert may cache: a full chunk of
  // the grid whose end is also a block boundary.
  bool Qualifies(int64_t begin, int64_t end) const;

  // Blocks held only by the cache: free for the taking by Evict.
  int64_t evictable_blocks() const;
  // Of `blocks`, how many are held by the cache only.
  int64_t EvictableAmong(std::span<const int32_t> blocks) const;
  // Frees up to `blocks` unreferenced blocks, least recently used first; how many it freed.
  int64_t Evict(int64_t blocks);

  PrefixCacheStats stats() const;

 private:
  struct Node;
  Node* Child(Node* parent, std::span<const int32_t> block_tokens) const;
  void DropSnapshot(Node* n);
  void Remove(Node* n);

  ModelRunner& runner_;
  PrefixCacheOptions opt_;
  int64_t block_size_;
  std::unique_ptr<Node> root_;
  std::unordered_multimap<uint64_t, Node*> by_key_;
  std::list<Node*> snapshot_lru_;  // nodes with a snapshot, least recently used first
  uint64_t clock_ = 0;
  int64_t nodes_ = 0;
  int64_t queries_ = 0, hits_ = 0, evicted_ = 0;
};

}  // namespace kimirt
