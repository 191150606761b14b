#include "kimirt/model/latent_kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "kimirt/core/check.h"
#include "kimirt/core/dtype_convert.h"

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

LatentKvCache::LatentKvCache(int num_layers, int64_t num_blocks, int block_size, int64_t latent_dim,
                             int64_t rope_dim, KvCacheDType dtype, bool growable)
    : num_layers_(num_layers),
      num_blocks_(0),
      block_size_(block_size),
      r_(latent_dim),
      dr_(rope_dim),
      dtype_(dtype),
      growable_(growable) {
  KIMIRT_CHECK(block_size >= 1 && num_blocks >= 0 && num_layers >= 0);
  AddBlocks(num_blocks);
}

uint64_t LatentKvCache::block_bytes() const {
  uint64_t values = static_cast<uint64_t>(num_layers_) * static_cast<uint64_t>(block_size_) *
                    static_cast<uint64_t>(r_ + dr_) * ElemSize(dtype_);
  if (dtype_ == KvCacheDType::kFP8) values += static_cast<uint64_t>(num_layers_) * block_size_ * 2 * sizeof(float);
  return values;
}

LatentKvCache::RawBuffer::~RawBuffer() { std::free(data); }

void LatentKvCache::RawBuffer::Resize(size_t bytes) {
  if (bytes == 0) return;
  void* p = std::realloc(data, bytes);
  KIMIRT_CHECK_MSG(p != nullptr, "latent KV cache allocation failed");
  data = static_cast<uint8_t*>(p);
  size = bytes;
}

void LatentKvCache::AddBlocks(int64_t add) {
  const int64_t old = num_blocks_;
  const size_t rows = static_cast<size_t>(old + add) * static_cast<size_t>(num_layers_) * static_cast<size_t>(block_size_);
  values_.Resize(rows * static_cast<size_t>(r_ + dr_) * ElemSize(dtype_));
  if (dtype_ == KvCacheDType::kFP8) scales_.Resize(rows * 2 * sizeof(float));
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
  return b;
}

void LatentKvCache::FreeBlocks(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    KIMIRT_CHECK(b >= 0 && b < num_blocks_);
    free_.push_back(b);
  }
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

size_t LatentKvCache::ValueOffset(int32_t block, int layer, int64_t slot) const {
  return ((static_cast<size_t>(block) * static_cast<size_t>(num_layers_) + static_cast<size_t>(layer)) *
              static_cast<size_t>(block_size_) +
          static_cast<size_t>(slot)) *
         static_cast<size_t>(r_ + dr_);
}

void LatentKvCache::Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c,
                          const Tensor& ks) {
  const int64_t T = c.dim(0), w = r_ + dr_;
  KIMIRT_CHECK(c.dim(1) == r_ && ks.numel() == T * dr_ && layer >= 0 && layer < num_layers_);
  KIMIRT_CHECK(BlocksFor(pos + T) <= static_cast<int64_t>(table.size()));
  std::vector<float> row(static_cast<size_t>(w));
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = pos + t;
    const int32_t block = table[static_cast<size_t>(p / block_size_)];
    const size_t off = ValueOffset(block, layer, p % block_size_);
    std::memcpy(row.data(), c.f32() + t * r_, static_cast<size_t>(r_) * sizeof(float));
    std::memcpy(row.data() + r_, ks.f32() + t * dr_, static_cast<size_t>(dr_) * sizeof(float));
    switch (dtype_) {
      case KvCacheDType::kF32:
        std::memcpy(values_.data + off * 4, row.data(), row.size() * sizeof(float));
        break;
      case KvCacheDType::kBF16: {
        uint16_t* dst = reinterpret_cast<uint16_t*>(values_.data) + off;
        F32ToBf16(row.data(), dst, row.size());
        break;
      }
      case KvCacheDType::kFP8: {
        float* scale = reinterpret_cast<float*>(scales_.data) + off / static_cast<size_t>(w) * 2;
        for (int part = 0; part < 2; ++part) {
          const int64_t begin = part == 0 ? 0 : r_, n = part == 0 ? r_ : dr_;
          float amax = 0.0f;
          for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(row[static_cast<size_t>(begin + i)]));
          const float s = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
          scale[part] = s;
          for (int64_t i = 0; i < n; ++i) {
            values_.data[off + static_cast<size_t>(begin + i)] = F32ToFp8E4M3(row[static_cast<size_t>(begin + i)] / s);
          }
        }
        break;
      }
    }
  }
}

void LatentKvCache::Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) const {
  const int64_t w = r_ + dr_;
  KIMIRT_CHECK(c->dim(0) >= len && ks->dim(0) >= len && BlocksFor(len) <= static_cast<int64_t>(table.size()));
  std::vector<float> row(static_cast<size_t>(w));
  for (int64_t p = 0; p < len; ++p) {
    const int32_t block = table[static_cast<size_t>(p / block_size_)];
    const size_t off = ValueOffset(block, layer, p % block_size_);
    switch (dtype_) {
      case KvCacheDType::kF32:
        std::memcpy(row.data(), values_.data + off * 4, row.size() * sizeof(float));
        break;
      case KvCacheDType::kBF16:
        Bf16ToF32(reinterpret_cast<const uint16_t*>(values_.data) + off, row.data(), row.size());
        break;
      case KvCacheDType::kFP8: {
        const float* scale = reinterpret_cast<const float*>(scales_.data) + off / static_cast<size_t>(w) * 2;
        for (int64_t i = 0; i < w; ++i) {
          row[static_cast<size_t>(i)] = Fp8E4M3ToF32(values_.data[off + static_cast<size_t>(i)]) * scale[i < r_ ? 0 : 1];
        }
        break;
      }
    }
    std::memcpy(c->f32() + p * r_, row.data(), static_cast<size_t>(r_) * sizeof(float));
    std::memcpy(ks->f32() + p * dr_, row.data() + r_, static_cast<size_t>(dr_) * sizeof(float));
  }
}

}  // namespace kimirt
