// KdaStateSlots: the KDA state of every sequence of one model replica on one rank, by slot
// (spec §5.7, §9). One pool per KDA layer (backend.h KdaStatePool: conv windows [slots, W-1,
// P_l], recurrent states [slots, H, K, K]); a sequence holds one slot, the same in every layer,
// so a batched op reads row b's state at slots[b] (Backend::KdaDecode). The engine's state
// slots (max_num_seqs) are these.
//
// Acquire() hands out a zeroed slot; when none is free the pools grow (doubling, keeping every
// held slot's state), so a caller never fails for want of a slot. Growing reallocates: hold
// slot numbers, never tensors of a pool across calls.
//
// Thread safety: none; the owner of the sequences (the engine's step loop) uses it.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "kimirt/backend/backend.h"

namespace kimirt {

class KdaStateSlots {
 public:
  // `make(slots)` returns the layers' pools for `slots` sequences, all zeros.
  using MakePools = std::function<std::vector<KdaStatePool>(int64_t slots)>;
  KdaStateSlots(Backend& be, MakePools make, int64_t initial_slots);

  int num_layers() const { return static_cast<int>(pools_.size()); }
  int64_t capacity() const { return capacity_; }
  int64_t free_slots() const { return static_cast<int64_t>(free_.size()); }
  KdaStatePool& layer(int kda_layer) { return pools_[static_cast<size_t>(kda_layer)]; }

  // A slot whose state is all zeros (a new sequence's, spec §9).
  int32_t Acquire();
  void Release(int32_t slot);

  // A copy of one slot's state in every layer (one-slot pools of their own, never aliasing the
  // pools, which the forward updates in place), and its restoration into a slot: the prefix
  // cache's KDA snapshots (docs/prefix-caching.md). Device copies, so CPU and CUDA alike.
  std::vector<KdaStatePool> Snapshot(int32_t slot);
  void Restore(int32_t slot, const std::vector<KdaStatePool>& snapshot);
  // Bytes of one slot's state over all layers (what a snapshot holds).
  uint64_t SlotBytes() const;

 private:
  void Grow(int64_t slots);

  Backend& be_;
  MakePools make_;
  std::vector<KdaStatePool> pools_;
  std::vector<KdaStatePool> zero_;  // one zero slot, copied over a slot on Acquire
  int64_t capacity_ = 0;
  std::vector<int32_t> free_;  // stack; lowest slot on top
};

}  // namespace kimirt
