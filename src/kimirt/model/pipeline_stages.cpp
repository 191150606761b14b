// Pipeline stages (pipeline_stages.h).
#include "kimirt/model/pipeline_stages.h"

#include <algorithm>
#include <string>

#include "kimirt/core/check.h"

namespace kimirt {

Status CheckPipelineDegree(int64_t layers, int pp) {
  if (pp < 1 || pp > layers) {
    return InvalidArgument("-pp " + std::to_string(pp) + ": must be between 1 and the " + std::to_string(layers) +
                           " layers (each pipeline stage holds at least one layer)");
  }
  return Status::Ok();
}

std::vector<PipelineStage> PipelineStages(int64_t layers, int pp) {
  std::vector<int64_t> n(static_cast<size_t>(pp), layers / pp);
  const int64_t rem = layers % pp;
  for (int64_t i = 2; i < rem + 2; ++i) n[static_cast<size_t>(pp - i)] += 1;
  std::vector<PipelineStage> out;
  int64_t start = 0;
  for (int s = 0; s < pp; ++s) {
    out.push_back(PipelineStage{s, pp, start, start + n[static_cast<size_t>(s)]});
    start += n[static_cast<size_t>(s)];
  }
  return out;
}

int StageOfTensor(const TensorSpec& t, const std::vector<PipelineStage>& stages) {
  if (t.layer >= 0) {
    for (const PipelineStage& s : stages) {
      if (s.holds_layer(t.layer)) return s.stage;
    }
  }
  if (t.component == Component::kVision || t.role == TensorRole::kEmbed) return 0;
  return static_cast<int>(stages.size()) - 1;
}

bool StageLoads(const PipelineStage& stage, const TensorSpec& t, const std::vector<PipelineStage>& stages,
                bool tie_word_embeddings) {
  if (StageOfTensor(t, stages) == stage.stage) return true;
  return tie_word_embeddings && t.role == TensorRole::kEmbed && stage.is_last();
}

std::vector<int64_t> MicroBatchRows(int64_t rows, int64_t row_invariant_rows, int64_t wanted) {
  KIMIRT_CHECK(rows >= 1 && row_invariant_rows >= 1);
  const int64_t n = std::max((rows + row_invariant_rows - 1) / row_invariant_rows, std::clamp<int64_t>(wanted, 1, rows));
  std::vector<int64_t> sizes(static_cast<size_t>(n), rows / n);
  for (int64_t i = 0; i < rows % n; ++i) sizes[static_cast<size_t>(i)] += 1;
  return sizes;
}

}  // namespace kimirt
