// CpuKvStorage (cpu_kv_storage.h): the latent cache's rows in one host buffer,
// [blocks, layers, block_size, r + dr] elements, plus for FP8 the scales [.., 2] (backend.h).
#include "kimirt/backend/cpu/cpu_kv_storage.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "kimirt/backend/cpu/mla_kernels.h"
#include "kimirt/core/check.h"
#include "kimirt/core/dtype_convert.h"

namespace kimirt {
namespace {

// Storage that is not zero-filled: every position is written before it is read, and leaving
// pages untouched until then makes a large pool free to create (the OS maps them lazily).
struct RawBuffer {
  RawBuffer() = default;
  RawBuffer(const RawBuffer&) = delete;
  RawBuffer& operator=(const RawBuffer&) = delete;
  ~RawBuffer() { std::free(data); }
  void Resize(size_t bytes) {  // keeps the first min(old, new) bytes
    if (bytes <= size) return;
    void* p = std::realloc(data, bytes);
    KIMIRT_CHECK_MSG(p != nullptr, "latent KV cache allocation failed");
    data = static_cast<uint8_t*>(p);
    size = bytes;
  }
  uint8_t* data = nullptr;
  size_t size = 0;
};

class CpuKvStorage final : public KvStorage {
 public:
  explicit CpuKvStorage(const KvStorageShape& s) : s_(s), w_(s.latent_dim + s.rope_dim) {
    KIMIRT_CHECK(s.dtype == DType::kF32 || s.dtype == DType::kBF16 || s.dtype == DType::kF8E4M3);
  }

  void Resize(int64_t blocks) override {
    const size_t rows = static_cast<size_t>(blocks) * static_cast<size_t>(s_.layers) * static_cast<size_t>(s_.block_size);
    values_.Resize(rows * static_cast<size_t>(w_) * DTypeSize(s_.dtype));
    if (s_.dtype == DType::kF8E4M3) scales_.Resize(rows * 2 * sizeof(float));
  }

  void Write(int layer, std::span<const int32_t> table, int64_t pos, const Tensor& c, const Tensor& ks) override {
    const int64_t T = c.dim(0), r = s_.latent_dim, dr = s_.rope_dim;
    KIMIRT_CHECK(c.dim(1) == r && ks.numel() == T * dr && layer >= 0 && layer < s_.layers);
    std::vector<float> row(static_cast<size_t>(w_));
    for (int64_t t = 0; t < T; ++t) {
      const size_t off = RowOffset(table, layer, pos + t);
      std::memcpy(row.data(), c.f32() + t * r, static_cast<size_t>(r) * sizeof(float));
      std::memcpy(row.data() + r, ks.f32() + t * dr, static_cast<size_t>(dr) * sizeof(float));
      switch (s_.dtype) {
        case DType::kBF16:
          F32ToBf16(row.data(), reinterpret_cast<uint16_t*>(values_.data) + off, row.size());
          break;
        case DType::kF8E4M3: {
          float* scale = reinterpret_cast<float*>(scales_.data) + off / static_cast<size_t>(w_) * 2;
          for (int part = 0; part < 2; ++part) {
            const int64_t begin = part == 0 ? 0 : r, n = part == 0 ? r : dr;
            float amax = 0.0f;
            for (int64_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(row[static_cast<size_t>(begin + i)]));
            const float sc = amax > 0.0f ? amax / kFp8E4M3Max : 1.0f;
            scale[part] = sc;
            for (int64_t i = 0; i < n; ++i) {
              values_.data[off + static_cast<size_t>(begin + i)] = F32ToFp8E4M3(row[static_cast<size_t>(begin + i)] / sc);
            }
          }
          break;
        }
        default:
          std::memcpy(values_.data + off * 4, row.data(), row.size() * sizeof(float));
          break;
      }
    }
  }

  void Gather(int layer, std::span<const int32_t> table, int64_t len, Tensor* c, Tensor* ks) override {
    const int64_t r = s_.latent_dim, dr = s_.rope_dim;
    KIMIRT_CHECK(c->dim(0) >= len && ks->dim(0) >= len);
    std::vector<float> row(static_cast<size_t>(w_));
    for (int64_t p = 0; p < len; ++p) {
      ReadRow(layer, table, p, row.data());
      std::memcpy(c->f32() + p * r, row.data(), static_cast<size_t>(r) * sizeof(float));
      std::memcpy(ks->f32() + p * dr, row.data() + r, static_cast<size_t>(dr) * sizeof(float));
    }
  }

  void SetDecodeStep(const PagedDecodeStep& step) override {
    for (int64_t b = 0; b < step.size(); ++b) {
      const int64_t len = step.context[static_cast<size_t>(b)];
      KIMIRT_CHECK_MSG(len > 0 && static_cast<int64_t>(step.table(b).size()) * s_.block_size >= len,
                       "decode step: a block table does not cover its context");
    }
    step_ = step;
  }

  void WriteDecode(int layer, const Tensor& c, const Tensor& ks) override {
    KIMIRT_CHECK(c.dim(0) == step_.size());
    for (int64_t b = 0; b < step_.size(); ++b) {
      Write(layer, step_.table(b), step_.context[static_cast<size_t>(b)] - 1, c.Rows(b, 1), ks.Rows(b, 1));
    }
  }

  // Each sequence alone through the reference kernel, its rows read where they lie: F32 rows in
  // place, BF16 / FP8 rows widened one at a time into the kernel's scratch.
  void AttendDecode(int layer, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape, Tensor* o) override {
    KIMIRT_CHECK_MSG(w_kvb.dtype() == DType::kF32, "the CPU backend holds kv_b in F32 only");
    const int64_t H = shape.heads, dq = shape.nope_dim + shape.rope_dim, dv = shape.v_dim;
    KIMIRT_CHECK(shape.latent_dim == s_.latent_dim && shape.rope_dim == s_.rope_dim);
    KIMIRT_CHECK(q.dim(0) == step_.size() && q.numel() == step_.size() * H * dq && o->numel() == step_.size() * H * dv);
    for (int64_t b = 0; b < step_.size(); ++b) {
      const std::span<const int32_t> table = step_.table(b);
      cpu::MlaAttentionArgs a = ArgsOf(shape, w_kvb);
      a.tokens = 1;
      a.start = step_.context[static_cast<size_t>(b)] - 1;
      a.q = q.f32() + b * H * dq;
      cpu::MlaAttentionAbsorbedRows(
          a,
          [&](int64_t p, float* scratch, const float** c, const float** ks) {
            if (s_.dtype == DType::kF32) {
              *c = reinterpret_cast<const float*>(values_.data) + RowOffset(table, layer, p);
            } else {
              ReadRow(layer, table, p, scratch);
              *c = scratch;
            }
            *ks = *c + s_.latent_dim;
          },
          o->f32() + b * H * dv);
    }
  }

  // Each sequence as the F32 path computes it: its rows gathered, then the expanded reference
  // kernel (what CpuBackend::MlaAttention runs for kExpanded), so the same bits.
  void AttendPrefill(int layer, const PagedPrefill& batch, const Tensor& q, const Tensor& w_kvb, const MlaShape& shape,
                     Tensor* o) override {
    KIMIRT_CHECK_MSG(w_kvb.dtype() == DType::kF32, "the CPU backend holds kv_b in F32 only");
    const int64_t H = shape.heads, dq = shape.nope_dim + shape.rope_dim, dv = shape.v_dim;
    KIMIRT_CHECK(shape.latent_dim == s_.latent_dim && shape.rope_dim == s_.rope_dim);
    KIMIRT_CHECK(q.numel() == q.dim(0) * H * dq && o->numel() == q.dim(0) * H * dv);
    for (int64_t b = 0; b < batch.size(); ++b) {
      const size_t i = static_cast<size_t>(b);
      const int64_t start = batch.start[i], n = batch.count[i], row = batch.row[i];
      KIMIRT_CHECK_MSG(start >= 0 && n >= 0 && row >= 0 && row + n <= q.dim(0), "prefill: rows out of range");
      if (n == 0) continue;
      Tensor c = Tensor::Host({start + n, s_.latent_dim}), ks = Tensor::Host({start + n, s_.rope_dim});
      Gather(layer, batch.table(b), start + n, &c, &ks);
      cpu::MlaAttentionArgs a = ArgsOf(shape, w_kvb);
      a.tokens = n;
      a.start = start;
      a.q = q.f32() + row * H * dq;
      a.cache_c = c.f32();
      a.cache_ks = ks.f32();
      cpu::MlaAttentionExpanded(a, o->f32() + row * H * dv);
    }
  }

 private:
  // The reference kernels' arguments for these widths and kv_b (what CpuBackend::MlaAttention
  // passes): tokens, start, q and the cache left to set.
  static cpu::MlaAttentionArgs ArgsOf(const MlaShape& shape, const Tensor& w_kvb) {
    cpu::MlaAttentionArgs a;
    a.heads = shape.heads;
    a.nope_dim = shape.nope_dim;
    a.rope_dim = shape.rope_dim;
    a.v_dim = shape.v_dim;
    a.latent_dim = shape.latent_dim;
    a.w_kvb = w_kvb.f32();
    a.scale = 1.0f / std::sqrt(static_cast<float>(shape.nope_dim + shape.rope_dim));
    return a;
  }

  // row [r + dr] := position p of `layer`, widened to F32.
  void ReadRow(int layer, std::span<const int32_t> table, int64_t p, float* row) const {
    const size_t off = RowOffset(table, layer, p);
    switch (s_.dtype) {
      case DType::kBF16:
        Bf16ToF32(reinterpret_cast<const uint16_t*>(values_.data) + off, row, static_cast<size_t>(w_));
        break;
      case DType::kF8E4M3: {
        const float* scale = reinterpret_cast<const float*>(scales_.data) + off / static_cast<size_t>(w_) * 2;
        for (int64_t i = 0; i < w_; ++i) {
          row[i] = Fp8E4M3ToF32(values_.data[off + static_cast<size_t>(i)]) * scale[i < s_.latent_dim ? 0 : 1];
        }
        break;
      }
      default:
        std::memcpy(row, values_.data + off * 4, static_cast<size_t>(w_) * sizeof(float));
        break;
    }
  }

  // Element index of position `p`'s row of `layer`.
  size_t RowOffset(std::span<const int32_t> table, int layer, int64_t p) const {
    const size_t slot = static_cast<size_t>(p / s_.block_size);
    KIMIRT_CHECK(slot < table.size());
    const size_t block = static_cast<size_t>(table[slot]);
    return ((block * static_cast<size_t>(s_.layers) + static_cast<size_t>(layer)) * static_cast<size_t>(s_.block_size) +
            static_cast<size_t>(p % s_.block_size)) *
           static_cast<size_t>(w_);
  }

  KvStorageShape s_;
  int64_t w_;
  RawBuffer values_;
  RawBuffer scales_;
  PagedDecodeStep step_;
};

}  // namespace

std::unique_ptr<KvStorage> MakeCpuKvStorage(const KvStorageShape& shape) {
  return std::make_unique<CpuKvStorage>(shape);
}

}  // namespace kimirt
