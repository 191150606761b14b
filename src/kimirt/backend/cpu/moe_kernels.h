// CPU reference kernels of the FFN (spec §3.3, §7.1, §7.2), in FP32: the GLU of the dense MLP
// and the experts, the MoE router and the routed experts. The CPU backend (cpu_backend.cpp)
// calls them with its host tensors; they are the Backend ops of the same names (backend.h), and
// what the CUDA kernels (cuda/moe_kernels.cu) are checked against.
#pragma once

#include "kimirt/backend/backend.h"

namespace kimirt::cpu {

// y [T, I] = GLU(gate [T, I], up [T, I]) (spec §3.3).
void Glu(const Tensor& gate, const Tensor& up, const GluParams& p, Tensor* y);

// Router (spec §7.2 step 1, FP32): y [T, D], w [E, D], bias [E] → idx [T, k] (I32),
// weights [T, k] (F32), in top-k order; ties go to the lower expert id.
void MoeRoute(const Tensor& y, const Tensor& w, const Tensor& bias, const RouteParams& p, Tensor* idx,
              Tensor* weights);

// Routed experts (spec §7.2 steps 3-4): out [T, D_e] = Σ_j weights[t,j] · expert_{idx[t,j]}(z[t]).
void MoeExperts(const Tensor& z, const Tensor& idx, const Tensor& weights, const ExpertWeights& ex,
                const GluParams& p, Tensor* out);

}  // namespace kimirt::cpu
