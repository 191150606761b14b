// SequenceState: everything one sequence carries between forward calls (spec §9), and
// SequenceRows, how the sequences of one call share the rows of its activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kimirt/backend/tensor.h"
#include "kimirt/model/latent_kv_cache.h"

namespace kimirt {

struct KdaLayerState {
  Tensor conv_q, conv_k, conv_v;  // [W-1, P_l] the last W-1 pre-conv projections (spec §5.7)
  Tensor recurrent;               // [H_l, K, K] FP32 state S (spec §5.4)
};

// Everything a sequence carries between forward calls (spec §9): KDA conv windows and
// recurrent states, and the block table of its MLA latents in a LatentKvCache. Move-only; its
// blocks go back to the cache when it is destroyed or Release()d. Not shareable across threads.
class SequenceState {
 public:
  SequenceState() = default;
  SequenceState(SequenceState&& o) noexcept { *this = std::move(o); }
  SequenceState& operator=(SequenceState&& o) noexcept;
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;
  ~SequenceState() { Release(); }
  // Frees the latent blocks and forgets the tokens (KDA state is left for the owner to reset).
  void Release();

  int64_t length = 0;              // tokens already processed
  std::vector<KdaLayerState> kda;  // one per KDA layer, in layer order
  std::vector<int32_t> blocks;     // latent block table (all MLA layers share it)
  LatentKvCache* kv = nullptr;     // where the blocks live; not owned
};

// The sequences of a forward call and their rows of the activations: one sequence owning all T
// rows (Model::Forward), or B sequences owning one row each (Model::ForwardDecode). Per-token
// ops run on all rows at once; KDA and MLA run per sequence on its rows.
struct SequenceRows {
  std::span<SequenceState* const> seqs;
  int64_t T = 0;
  int64_t count(size_t /*b*/) const { return seqs.size() == 1 ? T : 1; }
  int64_t begin(size_t b) const { return seqs.size() == 1 ? 0 : static_cast<int64_t>(b); }
};

}  // namespace kimirt
