// PreNormResidual (residual.h).
#include "kimirt/model/residual.h"

namespace kimirt {

Tensor Sum(Backend& be, const Tensor& a, const Tensor& b) {
  Tensor y = be.Empty(a.shape());
  be.Add(a, b, &y);
  return y;
}

void PreNormResidual::Add(const Tensor& out) { h_ = Sum(be_, h_, out); }

}  // namespace kimirt
