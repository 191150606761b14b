// ModuleContext helpers (module_context.h).
#include "kimirt/model/module_context.h"

#include <algorithm>

namespace kimirt {

std::vector<float> GatherOverRanks(Communicator& comm, Backend& be, float v) {
  if (comm.size() == 1) return {v};
  Tensor mine = Tensor::Host({1});
  mine.f32()[0] = v;
  const Tensor send = be.Upload(mine);
  Tensor all = be.Empty({comm.size()});
  comm.AllGather(static_cast<const float*>(send.raw()), 1, static_cast<float*>(all.raw()));
  const Tensor got = be.Download(all);
  return std::vector<float>(got.f32(), got.f32() + comm.size());
}

float MinOverRanks(Communicator& comm, Backend& be, float v) {
  const std::vector<float> all = GatherOverRanks(comm, be, v);
  return *std::min_element(all.begin(), all.end());
}

Tensor ModuleContext::Linear(const Tensor& x, const Tensor& w) const {
  Tensor y = be.Empty({x.dim(0), w.dim(0)});
  be.Linear(x, w, &y);
  return y;
}

std::vector<Tensor> ModuleContext::LinearGroup(const std::vector<LinearIn>& in) const {
  std::vector<Tensor> y;
  y.reserve(in.size());  // the problems point into y: no reallocation
  std::vector<Backend::LinearProblem> problems;
  for (const LinearIn& p : in) {
    y.push_back(be.Empty({p.x.dim(0), p.w.dim(0)}));
    problems.push_back({&p.x, &p.w, &y.back()});
  }
  be.LinearGroup(problems);
  return y;
}

Tensor ModuleContext::Norm(const Tensor& x, const Tensor& w, float eps) const {
  Tensor y = be.Empty(x.shape());
  be.RmsNorm(x, w, eps, &y);
  return y;
}

void ModuleContext::PrefetchForDecode(int64_t rows, std::span<const Tensor* const> weights) const {
  if (rows <= be.RowInvariantRows()) be.PrefetchWeights(weights);
}

void ModuleContext::AllReduce(Tensor* t) const {
  if (comm.size() > 1) comm.AllReduceSum(static_cast<float*>(t->raw()), static_cast<size_t>(t->numel()));
}

Tensor ModuleContext::AllGatherColumns(const Tensor& local) const {
  const int tp = comm.size();
  if (tp == 1) return local;
  const int64_t T = local.dim(0), C = local.dim(1);
  Tensor blocks = be.Empty({tp * T, C});  // rank r's [T, C] at rows r·T
  comm.AllGather(static_cast<const float*>(local.raw()), static_cast<size_t>(T * C), static_cast<float*>(blocks.raw()));
  // One row (a batch-1 decode step): the blocks already lie as the row's columns, no copy.
  if (T == 1) return blocks.Reshape({1, tp * C});
  Tensor all = be.Empty({T, tp * C});
  for (int r = 0; r < tp; ++r) be.CopyColumnsTo(blocks.Rows(r * T, T), r * C, &all);
  return all;
}

}  // namespace kimirt
