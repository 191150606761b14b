// ModuleContext: what the sub-layer modules of the decoder (kda.h, mla.h, moe.h, attn_res.h)
// run with — the config, this rank's backend and tensor-parallel group, the FFN activation —
// and the few helpers they all use, so each is written once.
#pragma once

#include <span>
#include <vector>

#include "kimirt/backend/backend.h"
#include "kimirt/model/config.h"
#include "kimirt/parallel/communicator.h"

namespace kimirt {

// Every rank's `v`, in rank order (an all-gather on the backend's memory, then a download: the
// host waits), and the smallest of them. Collective over `comm`; every rank returns the same.
// Whole numbers below 2^24 stay exact.
std::vector<float> GatherOverRanks(Communicator& comm, Backend& be, float v);
float MinOverRanks(Communicator& comm, Backend& be, float v);

struct ModuleContext {
  const ModelConfig& config;
  Backend& be;
  Communicator& comm;
  GluParams glu;  // the dense MLP's and the experts' activation (spec §1.3, §3.3; moe.h)

  // A new y [T, N] := x [T, K] · w [N, K]ᵀ.
  Tensor Linear(const Tensor& x, const Tensor& w) const;
  // New y_i := x_i · w_iᵀ for each pair, as one Backend::LinearGroup (the bits of Linear each):
  // the projections that read one input (or inputs of one row count) go out together.
  struct LinearIn {
    const Tensor& x;
    const Tensor& w;
  };
  std::vector<Tensor> LinearGroup(const std::vector<LinearIn>& in) const;
  // A new y := RMSNorm(x; w, eps) row by row (spec §3.1).
  Tensor Norm(const Tensor& x, const Tensor& w, float eps) const;
  // Sums a row-parallel output over the tensor-parallel ranks, in place (spec §11); nothing on
  // one rank.
  void AllReduce(Tensor* t) const;
  // The whole [T, tp·C] of a column-parallel output whose rank r holds columns [r·C, (r+1)·C)
  // as `local` [T, C] (an all-gather, then each rank's block into its columns: tp copies, none
  // for one row); `local` itself on one rank.
  Tensor AllGatherColumns(const Tensor& local) const;
  // Backend::PrefetchWeights for a decode step's next weights: only in calls of `rows` within the
  // decode GEMMs' range (a prefill chunk's GEMMs are compute-bound and read each weight once).
  void PrefetchForDecode(int64_t rows, std::span<const Tensor* const> weights) const;
};

}  // namespace kimirt
