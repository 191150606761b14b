// SequenceState: everything one sequence carries between forward calls (spec §9), and
// SequenceRows, how the sequences of one call share the rows of its activations.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "kimirt/backend/tensor.h"
#include "kimirt/model/kda_state_slots.h"
#include "kimirt/model/latent_kv_cache.h"

namespace kimirt {

// Everything a sequence carries between forward calls (spec §9): a slot in a KdaStateSlots (its
// KDA conv windows and recurrent states, the same slot in every KDA layer), and the block table
// of its MLA latents in a LatentKvCache. Move-only; its blocks and its slot go back when it is
// destroyed or Release()d. Not shareable across threads.
class SequenceState {
 public:
  SequenceState() = default;
  SequenceState(SequenceState&& o) noexcept { *this = std::move(o); }
  SequenceState& operator=(SequenceState&& o) noexcept;
  SequenceState(const SequenceState&) = delete;
  SequenceState& operator=(const SequenceState&) = delete;
  ~SequenceState() { Release(); }
  // Frees the latent blocks and the KDA slot and forgets the tokens.
  void Release();

  int64_t length = 0;              // tokens already processed
  KdaStateSlots* kda = nullptr;    // where the KDA state lives; not owned
  int32_t kda_slot = -1;           // this sequence's slot in `kda`
  std::vector<int32_t> blocks;     // latent block table (all MLA layers share it)
  LatentKvCache* kv = nullptr;     // where the blocks live; not owned
};

// The sequences of a forward call and their rows of the activations: one sequence owning all T
// rows (Model::Forward), or B sequences owning one row each (Model::ForwardDecode). Per-token
// ops run on all rows at once; KDA and MLA take the whole batch when every sequence has one row
// (decode: Backend::KdaDecode, KvStorage::AttendDecode), else run per sequence on its rows.
struct SequenceRows {
  std::span<SequenceState* const> seqs;
  int64_t T = 0;
  int64_t count(size_t /*b*/) const { return seqs.size() == 1 ? T : 1; }
  int64_t begin(size_t b) const { return seqs.size() == 1 ? 0 : static_cast<int64_t>(b); }
};

}  // namespace kimirt
