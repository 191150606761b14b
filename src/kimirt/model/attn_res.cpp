// Block AttnRes bookkeeping (attn_res.h; spec §4.1, §8).
#include "kimirt/model/attn_res.h"

#include "kimirt/core/check.h"

namespace kimirt {

BlockAttnRes::BlockAttnRes(Backend& be, Tensor embedding, int64_t block_size, float eps, const Tensor& out_proj,
                           const Tensor& out_norm)
    : ResidualStream(be), block_size_(block_size), eps_(eps), out_proj_(out_proj), out_norm_(out_norm),
      prefix_(std::move(embedding)) {}

BlockAttnRes::BlockAttnRes(Backend& be, std::vector<Tensor> state, int64_t block_size, float eps,
                           const Tensor& out_proj, const Tensor& out_norm)
    : ResidualStream(be), block_size_(block_size), eps_(eps), out_proj_(out_proj), out_norm_(out_norm) {
  KIMIRT_CHECK(!state.empty());
  prefix_ = std::move(state.back());
  state.pop_back();
  bank_ = std::move(state);
}

std::vector<Tensor> BlockAttnRes::State() const {
  KIMIRT_CHECK(has_prefix_);
  std::vector<Tensor> s = bank_;
  s.push_back(prefix_);
  return s;
}

Tensor BlockAttnRes::Mix(const Tensor& proj, const Tensor& norm) {
  std::vector<const Tensor*> cands;
  for (const Tensor& b : bank_) cands.push_back(&b);
  cands.push_back(&prefix_);  // the prefix is always the last candidate (spec §8.2)
  Tensor y = be_.Empty(prefix_.shape());
  if (norm_next_.w != nullptr) {
    be_.AttnResMixNorm(cands, proj, norm, eps_, *norm_next_.w, norm_next_.eps, &y);
    norm_next_ = {};
  } else {
    be_.AttnResMix(cands, proj, norm, eps_, &y);
  }
  return y;
}

Tensor BlockAttnRes::AddThenNorm(const Tensor& out, const Tensor& w, float eps, const std::function<Tensor()>& next) {
  Add(out);
  norm_next_ = {&w, eps};
  const Tensor x = next();
  if (norm_next_.w == nullptr) return x;  // Mix normalized it
  norm_next_ = {};                        // no mix (the prefix itself): the norm apart
  Tensor y = be_.Empty(x.shape());
  be_.RmsNorm(x, w, eps, &y);
  return y;
}

Tensor BlockAttnRes::AttentionInput(int64_t layer, const LayerWeights& lw) {
  Tensor a = bank_.empty() ? prefix_ : Mix(lw.attn_res_proj, lw.attn_res_norm);
  if (layer % block_size_ == 0) {
    bank_.push_back(prefix_);  // the PRE-mix prefix (spec §4.1 step 2)
    has_prefix_ = false;
  }
  return a;
}

Tensor BlockAttnRes::FfnInput(const LayerWeights& lw) { return Mix(lw.mlp_res_proj, lw.mlp_res_norm); }

void BlockAttnRes::Add(const Tensor& out) {
  prefix_ = has_prefix_ ? Sum(be_, prefix_, out) : out;
  has_prefix_ = true;
}

Tensor BlockAttnRes::Output() { return bank_.empty() ? prefix_ : Mix(out_proj_, out_norm_); }

}  // namespace kimirt
