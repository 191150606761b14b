// A random paged MLA decode step for the tests of KvStorage's batched decode ops (backend.h):
// B sequences of given context lengths whose latent blocks interleave in one pool (sequence b's
// i-th block is the (i·B + b)-th handed out, in reverse), random latents, queries and kv_b at
// the given widths. Header-only; nothing in the product includes it.
#pragma once

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/core/random.h"

namespace kimirt::testing {

struct PagedDecodeCase {
  KvStorageShape kv;
  MlaShape mla;
  PagedDecodeStep step;
  int64_t blocks = 0;              // pool size (some blocks stay unused)
  std::vector<Tensor> prefix_c;    // per sequence: host [context - 1, r]
  std::vector<Tensor> prefix_ks;   //               host [context - 1, dr]
  Tensor new_c, new_ks;            // host [B, r], [B, dr]: the step's new rows
  Tensor q;                        // host [B, H·(dn + dr)]
  Tensor w_kvb;                    // host [H·(dn + dv), r]
};

inline Tensor RandomHost(SplitMix64& rng, Shape shape, float scale) {
  Tensor t = Tensor::Host(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = scale * rng.FastNormal();
  return t;
}

// K3's MLA widths (r 512, dr 64, dn = dv = 128) with `heads` heads per rank, `layers` MLA layers.
inline PagedDecodeCase MakePagedDecodeCase(const std::vector<int64_t>& contexts, int64_t heads, DType dtype,
                                           uint64_t seed, int block_size = 16, int layers = 2) {
  PagedDecodeCase c;
  SplitMix64 rng(seed);
  c.kv.layers = layers;
  c.kv.block_size = block_size;
  c.kv.latent_dim = 512;
  c.kv.rope_dim = 64;
  c.kv.dtype = dtype;
  c.mla.heads = heads;
  c.mla.nope_dim = 128;
  c.mla.rope_dim = 64;
  c.mla.v_dim = 128;
  c.mla.latent_dim = 512;
  const int64_t B = static_cast<int64_t>(contexts.size());
  std::vector<std::vector<int32_t>> tables(contexts.size());
  int64_t max_blocks = 0;
  for (int64_t len : contexts) max_blocks = std::max(max_blocks, (len + block_size - 1) / block_size);
  int32_t next = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    for (int64_t b = 0; b < B; ++b) {
      if (i * block_size < contexts[static_cast<size_t>(b)]) tables[static_cast<size_t>(b)].push_back(next);
      ++next;  // a sequence that needs no more blocks still skips an id: unused blocks between
    }
  }
  c.blocks = next + 3;
  for (auto& t : tables) {
    for (int32_t& id : t) id = static_cast<int32_t>(c.blocks - 1 - id);  // reverse: tables run downwards
  }
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = contexts[static_cast<size_t>(b)];
    c.step.Add(tables[static_cast<size_t>(b)], len);
    c.prefix_c.push_back(RandomHost(rng, {len - 1, c.kv.latent_dim}, 1.0f));
    c.prefix_ks.push_back(RandomHost(rng, {len - 1, c.kv.rope_dim}, 1.0f));
  }
  c.new_c = RandomHost(rng, {B, c.kv.latent_dim}, 1.0f);
  c.new_ks = RandomHost(rng, {B, c.kv.rope_dim}, 1.0f);
  c.q = RandomHost(rng, {B, heads * (c.mla.nope_dim + c.mla.rope_dim)}, 1.0f);
  c.w_kvb = RandomHost(rng, {heads * (c.mla.nope_dim + c.mla.v_dim), c.kv.latent_dim}, 0.05f);
  return c;
}

// A storage on `be` holding the case at `layer`: each sequence's prefix rows written in one
// call, the step set, and the new rows written by WriteDecode. Other layers hold other rows.
inline std::unique_ptr<KvStorage> FillPagedDecodeStorage(Backend& be, const PagedDecodeCase& c, int layer) {
  std::unique_ptr<KvStorage> kv = be.MakeKvStorage(c.kv);
  kv->Resize(c.blocks);
  for (int l = 0; l < c.kv.layers; ++l) {
    for (int64_t b = 0; b < c.step.size(); ++b) {
      const Tensor& pc = c.prefix_c[static_cast<size_t>(b)];
      if (pc.dim(0) == 0) continue;
      // Another layer gets the rows negated, so reading the wrong layer shows.
      Tensor hc = Tensor::Host(pc.shape()), hks = Tensor::Host(c.prefix_ks[static_cast<size_t>(b)].shape());
      const float sign = l == layer ? 1.0f : -1.0f;
      for (int64_t i = 0; i < hc.numel(); ++i) hc.f32()[i] = sign * pc.f32()[i];
      for (int64_t i = 0; i < hks.numel(); ++i) hks.f32()[i] = sign * c.prefix_ks[static_cast<size_t>(b)].f32()[i];
      kv->Write(l, c.step.table(b), 0, be.Upload(hc), be.Upload(hks));
    }
  }
  kv->SetDecodeStep(c.step);
  kv->WriteDecode(layer, be.Upload(c.new_c), be.Upload(c.new_ks));
  return kv;
}

}  // namespace kimirt::testing
