// The gated NoPE MLA sub-layer (spec §6): query and latent projections, the paged latent cache
// (spec §6.5), attention over it in the expanded or weight-absorbed form (spec §6.4, §6.6), the
// output gate and o_proj.
#pragma once

#include <optional>

#include "kimirt/model/module_context.h"
#include "kimirt/model/sequence_state.h"
#include "kimirt/model/weights.h"

namespace kimirt {

// The MLA sub-layer's output [T, D] for its normed input x [T, D]. Each sequence of `rows`
// appends its new tokens' latents to its cache rows of MLA layer `mla_layer` (blocks already
// reserved) and attends over all of its positions. `form`: default expanded for prefill (more
// than one token of a sequence), absorbed for decode. `paged_decode` (PagedDecode(rows, form),
// with the step already handed to the cache by SetDecodeStep): all sequences at once through
// the cache's batched decode ops, attending through the block tables.
Tensor RunMla(const ModuleContext& m, const MlaWeights& w, const Tensor& x, int mla_layer,
              const SequenceRows& rows, std::optional<MlaForm> form, bool paged_decode);

// Whether a call is a decode step for the batched paged ops: one new token per sequence, the
// absorbed form, every sequence in one cache.
bool PagedDecode(const SequenceRows& rows, std::optional<MlaForm> form);

}  // namespace kimirt
