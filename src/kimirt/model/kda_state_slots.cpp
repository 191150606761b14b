// KdaStateSlots (kda_state_slots.h): slot accounting over the per-layer KDA state pools.
#include "kimirt/model/kda_state_slots.h"

#include "kimirt/core/check.h"

namespace kimirt {
namespace {

// The tensors of a pool, each as [slots, per-slot elements].
std::vector<Tensor*> Parts(KdaStatePool& p) { return {&p.conv_q, &p.conv_k, &p.conv_v, &p.recurrent}; }
std::vector<const Tensor*> Parts(const KdaStatePool& p) { return {&p.conv_q, &p.conv_k, &p.conv_v, &p.recurrent}; }

Tensor AsRows(const Tensor& t) { return t.Reshape({t.dim(0), t.numel() / t.dim(0)}); }

// dst's slots [dst_at, dst_at + n) := src's slots [src_at, src_at + n) (Backend::CopyColumns over
// whole rows: a device copy).
void CopySlots(Backend& be, const KdaStatePool& src, int64_t src_at, KdaStatePool& dst, int64_t dst_at, int64_t n) {
  const std::vector<const Tensor*> s = Parts(src);
  const std::vector<Tensor*> d = Parts(dst);
  for (size_t i = 0; i < s.size(); ++i) {
    const Tensor from = AsRows(*s[i]).Rows(src_at, n);
    Tensor to = AsRows(*d[i]).Rows(dst_at, n);
    be.CopyColumns(from, 0, from.dim(1), &to);
  }
}

}  // namespace

KdaStateSlots::KdaStateSlots(Backend& be, MakePools make, int64_t initial_slots) : be_(be), make_(std::move(make)) {
  zero_ = make_(1);
  Grow(initial_slots < 1 ? 1 : initial_slots);
}

void KdaStateSlots::Grow(int64_t slots) {
  std::vector<KdaStatePool> bigger = make_(slots);
  KIMIRT_CHECK(pools_.empty() || bigger.size() == pools_.size());
  for (size_t l = 0; l < pools_.size(); ++l) CopySlots(be_, pools_[l], 0, bigger[l], 0, capacity_);
  pools_ = std::move(bigger);
  for (int64_t s = slots - 1; s >= capacity_; --s) free_.push_back(static_cast<int32_t>(s));
  capacity_ = slots;
}

int32_t KdaStateSlots::Acquire() {
  if (free_.empty()) Grow(capacity_ * 2);
  const int32_t slot = free_.back();
  free_.pop_back();
  for (size_t l = 0; l < pools_.size(); ++l) CopySlots(be_, zero_[l], 0, pools_[l], slot, 1);
  return slot;
}

void KdaStateSlots::Release(int32_t slot) {
  KIMIRT_CHECK(slot >= 0 && slot < capacity_);
  free_.push_back(slot);
}

std::vector<KdaStatePool> KdaStateSlots::Snapshot(int32_t slot) {
  KIMIRT_CHECK(slot >= 0 && slot < capacity_);
  std::vector<KdaStatePool> copy = make_(1);
  for (size_t l = 0; l < pools_.size(); ++l) CopySlots(be_, pools_[l], slot, copy[l], 0, 1);
  return copy;
}

void KdaStateSlots::Restore(int32_t slot, const std::vector<KdaStatePool>& snapshot) {
  KIMIRT_CHECK(slot >= 0 && slot < capacity_ && snapshot.size() == pools_.size());
  for (size_t l = 0; l < pools_.size(); ++l) CopySlots(be_, snapshot[l], 0, pools_[l], slot, 1);
}

uint64_t KdaStateSlots::SlotBytes() const {
  uint64_t n = 0;
  for (const KdaStatePool& p : zero_) {
    for (const Tensor* t : Parts(p)) n += t->nbytes();
  }
  return n;
}

}  // namespace kimirt
