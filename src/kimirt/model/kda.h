// The KDA (Kimi Delta Attention) sub-layer (spec §5): projections, short convolutions, decay
// gate, the delta-rule core over each sequence's carried state, gated norm and o_proj.
#pragma once

#include <optional>

#include "kimirt/model/module_context.h"
#include "kimirt/model/sequence_state.h"
#include "kimirt/model/weights.h"

namespace kimirt {

// One KDA layer's state pool for `slots` sequences: zero conv windows and zero recurrent states
// for this rank's heads (spec §5.7).
KdaStatePool NewKdaStatePool(const ModuleContext& m, int64_t slots);

// The KDA sub-layer's output [T, D] for its normed input x [T, D] (spec §5.1–§5.6). Each
// sequence of `rows` carries its state of KDA layer `kda_layer` in place, in its slot of the
// sequences' KdaStateSlots (one for all). A decode step (one row per sequence, recurrent form)
// runs as one Backend::KdaDecode over the batch; otherwise each sequence runs on its own rows.
// `form`: the core's form (default: chunked above 64 tokens of a sequence, recurrent
// otherwise).
Tensor RunKda(const ModuleContext& m, const KdaWeights& w, const Tensor& x, int kda_layer,
              const SequenceRows& rows, std::optional<KdaForm> form);

}  // namespace kimirt
