// How many k slices a few-row kernel (DecodeGemm, the decode MoE experts) cuts its weights into,
// counting waves of blocks. Host code, shared by both planners (docs/cuda.md "Waves").
//
// A decode block at batch 1 is latency-bound (ncu, K3 MXFP4 experts: one issue every ~6 cycles a
// warp, ~3 warps a scheduler), so it takes about as long whether 1 or 4 blocks share its
// multiprocessor, and a launch takes about (waves of `slots` blocks) × (one block's time). The
// older rule, "split until there are `slots` blocks", could leave a second wave of a few blocks:
// the 48B's gate/up at batch 1 launched 576 blocks for 528 slots, two waves of 4-round slices where
// one wave of 6-round slices holds the same work. So of the older rule's slice counts and fewer,
// this picks the slicing with the fewest waves × (rounds per slice + kBlockOverheadRounds).
// Never more slices than the older rule: each one adds [m, n] F32 partial sums, written and read
// again, which at 32-64 rows outweighed a fuller wave (the 48B's lm_head in 2 slices: 0.447
// against 0.399 ms at 32 rows, decode_gemm_bench, 2026-12-04). From the widths and top-k only,
// never the batch, so a row's sums do not depend on the other rows; a constant slot count, not
// the device's, so the bits are the same on every GPU.
#pragma once

#include <cstdint>

#include "kimirt/backend/cuda/env_switch.h"

namespace kimirt::cuda {

// A block's fixed cost (start, pointers, its partial sums and their share of the combine) in
// rounds of k: half a round.
constexpr double kBlockOverheadRounds = 0.5;

// Rounds per slice for `rounds` rounds of k cut into at most `max_splits` slices (the older
// rule's count), each slice's blocks_per_split blocks run `slots` at a time. The first slicing
// of the lowest cost wins, so ties take fewer slices (fewer partial sums).
inline int64_t WaveSliceRounds(int64_t blocks_per_split, int64_t rounds, int64_t max_splits, int64_t slots) {
  int64_t best = rounds;
  double best_cost = -1.0;
  for (int64_t n = 1; n <= max_splits && n <= rounds; ++n) {
    const int64_t per = (rounds + n - 1) / n;
    if ((rounds + per - 1) / per != n) continue;  // the same slices as a smaller n
    const int64_t waves = (blocks_per_split * n + slots - 1) / slots;
    const double cost = static_cast<double>(waves) * (static_cast<double>(per) + kBlockOverheadRounds);
    if (best_cost < 0.0 || cost < best_cost) {
      best = per;
      best_cost = cost;
    }
  }
  return best;
}

// KIMIRT_WAVE_SPLITS=0 restores the older rule (for A/B runs; read once per process).
inline bool WaveSplitsOn() {
  static const bool on = EnvSwitchOn("KIMIRT_WAVE_SPLITS");
  return on;
}

}  // namespace kimirt::cuda
