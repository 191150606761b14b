// Layer fitting (see plan_fit.h): cut the published config.json to its first L layers, plan each
// cut point with the planner as `kimirt plan --config CUT.json` would, keep the largest that fits.
#include "kimirt/tools/plan_fit.h"

#include <cstdio>

#include <nlohmann/json.hpp>

#include "kimirt/model/layout.h"

namespace kimirt {
namespace {

using OrderedJson = nlohmann::ordered_json;

std::string PadLeft(std::string s, size_t w) {
  if (s.size() < w) s.insert(0, w - s.size(), ' ');
  return s;
}

// "27 KDA + 9 MLA, 3 AttnRes blocks of 12"
std::string Composition(const PlanReport& p, const std::optional<int64_t>& block) {
  std::string s = std::to_string(p.kda_layers) + " KDA + " + std::to_string(p.mla_layers) + " MLA";
  if (block) {
    const int64_t whole = p.layers / *block;
    s += ", " + std::to_string(whole) + " AttnRes block" + (whole == 1 ? "" : "s") + " of " +
         std::to_string(*block);
    if (p.layers % *block != 0) s += " + " + std::to_string(p.layers % *block) + " layers";
  }
  return s;
}

std::string Deployment(const PlanReport& p) {
  const PlanOptions& o = p.options;
  std::string s = std::to_string(o.par.tp * o.pp) + " × " + p.gpu->name + " (TP" + std::to_string(o.par.tp);
  if (o.pp > 1) s += " × PP" + std::to_string(o.pp);
  if (o.par.ep > 1) s += ", EP" + std::to_string(o.par.ep);
  return s + ")";
}

std::string BudgetText(const PlanReport& p) {
  char util[32];
  std::snprintf(util, sizeof(util), "%.2f", p.options.gpu_memory_utilization);
  return FormatPlanGiB(p.budget_bytes) + " (--gpu-memory-utilization " + util + " × " +
         FormatPlanGiB(p.gpu->capacity_bytes) + ")";
}

}  // namespace

Result<std::string> CutConfigJson(std::string_view config_json, std::string_view source, int64_t layers) {
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(config_json, source));
  if (layers < 1 || layers > c.num_hidden_layers) {
    return InvalidArgument(std::string(source) + ": cannot cut to " + std::to_string(layers) +
                           " layers: the model has " + std::to_string(c.num_hidden_layers) +
                           " (a cut keeps layers 1..L, 1 <= L <= " + std::to_string(c.num_hidden_layers) + ")");
  }
  OrderedJson root = OrderedJson::parse(config_json, nullptr, /*allow_exceptions=*/false);
  // The parser accepted it, so the text part is where ModelConfig says and its lists are arrays.
  OrderedJson& text = c.multimodal_wrapper ? root["text_config"] : root;
  text["num_hidden_layers"] = layers;
  OrderedJson& la = text["linear_attn_config"];
  for (const char* key : {"kda_layers", "full_attn_layers"}) {
    OrderedJson kept = OrderedJson::array();
    for (const OrderedJson& x : la[key]) {
      if (x.get<double>() <= static_cast<double>(layers)) kept.push_back(x);
    }
    la[key] = std::move(kept);
  }
  std::string out = root.dump(2) + "\n";
  // The cut must still be a config every reader takes (e.g. first_k_dense_replace <= L).
  const std::string cut_source = std::string(source) + " cut to " + std::to_string(layers) + " layers";
  KIMIRT_RETURN_IF_ERROR(ParseModelConfig(out, cut_source).status());
  return out;
}

std::vector<int64_t> LayerCutPoints(const ModelConfig& c) {
  std::vector<int64_t> points;
  for (int64_t l = 1; l < c.num_hidden_layers; ++l) {
    if (c.attn_res_block_size && l % *c.attn_res_block_size != 0) continue;  // whole AttnRes blocks
    if (c.IsKdaLayer(l - 1)) continue;         // ends on an MLA layer (1-indexed l)
    if (l <= c.first_k_dense_replace) continue;  // keeps MoE layers after the dense ones
    points.push_back(l);
  }
  points.push_back(c.num_hidden_layers);
  return points;
}

Result<PlanReport> PlanLayerCut(std::string_view config_json, std::string_view source, int64_t layers,
                                const PlanOptions& options) {
  KIMIRT_ASSIGN_OR_RETURN(std::string cut, CutConfigJson(config_json, source, layers));
  const std::string cut_source = std::string(source) + " cut to " + std::to_string(layers) + " layers";
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(cut, cut_source));
  KIMIRT_ASSIGN_OR_RETURN(Layout layout, Layout::Build(c));
  return PlanFromLayout(layout, options, cut_source);
}

Result<LayerFit> FitLayers(std::string_view config_json, std::string_view source, const PlanOptions& options) {
  if (!options.gpu) {
    return InvalidArgument("fitting layers needs a GPU to fit: give --gpu NAME or --gpu-mem-gib X");
  }
  KIMIRT_ASSIGN_OR_RETURN(ModelConfig c, ParseModelConfig(config_json, source));
  PlanOptions o = options;
  o.suggest = false;  // a cut that does not fit is the answer, not a question for more GPUs

  LayerFit fit;
  fit.model_layers = c.num_hidden_layers;
  fit.attn_res_block = c.attn_res_block_size;
  if (c.attn_res_block_size) {
    fit.rule = "whole AttnRes blocks of " + std::to_string(*c.attn_res_block_size) + " layers ending on an MLA layer";
  } else {
    fit.rule = "cuts ending on an MLA layer";
  }
  if (c.first_k_dense_replace > 0) {
    fit.rule += ", past the " + std::to_string(c.first_k_dense_replace) + " dense layer" +
                (c.first_k_dense_replace == 1 ? "" : "s");
  }
  fit.rule += ", and the whole model";

  for (int64_t l : LayerCutPoints(c)) {
    if (l < o.pp) continue;  // every pipeline stage needs a layer
    KIMIRT_ASSIGN_OR_RETURN(PlanReport p, PlanLayerCut(config_json, source, l, o));
    fit.tried.push_back(p);
    if (!p.fits) {
      fit.next = std::move(p);
      break;
    }
  }
  if (fit.tried.empty()) {
    return InvalidArgument(std::string(source) + ": no cut of its " + std::to_string(c.num_hidden_layers) +
                           " layers (" + fit.rule + ") has a layer for each of the " + std::to_string(o.pp) +
                           " pipeline stages");
  }
  if (!fit.tried.front().fits) {
    const PlanReport& p = fit.tried.front();
    const StagePlan& h = p.heaviest();
    return ResourceExhausted(
        std::string(source) + ": even the smallest cut, " + std::to_string(p.layers) + " layers (" +
        Composition(p, c.attn_res_block_size) + "; cut points: " + fit.rule + "), does not fit " +
        Deployment(p) + ": the heaviest GPU needs " + FormatPlanGiB(h.total()) + " (weights " +
        FormatPlanGiB(h.weights) + " + context " + FormatPlanGiB(h.runtime_bytes) + "), over the budget of " +
        BudgetText(p) + "; give more GPUs, a shorter --max-model-len or fewer --max-num-seqs");
  }
  fit.plan = fit.next ? fit.tried[fit.tried.size() - 2] : fit.tried.back();
  fit.layers = fit.plan.layers;
  KIMIRT_ASSIGN_OR_RETURN(fit.config_json, CutConfigJson(config_json, source, fit.layers));
  return fit;
}

std::string FormatLayerFitText(const LayerFit& fit) {
  const PlanReport& p = fit.plan;
  std::string s = FormatPlanText(p);
  s += "\nLayer fit: the most of the model's " + std::to_string(fit.model_layers) + " layers that fit " +
       Deployment(p) + ", budget " + BudgetText(p) + " per GPU\n";
  s += "  cut points: " + fit.rule + "\n";
  s += "  " + PadLeft("Layers", 6) + PadLeft("KDA", 5) + PadLeft("MLA", 5) + PadLeft("Weights/GPU", 15) +
       PadLeft("Context/GPU", 15) + PadLeft("Known total", 15) + "   Verdict\n";
  for (const PlanReport& t : fit.tried) {
    const StagePlan& h = t.heaviest();
    s += "  " + PadLeft(std::to_string(t.layers), 6) + PadLeft(std::to_string(t.kda_layers), 5) +
         PadLeft(std::to_string(t.mla_layers), 5) + PadLeft(FormatPlanGiB(h.weights), 15) +
         PadLeft(FormatPlanGiB(h.runtime_bytes), 15) + PadLeft(FormatPlanGiB(h.total()), 15) + "   " +
         (t.fits ? "fits, " + FormatPlanGiB(t.budget_bytes - h.total()) + " under the budget"
                 : "DOES NOT FIT, " + FormatPlanGiB(h.total() - t.budget_bytes) + " over the budget") +
         "\n";
  }
  if (fit.layers == fit.model_layers) {
    s += "Chosen: all " + std::to_string(fit.layers) + " layers: the whole model fits, nothing to cut\n";
    return s;
  }
  s += "Chosen: " + std::to_string(fit.layers) + " layers (" + Composition(p, fit.attn_res_block) + "), layers 1-" +
       std::to_string(fit.layers) + " of the published " + std::to_string(fit.model_layers) + "\n";
  if (fit.next) {
    const PlanReport& n = *fit.next;
    const StagePlan& a = p.heaviest();
    const StagePlan& b = n.heaviest();
    const uint64_t kv_a = a.runtime.empty() ? 0 : a.runtime[0].bytes;
    const uint64_t kv_b = b.runtime.empty() ? 0 : b.runtime[0].bytes;
    s += "Why not " + std::to_string(n.layers) + ": its heaviest GPU would need " + FormatPlanGiB(b.total()) +
         " (weights " + FormatPlanGiB(b.weights) + " + context " + FormatPlanGiB(b.runtime_bytes) + "), " +
         FormatPlanGiB(b.total() - n.budget_bytes) + " over the budget; its " +
         std::to_string(n.layers - p.layers) + " more layers (" + std::to_string(n.kda_layers - p.kda_layers) +
         " KDA + " + std::to_string(n.mla_layers - p.mla_layers) + " MLA) add " +
         FormatPlanGiB(b.weights - a.weights) + " of weights and " + FormatPlanGiB(kv_b - kv_a) +
         " of latent KV (" + FormatPlanCount(p.options.num_seqs) + " × " + FormatPlanCount(p.options.context_tokens) +
         " tokens)\n";
  }
  return s;
}

std::string FormatLayerFitJson(const LayerFit& fit) {
  OrderedJson tried = OrderedJson::array();
  for (const PlanReport& t : fit.tried) {
    const StagePlan& h = t.heaviest();
    tried.push_back({{"layers", t.layers},
                     {"kda_layers", t.kda_layers},
                     {"mla_layers", t.mla_layers},
                     {"per_gpu_weights_bytes", h.weights},
                     {"per_gpu_runtime_bytes", h.runtime_bytes},
                     {"per_gpu_total_bytes", h.total()},
                     {"budget_bytes", t.budget_bytes},
                     {"fits", t.fits}});
  }
  OrderedJson j;
  j["fit_layers"] = {{"layers", fit.layers},
                     {"model_layers", fit.model_layers},
                     {"cut_points", fit.rule},
                     {"next_layers", fit.next ? OrderedJson(fit.next->layers) : OrderedJson(nullptr)},
                     {"tried", tried}};
  j["plan"] = OrderedJson::parse(FormatPlanJson(fit.plan));
  return j.dump(2) + "\n";
}

}  // namespace kimirt
