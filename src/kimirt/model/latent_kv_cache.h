// LatentKvCache: the paged MLA latent cache (spec §6.5). Each token of each MLA layer stores its
// normed latent c [r] and raw shared key k_s [dr] (576 values for K3). Storage is a pool of
// blocks of `block_size` tokens shared by all sequences; a sequence owns a block table (the ids
// of its blocks in order), as in vLLM's PagedAttention. Block b holds positions
// [i*block_size, (i+1)*block_size) of the sequence whose table has b at index i, for every MLA
// layer at once (layer-major inside the pool).
//
// Blocks are reference counted so that the prefix cache (engine/prefix_cache.h) can share a
// full block of prompt latents between sequences without copying it: AllocateBlock hands a
// block out with one reference, Share adds one, FreeBlocks drops one and the block returns to
// the pool when none is left. A shared block is read-only: Write checks that every block it
// writes into has exactly one reference (only full blocks are shared, and a sequence never
// writes below its length, so a sequence never writes into a shared block; copy-on-write is
// never needed and the check keeps it that way).
//
// Element storage (--kv-cache-dtype):
//   kF32  : exact (the CPU reference; what the golden tests pin)
//   kBF16 : round-to-nearest-even BF16
//   kFP8  : OCP E4M3 (saturating) with one F32 scale per token, layer and part (c, k_s):
//           scale = amax / 448, value = code · scale. Per-token scales cost 8 bytes per 576 values
//           and keep a token with an outlier from crushing its neighbours (docs/kv-cache.md).
//
// Thread safety: none; the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/core/status.h"

namespace kimirt {

enum class KvCacheDType : uint8_t { kF32, kBF16, kFP8 };
std::string_view KvCacheDTypeName(KvCacheDType t);
// "f32"/"float32", "bf16"/"bfloat16", "fp8"/"fp8_e4m3".
std::optional<KvCacheDType> ParseKvCacheDType(std::string_view name);
// The --kv-cache-dtype flag: "auto" is the checkpoint's own precision on the GPU (BF16, vLLM's
// auto) and the reference precision (F32) on the CPU; otherwise ParseKvCacheDType.
std::optional<KvCacheDType> KvCacheDTypeFlag(std::string_view flag, std::string_view device);
// Bytes a stored value takes (the FP8 rows' two F32 scales aside).
int KvCacheValueBytes(KvCacheDType t);

class LatentKvCache {
 public:
  // The rows live on `backend`'s device (Backend::MakeKvStorage); the block accounting here.
  // `growable`: when the pool is empty, AllocateBlock grows it (private caches of tools and
  // tests); otherwise it fails and the caller must wait or preempt (the engine).
  LatentKvCache(Backend& backend, int num_layers, int64_t num_blocks, int block_size, int64_t latent_dim,
                int64_t rope_dim, KvCacheDType dtype, bool growable);
  ~LatentKvCache();

  int num_layers() const { return num_layers_; }
  int block_size() const { return block_size_; }
  int64_t num_blocks() const { return num_blocks_; }
  int64_t free_blocks() const { return static_cast<int64_t>(free_.size()); }
  int64_t used_blocks() const { return num_blocks_ - free_blocks(); }
  KvCacheDType dtype() const { return dtype_; }
  // Bytes of one block across all layers (values and scales).
  uint64_t block_bytes() const;
  // Blocks needed to hold `tokens` positions.
  int64_t BlocksFor(int64_t tokens) const { return (tokens + block_size_ - 1) / block_size_; }

  std::optional<int32_t> AllocateBlock();
  // Drops one reference of each block; a block without references goes back to the pool.
  void FreeBlocks(std::span<const int32_t> blocks);
  // Adds one reference to each (allocated) block.
  void Share(std::span<const int32_t> blocks);
  int32_t refs(int32_t block) const;
  // Grows `table` until it covers `tokens` positions. Fails without changing it if the pool
  // cannot provide every missing block.
  Status Reserve(std::vector<int32_t>* table, int64_t tokens);

  // Positions [pos, pos + T) of `layer` := c [T, r], ks [T, dr] (F32 tensors of the backend).
  void Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c, const Tensor& ks);
  // c [len, r], ks [len, dr] := positions [0, len) of `layer`, widened to F32.
  void Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) const;

  // The batched decode ops over the storage (backend.h KvStorage: SetDecodeStep once per step,
  // then WriteDecode and AttendDecode per MLA layer).
  void SetDecodeStep(const PagedDecodeStep& step);
  void WriteDecode(int layer, const Tensor& c, const Tensor& ks);
  void AttendDecode(int layer, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape, Tensor* o);
  // What a decode graph bakes in of this cache (KvStorage::GraphKey).
  std::string GraphKey() const { return storage_->GraphKey(); }
  // Expanded MLA prefill of `batch`'s sequences through their block tables (KvStorage::AttendPrefill).
  void AttendPrefill(int layer, const PagedPrefill& batch, const Tensor& q, const Tensor& w_kvb,
                     const MlaShape& shape, Tensor* o);

 private:
  void AddBlocks(int64_t add);

  std::unique_ptr<KvStorage> storage_;
  int num_layers_;
  int64_t num_blocks_;
  int block_size_;
  int64_t r_, dr_;
  KvCacheDType dtype_;
  bool growable_;
  std::vector<int32_t> free_;    // stack of free block ids
  std::vector<int32_t> refs_;    // per block: references (0: free)
};

}  // namespace kimirt
