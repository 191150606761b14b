// Pipeline stages (-pp M; docs/distributed.md "Pipeline parallelism"): which decoder layers and
// which model-level tensors each stage holds. One rule for `kimirt plan` (per-stage bytes), the
// loader (each rank reads only its stage's tensors) and the model (each rank runs only its
// stage's layers).
//
// The rule is vLLM's get_pp_indices: equal shares of the layers, the remainder going one each to
// the stages before the last, counting backwards (93 layers over 7 stages: 13, 13, 13, 13, 14,
// 14, 13). It does not align stages to AttnRes blocks (spec §8.1) and need not: what crosses a
// stage boundary is the whole residual state after a layer (the closed blocks and the open
// block's partial sum, attn_res.h), which is exact wherever the cut falls.
#pragma once

#include <cstdint>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/model/layout.h"

namespace kimirt {

struct PipelineStage {
  int stage = 0;
  int pp = 1;
  int64_t first_layer = 0;  // the stage's layers: [first_layer, end_layer)
  int64_t end_layer = 0;
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage == pp - 1; }
  bool holds_layer(int64_t layer) const { return layer >= first_layer && layer < end_layer; }
  int64_t num_layers() const { return end_layer - first_layer; }
};

// pp must be in [1, layers]: an error naming both otherwise.
Status CheckPipelineDegree(int64_t layers, int pp);
// The stages of `layers` decoder layers over `pp` stages (CheckPipelineDegree first).
std::vector<PipelineStage> PipelineStages(int64_t layers, int pp);
// Which stage holds a tensor: its layer's; the embedding (and the vision tower) the first; the
// final norm, the output AttnRes site and the head the last.
int StageOfTensor(const TensorSpec& t, const std::vector<PipelineStage>& stages);
// Whether `stage` loads `t`: its own tensors, and with tied embeddings the last stage the
// embedding too (it is the head).
bool StageLoads(const PipelineStage& stage, const TensorSpec& t, const std::vector<PipelineStage>& stages,
                bool tie_word_embeddings);

// How a decode step of `rows` sequences splits into micro-batches that flow through the stages
// one after another (docs/distributed.md "Micro-batches in flight"): the row counts, in order.
// `wanted` micro-batches (at most one per row), and always enough that none has more than
// `row_invariant_rows` rows (Backend::RowInvariantRows: a row's bits are then its own whichever
// micro-batch it lands in); as equal as they can be, the larger first. A function of the three
// counts alone, so every rank splits a step alike.
std::vector<int64_t> MicroBatchRows(int64_t rows, int64_t row_invariant_rows, int64_t wanted);

}  // namespace kimirt
