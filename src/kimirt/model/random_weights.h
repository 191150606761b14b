// Random weights made anywhere, in any order: the value of element i of tensor t (i its row-major
// index in the FULL, unsliced tensor, as the checkpoint stores it) is a pure function of
// (seed, t.name, i). So `kimirt make-checkpoint --random` can write a checkpoint and a
// tensor-parallel rank can make exactly its own slice at load (bench model / serve
// --random-weights), generating nothing of the rest, and both hold the same bits.
//
// The function: SplitMix64's i-th output from the state seed ^ FNV-1a(name) (core/random.h).
// SplitMix64 is counter-based (output k is Mix(state + (k + 1)·γ)), so element i is computed
// directly; these are the bits make-checkpoint --random wrote when it drew the streams in order.
// Distributions per role, the reference fixtures' scales (fixtures/*/README.md), so activations
// stay O(1) through a random model: linear weights N(0, 1/fan_in) (fan_in = the last dim), norm
// gains 1 + 0.1·N, embeddings N(0, 1), router 2.5/√fan_in (decisive top-k margins), KDA
// log-rates log U(1, 16) (zero past the real heads, spec §2.4), MXFP4 experts as uniformly random
// E2M1 codes with E8M0 scales that give the decoded matrix a 1/√fan_in deviation (spec §2.9).
// "N" is SplitMix64::FastNormal (bell-shaped, unit variance, cheap), rounded to the stored dtype.
#pragma once

#include <cstdint>

#include "kimirt/model/config.h"
#include "kimirt/model/layout.h"

namespace kimirt {

// The stored bytes (in t.dtype) of elements [first, first + count) of `t`, in order, into `out`.
// One thread.
void RandomTensorElements(const ModelConfig& config, const TensorSpec& t, uint64_t seed, uint64_t first,
                          uint64_t count, uint8_t* out);

// The stored bytes of indices [begin, begin + length) along `dim` of `t` (dim -1: the whole
// tensor): t.shape with dim `dim` cut to `length`, row-major, into `out`. On the ParallelFor pool.
void RandomTensorSlice(const ModelConfig& config, const TensorSpec& t, uint64_t seed, int dim, int64_t begin,
                       int64_t length, uint8_t* out);

}  // namespace kimirt
