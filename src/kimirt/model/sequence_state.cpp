// SequenceState (sequence_state.h): moving and releasing a sequence's latent blocks and KDA slot.
#include "kimirt/model/sequence_state.h"

namespace kimirt {

SequenceState& SequenceState::operator=(SequenceState&& o) noexcept {
  if (this != &o) {
    Release();
    length = o.length;
    kda = o.kda;
    kda_slot = o.kda_slot;
    blocks = std::move(o.blocks);
    kv = o.kv;
    o.blocks.clear();
    o.length = 0;
    o.kv = nullptr;
    o.kda = nullptr;
    o.kda_slot = -1;
  }
  return *this;
}

void SequenceState::Release() {
  if (kv != nullptr && !blocks.empty()) kv->FreeBlocks(blocks);
  blocks.clear();
  if (kda != nullptr && kda_slot >= 0) kda->Release(kda_slot);
  kda_slot = -1;
  length = 0;
}

}  // namespace kimirt
