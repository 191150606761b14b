// PreNormResidual (residual.h).
#include "kimirt/model/residual.h"

namespace kimirt {

Tensor Sum(Backend& be, const Tensor& a, const Tensor& b) {
  Tensor y = be.Empty(a.shape());
  be.Add(a, b, &y);
  return y;
}

void PreNormResidual::Add(const Tensor& out) { h_ = Sum(be_, h_, out); }

// Every norm reads h: the new h and its norm in one call.
Tensor PreNormResidual::AddThenNorm(const Tensor& out, const Tensor& w, float eps,
                                    const std::function<Tensor()>& /*next*/) {
  Tensor h = be_.Empty(h_.shape()), y = be_.Empty(h_.shape());
  be_.AddRmsNorm(h_, out, w, eps, &h, &y);
  h_ = h;
  return y;
}

}  // namespace kimirt
