// SequenceState (sequence_state.h): moving and releasing a sequence's latent blocks.
#include "kimirt/model/sequence_state.h"

namespace kimirt {

SequenceState& SequenceState::operator=(SequenceState&& o) noexcept {
  if (this != &o) {
    Release();
    length = o.length;
    kda = std::move(o.kda);
    blocks = std::move(o.blocks);
    kv = o.kv;
    o.blocks.clear();
    o.length = 0;
    o.kv = nullptr;
  }
  return *this;
}

void SequenceState::Release() {
  if (kv != nullptr && !blocks.empty()) kv->FreeBlocks(blocks);
  blocks.clear();
  length = 0;
}

}  // namespace kimirt
