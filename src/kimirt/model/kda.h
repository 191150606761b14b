// The KDA (Kimi Delta Attention) sub-layer (spec §5): projections, short convolutions, decay
// gate, the delta-rule core over each sequence's carried state, gated norm and o_proj.
#pragma once

#include <optional>

#include "kimirt/model/module_context.h"
#include "kimirt/model/sequence_state.h"
#include "kimirt/model/weights.h"

namespace kimirt {

// One KDA layer's state at the start of a sequence: zero conv windows and a zero recurrent
// state for this rank's heads (spec §5.7).
KdaLayerState NewKdaLayerState(const ModuleContext& m);

// The KDA sub-layer's output [T, D] for its normed input x [T, D] (spec §5.1–§5.6). Each
// sequence of `rows` runs on its own rows and carries its state of KDA layer `kda_layer` in
// place. `form`: the core's form (default: chunked above 64 tokens of a sequence, recurrent
// otherwise).
Tensor RunKda(const ModuleContext& m, const KdaWeights& w, const Tensor& x, int kda_layer,
              const SequenceRows& rows, std::optional<KdaForm> form);

}  // namespace kimirt
