// Block Attention Residuals (spec §4.1, §8): the K3 residual scheme. Instead of one running sum,
// the stream keeps the closed blocks (`bank`; entry 0 the embedding, then the sum of every
// sub-layer output of each block of attn_res_block_size layers) and the running sum of the open
// block (`prefix`). Each norm reads a learned softmax mix of [bank..., prefix] (spec §8.2);
// the mixes only feed the norms, never the sums.
#pragma once

#include <vector>

#include "kimirt/model/residual.h"

namespace kimirt {

class BlockAttnRes final : public ResidualStream {
 public:
  // `embedding` [T, D] starts the prefix; blocks of `block_size` layers; `eps` the scoring
  // norms' rms_norm_eps (spec §8.2); `out_proj`, `out_norm` the output site's pseudo-query and
  // key-norm gain (spec §4 step 4).
  BlockAttnRes(Backend& be, Tensor embedding, int64_t block_size, float eps, const Tensor& out_proj,
               const Tensor& out_norm);
  // A stream continuing from `state` (State() of a stream after layer `layer` - 1): the closed
  // blocks, then the open block's sum.
  BlockAttnRes(Backend& be, std::vector<Tensor> state, int64_t block_size, float eps, const Tensor& out_proj,
               const Tensor& out_norm);
  // How many tensors State() holds before layer `layer` runs: the blocks closed by then (one at
  // each layer < `layer` that is a multiple of block_size, spec §4.1 step 2) and the prefix.
  static int64_t StateSizeBefore(int64_t layer, int64_t block_size) {
    return (layer + block_size - 1) / block_size + 1;
  }

  // Spec §4.1 steps 1-2: mix at the attention site, then close a block at a boundary layer.
  Tensor AttentionInput(int64_t layer, const LayerWeights& lw) override;
  // Spec §4.1 step 5: mix at the MLP site (the bank is never empty here).
  Tensor FfnInput(const LayerWeights& lw) override;
  // Spec §4.1 steps 4 and 7: prefix ← out after a boundary, else prefix + out.
  void Add(const Tensor& out) override;
  // Spec §4 step 4: the output site's mix (the prefix itself if the bank is empty).
  Tensor Output() override;
  // Add(out), then the norm of next(): where next() mixes (every site but one with an empty
  // bank), the mix and the norm are one Backend::AttnResMixNorm (the mix is that norm's input
  // alone).
  Tensor AddThenNorm(const Tensor& out, const Tensor& w, float eps, const std::function<Tensor()>& next) override;
  // The closed blocks, oldest first, then the prefix. Between layers the prefix is always there
  // (a layer's FFN output was the last Add), so the bank and prefix are the whole state.
  std::vector<Tensor> State() const override;

 private:
  // AttnResMix([bank..., prefix]; proj, norm) (spec §8.2); normalized by norm_next_ (and that
  // cleared) when AddThenNorm has set it.
  Tensor Mix(const Tensor& proj, const Tensor& norm);

  struct NextNorm {
    const Tensor* w = nullptr;
    float eps = 0.0f;
  };
  NextNorm norm_next_;  // set by AddThenNorm for the one Mix its next() may run

  int64_t block_size_;
  float eps_;
  const Tensor& out_proj_;
  const Tensor& out_norm_;
  std::vector<Tensor> bank_;  // closed blocks, oldest first
  Tensor prefix_;             // the open block's sum
  bool has_prefix_ = true;    // false right after a boundary, until the next output arrives
};

}  // namespace kimirt
