// Layout: every tensor of the released checkpoint that a config implies — name, shape, dtype,
// the seed's accounting category, the tensor-parallel placement rule and the tensor's role — and,
// for a TP degree and rank, the slice each rank loads. One source of truth (DESIGN.md principle
// 1): the loader, the planner, the checkpoint validator and the checkpoint writer all read it.
// The tensors themselves come from the tensor table (tensor_table.h); this indexes and slices them.
//
// Spec: k3-model-spec.md §2 (names, shapes, dtypes), §11 (ATOM placement);
// k3-checkpoint-memory.md (inventory and categories that reproduce the seed's tables).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kimirt/core/dtype.h"
#include "kimirt/core/status.h"
#include "kimirt/io/safetensors.h"
#include "kimirt/model/config.h"
#include "kimirt/model/tensor_role.h"

namespace kimirt {

// The seed's weight-table rows. Vision tensors keep the row of what they are (a norm is a Norm,
// the rest Other), as the seed's full-checkpoint column counts them; Component tells them apart.
enum class Category : uint8_t {
  kDenseMlp,
  kRoutedExpert,
  kSharedExpert,
  kKdaGemm,
  kMlaGemm,
  kNorm,
  kOther,
};
inline constexpr int kNumCategories = 7;
std::string_view CategoryName(Category c);  // "Dense MLP", "Routed Expert", ...

enum class Component : uint8_t { kText, kVision };

enum class PlacementKind : uint8_t {
  kReplicated,   // every rank holds the whole tensor (ReplicatedLinear, norms)
  kColumn,       // split `dim` into tp equal, unit-aligned parts (ColumnParallelLinear: outputs)
  kRow,          // the same along the input dim (RowParallelLinear)
  kVocab,        // split dim 0 into ceil(V/tp)-row parts; the last rank's part is padded
  kHeadVector,   // the first `units` entries of `dim` are per-head values; rank r takes its heads
                 // (K3's per-head log-rates: stored padded to 128, only the first H real; §2.4)
  kExpertShard,  // MoE expert matrix: split along the intermediate dim (TP, every rank holds every
                 // expert, per-rank width padded to a multiple of pad_align), or whole experts per
                 // rank under expert parallelism
  kSkipped,      // not loaded by the text server (vision tower, projector)
};
std::string_view PlacementKindName(PlacementKind k);

struct Placement {
  PlacementKind kind = PlacementKind::kReplicated;
  int8_t dim = 0;
  // What TP divides along `dim`: heads (KDA/MLA projections), channels, vocab rows, or the
  // expert intermediate width in elements (kExpertShard). 0 = dim size.
  int64_t units = 0;
  // kExpertShard: logical elements per stored index along `dim` (1 for w1/w3 rows, 2 for packed
  // MXFP4 bytes of w2, 32 for E8M0 scales of w2).
  int32_t elems_per_index = 1;
};

struct TensorSpec {
  std::string name;
  TensorRole role = TensorRole::kSentinel;  // what the tensor is to the model (tensor_role.h)
  Shape shape;
  DType dtype = DType::kBF16;
  Category category = Category::kOther;
  Component component = Component::kText;
  Placement placement;
  int32_t layer = -1;   // decoder layer, or -1
  int32_t expert = -1;  // routed expert id, or -1
  // A loader may also accept this dtype (spec §15.3: F32 islands some exporters store as BF16).
  // Equal to `dtype` when there is no alternative.
  DType alt_dtype = DType::kBF16;

  uint64_t nbytes() const;
};

// How the ranks of one model replica divide the weights.
struct Parallelism {
  int tp = 1;         // tensor parallel degree
  int ep = 1;         // expert parallel degree: 1, or == tp (experts split by id over the TP group;
                      // the degree must divide the routed expert count)
  int pad_align = 128;  // FusedMoE per-rank intermediate padding (ATOM pad_align for Kimi, §11)
  bool load_vision = false;  // load the vision tower (replicated) instead of skipping it
  // LatentMoE's latent projections split over the TP ranks instead of replicated (the seed's and
  // ATOM's placement, spec §11): routed_expert_down_proj column-parallel (each rank its Dl / tp
  // latent rows; the latent is all-gathered), routed_expert_up_proj row-parallel (its Dl / tp
  // input columns; the output's partial sums join the shared expert's one all-reduce). At TP8
  // 103 MB a K3 MoE layer a rank becomes 13 (docs/plan.md "Weights").
  bool shard_latent_moe = false;
  // The loader widens MXFP4 experts before slicing them (CPU backend), so a slice may cut a
  // 32-element scale group; held as stored (CUDA; the planner's count), each rank's slice is
  // whole groups, ceil(G / tp) of them, the last ranks' fewer or none (SliceFor).
  bool experts_dequantized = false;
};

// One rank's part of a tensor along the placement's dim.
struct TensorSlice {
  bool loaded = true;      // false: this rank holds nothing of it (skipped, or another EP rank's expert)
  int dim = -1;            // -1: the whole tensor
  int64_t begin = 0;       // first index read from the checkpoint along `dim`
  int64_t length = 0;      // indices read from the checkpoint
  int64_t allocated = 0;   // indices held in memory (>= length: vocab and MoE padding)
  uint64_t loaded_bytes = 0;
  uint64_t allocated_bytes = 0;
};

class Layout {
 public:
  static Result<Layout> Build(const ModelConfig& config);

  const ModelConfig& config() const { return config_; }
  const std::vector<TensorSpec>& tensors() const { return tensors_; }
  size_t size() const { return tensors_.size(); }
  const TensorSpec* Find(std::string_view name) const;
  uint64_t total_bytes() const;

  // Checks that `par` can split every loaded tensor (heads divisible by tp, ...). The error names
  // the first tensor that cannot be split and why; under expert parallelism, first that the
  // model has routed experts and that ep divides their count.
  Status CheckParallelism(const Parallelism& par) const;
  // The routed experts `rank` holds whole under expert parallelism (par.ep > 1): ids
  // [first, first + count), E / ep of them. With ep == 1 every rank holds every expert (sliced).
  struct ExpertRange {
    int64_t first = 0, count = 0;
    bool contains(int64_t e) const { return e >= first && e < first + count; }
  };
  ExpertRange ExpertsOf(const Parallelism& par, int rank) const;
  // The slice of `t` that `rank` loads. Call CheckParallelism first; a split that does not
  // divide is then a programmer error.
  TensorSlice SliceFor(const TensorSpec& t, const Parallelism& par, int rank) const;
  // Where `par` places `t`: its table placement, but for the latent projections under
  // shard_latent_moe.
  static Placement PlacementOf(const TensorSpec& t, const Parallelism& par);

 private:
  Layout() = default;

  ModelConfig config_;
  std::vector<TensorSpec> tensors_;
  std::unordered_map<std::string_view, size_t> index_;
};

// The result of checking a checkpoint's headers against the layout.
struct LayoutMismatch {
  std::vector<std::string> missing;     // in the layout, not in the checkpoint
  std::vector<std::string> unexpected;  // in the checkpoint, not in the layout
  std::vector<std::string> wrong;       // "name: shape [..] BF16, expected [..] F32"
  bool ok() const { return missing.empty() && unexpected.empty() && wrong.empty(); }
  // A Status naming the first few offenders of each kind, with counts.
  Status ToStatus(std::string_view checkpoint_dir) const;
};
LayoutMismatch CheckCheckpoint(const Layout& layout, const Checkpoint& checkpoint);

}  // namespace kimirt
