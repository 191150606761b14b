// `kimirt plan --fit-layers`: the largest cut of a model — its first L layers at the real widths —
// whose heaviest GPU still fits the budget, planned with the planner's own accounting (plan.h),
// and the cut config.json that `make-checkpoint` and Model::Load read.
//
// A cut keeps what the published config says of its first L layers: their KDA/MLA kinds (the
// 1-indexed kda_layers / full_attn_layers lists filtered to 1..L), the dense first layers, every
// width, expert count and the vocabulary. The layer counts tried ("cut points") keep the
// architecture whole (docs/plan.md "Fitting layers"):
//   - L is a multiple of attn_res_block_size when the model has AttnRes (spec §8.1: blocks close
//     every `block` decoder layers, so a cut ends on a closed block);
//   - layer L is a full-attention (MLA) layer, so the cut ends where the published pattern ends a
//     KDA run with its MLA layer (K3: 3 KDA then 1 MLA, spec §1.2), keeping the 3:1 ratio;
//   - L > first_k_dense_replace, so the cut has MoE layers like the model;
//   - and always the published L itself.
// Every runtime row and every weight row grows with L, so the search walks the cut points upward
// and stops at the first that does not fit.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "kimirt/core/status.h"
#include "kimirt/model/config.h"
#include "kimirt/tools/plan.h"

namespace kimirt {

// The config.json text of `config_json`'s model cut to its first `layers` layers: the same JSON
// with num_hidden_layers and the two layer lists changed, every other field as it was. Errors
// name the problem: a config the parser refuses, `layers` outside 1..L, a cut the parser would
// refuse (e.g. fewer layers than first_k_dense_replace).
Result<std::string> CutConfigJson(std::string_view config_json, std::string_view source, int64_t layers);

// The layer counts a cut may have (see above), ascending; the last is the model's own L.
std::vector<int64_t> LayerCutPoints(const ModelConfig& config);

// The plan of the first `layers` layers: CutConfigJson → ParseModelConfig → Layout::Build →
// PlanFromLayout, the path `kimirt plan --config CUT.json` takes.
Result<PlanReport> PlanLayerCut(std::string_view config_json, std::string_view source, int64_t layers,
                                const PlanOptions& options);

struct LayerFit {
  int64_t layers = 0;        // the chosen L
  int64_t model_layers = 0;  // the published L
  std::optional<int64_t> attn_res_block;  // the config's attn_res_block_size
  std::string config_json;   // the cut config, as CutConfigJson writes it
  PlanReport plan;           // of the chosen L
  std::optional<PlanReport> next;  // of the next cut point, which does not fit (none: L is the model)
  std::vector<PlanReport> tried;   // every cut point planned, ascending (the chosen and next included)
  std::string rule;          // "whole AttnRes blocks of 12 ending on an MLA layer" (for the printout)
};

// The largest cut point whose heaviest GPU fits options.gpu's budget. Needs options.gpu. Errors:
// no GPU given; the smallest cut point already over the budget (named with its bytes and the
// budget); any error planning a cut.
Result<LayerFit> FitLayers(std::string_view config_json, std::string_view source, const PlanOptions& options);

// The chosen cut's tables (FormatPlanText), then the cut points tried and why the next one does
// not fit.
std::string FormatLayerFitText(const LayerFit& fit);
// {"fit_layers": {...}, "plan": FormatPlanJson of the chosen cut}.
std::string FormatLayerFitJson(const LayerFit& fit);

}  // namespace kimirt
