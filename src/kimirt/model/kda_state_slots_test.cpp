// KdaStateSlots: a slot comes zeroed, keeps its state while held (also across the pools
// growing), and comes zeroed again after it is given back and taken by another sequence.
#include "kimirt/model/kda_state_slots.h"

#include <gtest/gtest.h>

#include <set>

#include "kimirt/backend/backend_factory.h"

namespace kimirt {
namespace {

std::vector<KdaStatePool> Pools(Backend& be, int64_t slots) {
  std::vector<KdaStatePool> out(2);
  for (KdaStatePool& p : out) {
    p.conv_q = be.Zeros({slots, 3, 8});
    p.conv_k = be.Zeros({slots, 3, 8});
    p.conv_v = be.Zeros({slots, 3, 8});
    p.recurrent = be.Zeros({slots, 2, 4, 4});
  }
  return out;
}

// Fills every tensor of `slot` in every layer with `v`.
void Fill(KdaStateSlots& s, int32_t slot, float v) {
  for (int l = 0; l < s.num_layers(); ++l) {
    KdaStatePool& p = s.layer(l);
    for (Tensor* t : {&p.conv_q, &p.conv_k, &p.conv_v, &p.recurrent}) {
      Tensor row = t->Rows(slot, 1);
      for (int64_t i = 0; i < row.numel(); ++i) row.f32()[i] = v + static_cast<float>(i);
    }
  }
}

bool Holds(KdaStateSlots& s, int32_t slot, float v, bool zero) {
  for (int l = 0; l < s.num_layers(); ++l) {
    KdaStatePool& p = s.layer(l);
    for (Tensor* t : {&p.conv_q, &p.conv_k, &p.conv_v, &p.recurrent}) {
      Tensor row = t->Rows(slot, 1);
      for (int64_t i = 0; i < row.numel(); ++i) {
        if (row.f32()[i] != (zero ? 0.0f : v + static_cast<float>(i))) return false;
      }
    }
  }
  return true;
}

TEST(KdaStateSlotsTest, SlotsAreZeroedKeptAcrossGrowthAndReused) {
  auto cpu = std::move(MakeBackend("cpu")).value();
  Backend& be = *cpu;
  KdaStateSlots slots(be, [&be](int64_t n) { return Pools(be, n); }, 2);
  EXPECT_EQ(slots.capacity(), 2);
  std::vector<int32_t> held;
  std::set<int32_t> distinct;
  for (int i = 0; i < 5; ++i) {  // past the capacity twice: 2 -> 4 -> 8
    const int32_t s = slots.Acquire();
    EXPECT_TRUE(Holds(slots, s, 0, /*zero=*/true)) << "slot " << s << " not zeroed";
    Fill(slots, s, 100.0f * static_cast<float>(i + 1));
    held.push_back(s);
    distinct.insert(s);
  }
  EXPECT_EQ(distinct.size(), 5u);
  EXPECT_EQ(slots.capacity(), 8);
  EXPECT_EQ(slots.layer(1).recurrent.dim(0), 8);
  for (int i = 0; i < 5; ++i) {
    EXPECT_TRUE(Holds(slots, held[static_cast<size_t>(i)], 100.0f * static_cast<float>(i + 1), false))
        << "slot " << held[static_cast<size_t>(i)] << " lost its state";
  }
  slots.Release(held[2]);
  const int32_t again = slots.Acquire();
  EXPECT_EQ(again, held[2]);
  EXPECT_TRUE(Holds(slots, again, 0, /*zero=*/true));
}

}  // namespace
}  // namespace kimirt
