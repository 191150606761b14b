// Indexes the tensor table of a ModelConfig (tensor_table.cpp, spec §2) and computes TP slices
// with the placement rules of spec §11. Names and shapes are checked against the released-format
// fixtures (layout_test.cpp) and the byte totals against the seed (tools/plan_test.cpp).
#include "kimirt/model/layout.h"

#include <algorithm>

#include "kimirt/core/check.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/model/tensor_role.h"
#include "kimirt/model/tensor_table.h"

namespace kimirt {
namespace {

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }
int64_t RoundUp(int64_t a, int64_t b) { return CeilDiv(a, b) * b; }

// An MXFP4 expert tensor held as stored (codes and E8M0 scales, spec §2.9): its TP slices keep
// scale groups whole. Widened experts (the CPU) may be cut anywhere.
bool KeepsMxfp4Groups(const TensorSpec& t, const Parallelism& par) {
  return !par.experts_dequantized && (IsMxfp4Codes(t.role) || IsMxfp4Scales(t.role));
}

}  // namespace

std::string_view CategoryName(Category c) {
  switch (c) {
    case Category::kDenseMlp: return "Dense MLP";
    case Category::kRoutedExpert: return "Routed Expert";
    case Category::kSharedExpert: return "Shared Expert";
    case Category::kKdaGemm: return "KDA Attention GEMM";
    case Category::kMlaGemm: return "MLA Attention GEMM";
    case Category::kNorm: return "Norm";
    case Category::kOther: return "Other";
  }
  return "?";
}

std::string_view PlacementKindName(PlacementKind k) {
  switch (k) {
    case PlacementKind::kReplicated: return "replicated";
    case PlacementKind::kColumn: return "column";
    case PlacementKind::kRow: return "row";
    case PlacementKind::kVocab: return "vocab-parallel";
    case PlacementKind::kHeadVector: return "head-sharded vector";
    case PlacementKind::kExpertShard: return "expert-intermediate";
    case PlacementKind::kSkipped: return "skipped";
  }
  return "?";
}

uint64_t TensorSpec::nbytes() const {
  return static_cast<uint64_t>(NumElements(shape)) * DTypeSize(dtype);
}

Result<Layout> Layout::Build(const ModelConfig& c) {
  Layout L;
  L.config_ = c;
  L.tensors_ = BuildTensorTable(c);

  // A config's sizes are each capped (config.cpp), but their products are not: refuse tensors
  // past 2^44 elements (16 T; K3's largest has 1.2 G) so byte counts never overflow.
  for (const TensorSpec& t : L.tensors_) {
    int64_t n = 1;
    for (int64_t d : t.shape) {
      if (d < 0 || __builtin_mul_overflow(n, d, &n) || n > (int64_t{1} << 44)) {
        return InvalidArgument("config implies tensor " + t.name + " of shape " + ShapeToString(t.shape) +
                               ", too large to be a real checkpoint tensor");
      }
    }
  }
  L.index_.reserve(L.tensors_.size());
  for (size_t k = 0; k < L.tensors_.size(); ++k) {
    if (!L.index_.emplace(L.tensors_[k].name, k).second) {
      return Internal("layout names tensor " + L.tensors_[k].name + " twice");
    }
  }
  return L;
}

const TensorSpec* Layout::Find(std::string_view name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

uint64_t Layout::total_bytes() const {
  uint64_t n = 0;
  for (const TensorSpec& t : tensors_) n += t.nbytes();
  return n;
}

Status Layout::CheckParallelism(const Parallelism& par) const {
  if (par.tp < 1) return InvalidArgument("tensor-parallel degree must be >= 1, got " + std::to_string(par.tp));
  if (par.ep != 1 && par.ep != par.tp) {
    return Unsupported("expert parallelism must be 1 or equal to the TP degree (" +
                       std::to_string(par.tp) + "), got " + std::to_string(par.ep));
  }
  if (par.ep > 1) {
    // Expert parallelism places whole experts, E / ep on each rank (spec §11; vLLM's
    // --enable-expert-parallel): there must be routed experts, and as many on every rank.
    const int64_t E = config_.num_experts;
    if (config_.NumMoeLayers() == 0) {
      return InvalidArgument("expert parallelism over " + std::to_string(par.ep) +
                             " ranks needs routed experts, and this model has none (its " +
                             std::to_string(config_.num_hidden_layers) + " layers are all dense MLPs)");
    }
    if (E % par.ep != 0) {
      return InvalidArgument("expert parallelism over " + std::to_string(par.ep) + " ranks: the " +
                             std::to_string(E) + " routed experts do not split evenly (" + std::to_string(E) +
                             " % " + std::to_string(par.ep) + " = " + std::to_string(E % par.ep) +
                             "); use a TP degree that divides " + std::to_string(E));
    }
  }
  if (par.pad_align < 1 || par.pad_align % 32 != 0) {
    return InvalidArgument("MoE pad_align must be a positive multiple of 32, got " +
                           std::to_string(par.pad_align));
  }
  for (const TensorSpec& t : tensors_) {
    const Placement p = PlacementOf(t, par);
    const int64_t size = p.kind == PlacementKind::kReplicated || p.kind == PlacementKind::kSkipped
                             ? 0
                             : t.shape[static_cast<size_t>(p.dim)];
    const int64_t units = p.units == 0 ? size : p.units;
    switch (p.kind) {
      case PlacementKind::kColumn:
      case PlacementKind::kRow:
      case PlacementKind::kHeadVector:
        if (units % par.tp != 0) {
          return InvalidArgument(t.name + ": " + std::to_string(units) + " " +
                                 (units == size ? "rows" : "heads") + " along dim " +
                                 std::to_string(p.dim) + " do not split over TP " +
                                 std::to_string(par.tp));
        }
        break;
      case PlacementKind::kExpertShard: {
        if (par.ep > 1) break;
        if (units % par.tp != 0) {
          return InvalidArgument(t.name + ": expert intermediate " + std::to_string(units) +
                                 " does not split over TP " + std::to_string(par.tp));
        }
        break;
      }
      default:
        break;
    }
  }
  return Status::Ok();
}

Placement Layout::PlacementOf(const TensorSpec& t, const Parallelism& par) {
  if (par.shard_latent_moe && t.role == TensorRole::kLatentDown) return {PlacementKind::kColumn, 0};
  if (par.shard_latent_moe && t.role == TensorRole::kLatentUp) return {PlacementKind::kRow, 1};
  return t.placement;
}

TensorSlice Layout::SliceFor(const TensorSpec& t, const Parallelism& par, int rank) const {
  TensorSlice s;
  const Placement p = PlacementOf(t, par);
  const uint64_t total = t.nbytes();
  auto whole = [&] {
    s.dim = -1;
    s.loaded_bytes = s.allocated_bytes = total;
    return s;
  };
  if (p.kind == PlacementKind::kSkipped) {
    if (par.load_vision) return whole();
    s.loaded = false;
    return s;
  }
  if (p.kind == PlacementKind::kReplicated || par.tp == 1) return whole();

  const int64_t size = t.shape[static_cast<size_t>(p.dim)];
  const int64_t units = p.units == 0 ? size : p.units;
  // Bytes of one index along `dim`.
  const uint64_t per_index = size == 0 ? 0 : total / static_cast<uint64_t>(size);
  s.dim = p.dim;
  switch (p.kind) {
    case PlacementKind::kColumn:
    case PlacementKind::kRow: {
      KIMIRT_CHECK(units % par.tp == 0);
      const int64_t per = size / par.tp;
      s.begin = rank * per;
      s.length = s.allocated = per;
      break;
    }
    case PlacementKind::kVocab: {
      const int64_t per = CeilDiv(size, par.tp);
      s.begin = std::min<int64_t>(rank * per, size);
      s.length = std::min<int64_t>(per, size - s.begin);
      s.allocated = per;
      break;
    }
    case PlacementKind::kHeadVector: {
      KIMIRT_CHECK(units % par.tp == 0);
      // Only the first `units` entries are real (the rest is padding, spec §2.4).
      const int64_t per = units / par.tp;
      s.begin = rank * per;
      s.length = s.allocated = per;
      break;
    }
    case PlacementKind::kExpertShard: {
      if (par.ep > 1) {
        if (!ExpertsOf(par, rank).contains(t.expert)) {
          s.loaded = false;
          s.dim = -1;
          return s;
        }
        return whole();
      }
      KIMIRT_CHECK(units % par.tp == 0);
      int64_t elems = units / par.tp, begin = rank * elems, length = elems;
      if (KeepsMxfp4Groups(t, par)) {
        // Whole 32-element scale groups a rank (docs/distributed.md "MXFP4 experts under TP"):
        // ceil(G / tp) each, the last ranks fewer or none, so a rank never holds part of a group
        // whose scale byte another also needs. Where 32 · tp divides the width, the even split.
        elems = CeilDiv(units, kMxfp4GroupSize * par.tp) * kMxfp4GroupSize;
        begin = std::min<int64_t>(rank * elems, units);
        length = std::min<int64_t>(elems, units - begin);
      }
      const int64_t padded = RoundUp(elems, par.pad_align);
      s.begin = begin / p.elems_per_index;
      s.length = length / p.elems_per_index;
      s.allocated = padded / p.elems_per_index;
      break;
    }
    default:
      return whole();
  }
  s.loaded_bytes = per_index * static_cast<uint64_t>(s.length);
  s.allocated_bytes = per_index * static_cast<uint64_t>(s.allocated);
  return s;
}

Layout::ExpertRange Layout::ExpertsOf(const Parallelism& par, int rank) const {
  if (par.ep <= 1) return {0, config_.num_experts};
  const int64_t per_rank = CeilDiv(config_.num_experts, par.ep);  // exact once CheckParallelism passed
  const int64_t first = std::min<int64_t>(rank * per_rank, config_.num_experts);
  return {first, std::min<int64_t>(per_rank, config_.num_experts - first)};
}

Status LayoutMismatch::ToStatus(std::string_view checkpoint_dir) const {
  if (ok()) return Status::Ok();
  std::string msg = std::string(checkpoint_dir) + " does not match its config:";
  auto list = [&msg](const std::vector<std::string>& v, const char* what) {
    if (v.empty()) return;
    msg += " " + std::to_string(v.size()) + " " + what + " (";
    for (size_t i = 0; i < v.size() && i < 3; ++i) msg += (i ? "; " : "") + v[i];
    if (v.size() > 3) msg += "; ...";
    msg += ")";
  };
  list(missing, "missing");
  list(unexpected, "unexpected");
  list(wrong, "mis-shaped or mis-typed");
  return Corrupt(msg);
}

LayoutMismatch CheckCheckpoint(const Layout& layout, const Checkpoint& ckpt) {
  LayoutMismatch m;
  for (const TensorSpec& t : layout.tensors()) {
    const Checkpoint::Entry* e = ckpt.Find(t.name);
    if (e == nullptr) {
      m.missing.push_back(t.name);
      continue;
    }
    const TensorInfo& info = *e->info;
    if (info.shape != t.shape || (info.dtype != t.dtype && info.dtype != t.alt_dtype)) {
      m.wrong.push_back(t.name + " is " + ShapeToString(info.shape) + " " +
                        std::string(DTypeName(info.dtype)) + ", expected " + ShapeToString(t.shape) +
                        " " + std::string(DTypeName(t.dtype)));
    }
  }
  for (const Checkpoint::Entry& e : ckpt.entries()) {
    if (layout.Find(e.info->name) == nullptr) m.unexpected.push_back(e.info->name);
  }
  return m;
}

}  // namespace kimirt
