#include "kimirt/model/latent_kv_cache.h"

#include <algorithm>

#include "kimirt/backend/backend.h"
#include "kimirt/core/check.h"

namespace kimirt {
namespace {

size_t ElemSize(KvCacheDType t) {
  switch (t) {
    case KvCacheDType::kF32: return 4;
    case KvCacheDType::kBF16: return 2;
    case KvCacheDType::kFP8: return 1;
  }
  return 4;
}

}  // namespace

std::string_view KvCacheDTypeName(KvCacheDType t) {
  switch (t) {
    case KvCacheDType::kF32: return "f32";
    case KvCacheDType::kBF16: return "bf16";
    case KvCacheDType::kFP8: return "fp8";
  }
  return "?";
}

std::optional<KvCacheDType> ParseKvCacheDType(std::string_view n) {
  if (n == "f32" || n == "float32" || n == "fp32") return KvCacheDType::kF32;
  if (n == "bf16" || n == "bfloat16") return KvCacheDType::kBF16;
  if (n == "fp8" || n == "fp8_e4m3" || n == "fp8-e4m3") return KvCacheDType::kFP8;
  return std::nullopt;
}

std::optional<KvCacheDType> KvCacheDTypeFlag(std::string_view flag, std::string_view device) {
  if (flag == "auto") return device == "cuda" ? KvCacheDType::kBF16 : KvCacheDType::kF32;
  return ParseKvCacheDType(flag);
}

int KvCacheValueBytes(KvCacheDType t) { return t == KvCacheDType::kF32 ? 4 : t == KvCacheDType::kBF16 ? 2 : 1; }

LatentKvCache::LatentKvCache(Backend& backend, int num_layers, int64_t num_blocks, int block_size,
                             int64_t latent_dim, int64_t rope_dim, KvCacheDType dtype, bool growable)
    : num_layers_(num_layers),
      num_blocks_(0),
      block_size_(block_size),
      r_(latent_dim),
      dr_(rope_dim),
      dtype_(dtype),
      growable_(growable) {
  KIMIRT_CHECK(block_size >= 1 && num_blocks >= 0 && num_layers >= 0);
  KvStorageShape shape;
  shape.layers = num_layers;
  shape.block_size = block_size;
  shape.latent_dim = latent_dim;
  shape.rope_dim = rope_dim;
  shape.dtype = dtype == KvCacheDType::kF32 ? DType::kF32 : dtype == KvCacheDType::kBF16 ? DType::kBF16 : DType::kF8E4M3;
  storage_ = backend.MakeKvStorage(shape);
  AddBlocks(num_blocks);
}

LatentKvCache::~LatentKvCache() = default;

uint64_t LatentKvCache::block_bytes() const {
  uint64_t values = static_cast<uint64_t>(num_layers_) * static_cast<uint64_t>(block_size_) *
                    static_cast<uint64_t>(r_ + dr_) * ElemSize(dtype_);
  if (dtype_ == KvCacheDType::kFP8) values += static_cast<uint64_t>(num_layers_) * block_size_ * 2 * sizeof(float);
  return values;
}

void LatentKvCache::AddBlocks(int64_t add) {
  const int64_t old = num_blocks_;
  storage_->Resize(old + add);
  refs_.resize(static_cast<size_t>(old + add), 0);
  // Free blocks pop from the back: hand out low ids first.
  for (int64_t b = old + add - 1; b >= old; --b) free_.push_back(static_cast<int32_t>(b));
  num_blocks_ = old + add;
}

std::optional<int32_t> LatentKvCache::AllocateBlock() {
  if (free_.empty()) {
    if (!growable_) return std::nullopt;
    AddBlocks(std::max<int64_t>(4, num_blocks_));  // doubling: amortized O(1) per block
  }
  const int32_t b = free_.back();
  free_.pop_back();
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

void LatentKvCache::FreeBlocks(std::span<const int32_t> blocks) {
  const size_t was_free = free_.size();
  for (int32_t b : blocks) {
    KIMIRT_CHECK_MSG(b >= 0 && b < num_blocks_ && refs_[static_cast<size_t>(b)] > 0, "freeing a free latent block");
    if (--refs_[static_cast<size_t>(b)] == 0) free_.push_back(b);
  }
  // The storage forgets what it derived from rows that may now be rewritten.
  if (free_.size() > was_free) storage_->Released(std::span<const int32_t>(free_).subspan(was_free));
}

void LatentKvCache::Share(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    KIMIRT_CHECK_MSG(b >= 0 && b < num_blocks_ && refs_[static_cast<size_t>(b)] > 0, "sharing a free latent block");
    ++refs_[static_cast<size_t>(b)];
  }
}

int32_t LatentKvCache::refs(int32_t block) const {
  KIMIRT_CHECK(block >= 0 && block < num_blocks_);
  return refs_[static_cast<size_t>(block)];
}

Status LatentKvCache::Reserve(std::vector<int32_t>* table, int64_t tokens) {
  const int64_t need = BlocksFor(tokens) - static_cast<int64_t>(table->size());
  if (need <= 0) return Status::Ok();
  if (!growable_ && need > free_blocks()) {
    return ResourceExhausted("latent KV cache: " + std::to_string(need) + " more blocks needed, " +
                             std::to_string(free_blocks()) + " free");
  }
  for (int64_t i = 0; i < need; ++i) table->push_back(*AllocateBlock());
  return Status::Ok();
}

void LatentKvCache::Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c,
                          const Tensor& ks) {
  KIMIRT_CHECK(layer >= 0 && layer < num_layers_ && c.dim(1) == r_);
  KIMIRT_CHECK(BlocksFor(pos + c.dim(0)) <= static_cast<int64_t>(table.size()));
  // A shared block is read-only (see the class comment): writing into one would change another
  // sequence's prefix.
  for (int64_t i = pos / block_size_; i < BlocksFor(pos + c.dim(0)); ++i) {
    KIMIRT_CHECK_MSG(refs_[static_cast<size_t>(table[static_cast<size_t>(i)])] == 1,
                     "write into a shared latent block");
  }
  storage_->Write(layer, table, pos, c, ks);
}

void LatentKvCache::Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) const {
  KIMIRT_CHECK(c->dim(0) >= len && ks->dim(0) >= len && BlocksFor(len) <= static_cast<int64_t>(table.size()));
  storage_->Gather(layer, table, len, c, ks);
}

void LatentKvCache::SetDecodeStep(const PagedDecodeStep& step) {
  for (int64_t b = 0; b < step.size(); ++b) {
    KIMIRT_CHECK(BlocksFor(step.context[static_cast<size_t>(b)]) <= static_cast<int64_t>(step.table(b).size()));
  }
  storage_->SetDecodeStep(step);
}

void LatentKvCache::WriteDecode(int layer, const Tensor& c, const Tensor& ks) {
  KIMIRT_CHECK(layer >= 0 && layer < num_layers_ && c.dim(1) == r_);
  storage_->WriteDecode(layer, c, ks);
}

void LatentKvCache::AttendDecode(int layer, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape, Tensor* o) {
  KIMIRT_CHECK(layer >= 0 && layer < num_layers_ && shape.latent_dim == r_ && shape.rope_dim == dr_);
  storage_->AttendDecode(layer, q, w_kvb, shape, o);
}

void LatentKvCache::AttendPrefill(int layer, const PagedPrefill& batch, const Tensor& q, const Tensor& w_kvb,
                                  const MlaShape& shape, Tensor* o) {
  KIMIRT_CHECK(layer >= 0 && layer < num_layers_ && shape.latent_dim == r_ && shape.rope_dim == dr_);
  for (int64_t b = 0; b < batch.size(); ++b) {
    KIMIRT_CHECK_MSG(BlocksFor(batch.start[static_cast<size_t>(b)] + batch.count[static_cast<size_t>(b)]) <=
                         static_cast<int64_t>(batch.table(b).size()),
                     "prefill: a block table does not cover its sequence");
  }
  storage_->AttendPrefill(layer, batch, q, w_kvb, shape, o);
}

}  // namespace kimirt
