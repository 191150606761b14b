// ResidualStream: how a decoder's sub-layers read and feed its residual stream — the one thing
// in which the layer loop (model.cpp) differs between K3 and Kimi-Linear. Per layer the loop
// runs
//   x = input_norm(AttentionInput(layer)); Add(attention(x));
//   y = post_norm(FfnInput(layer));        Add(ffn(y));
// and after the last layer final_norm(Output()) (spec §4). Schemes: PreNormResidual here,
// BlockAttnRes in attn_res.h.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/model/weights.h"

namespace kimirt {

class ResidualStream {
 public:
  explicit ResidualStream(Backend& be) : be_(be) {}
  virtual ~ResidualStream() = default;
  // What layer `layer`'s attention norm reads.
  virtual Tensor AttentionInput(int64_t layer, const LayerWeights& lw) = 0;
  // What the FFN norm of the same layer reads (after its attention output was added).
  virtual Tensor FfnInput(const LayerWeights& lw) = 0;
  // Adds a sub-layer's output [T, D] to the stream.
  virtual void Add(const Tensor& out) = 0;
  // Add(out), then RMSNorm(w, eps) of next() — what the next norm reads (FfnInput, the next
  // layer's AttentionInput or Output) — as a new tensor. Each stream fuses what it can:
  // PreNormResidual's norms read the sum itself (Backend::AddRmsNorm), BlockAttnRes's read a mix
  // (Backend::AttnResMixNorm).
  virtual Tensor AddThenNorm(const Tensor& out, const Tensor& w, float eps, const std::function<Tensor()>& next) = 0;
  // What the final norm reads.
  virtual Tensor Output() = 0;
  // The whole state between two layers, as tensors [T, D] (pipeline parallelism: what one stage
  // hands the next; docs/distributed.md "Pipeline parallelism"). A stream made from them
  // continues exactly as this one would.
  virtual std::vector<Tensor> State() const = 0;

 protected:
  Backend& be_;
};

// The plain pre-norm residual stream h ← h + sublayer(norm(h)) (Kimi-Linear, spec §1.3): every
// norm reads h.
class PreNormResidual final : public ResidualStream {
 public:
  // `embedding` [T, D] is the stream's start (or h, from State()).
  PreNormResidual(Backend& be, Tensor embedding) : ResidualStream(be), h_(std::move(embedding)) {}
  Tensor AttentionInput(int64_t /*layer*/, const LayerWeights& /*lw*/) override { return h_; }
  Tensor FfnInput(const LayerWeights& /*lw*/) override { return h_; }
  void Add(const Tensor& out) override;
  Tensor AddThenNorm(const Tensor& out, const Tensor& w, float eps, const std::function<Tensor()>& next) override;
  Tensor Output() override { return h_; }
  std::vector<Tensor> State() const override { return {h_}; }

 private:
  Tensor h_;
};

// A new tensor a + b.
Tensor Sum(Backend& be, const Tensor& a, const Tensor& b);

}  // namespace kimirt
