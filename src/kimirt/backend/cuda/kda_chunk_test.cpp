// The chunked KDA prefill kernel (cuda::KdaChunked) against the CPU recurrence (cpu::KdaRecurrent,
// spec §5.4) on random inputs: K = V = 128, H = 4 and 32, T from 1 to 1000 (one token, just
// under / at / over a chunk, several chunks), the K3 gate (lower bound −5) and Kimi-Linear's
// softplus gate, random incoming states read from and written back to a slot of a pool, outputs
// poisoned with NaN first. Tolerances (relative L2 of the output and of the final state): 1e-5
// for the F32 mode (three BF16 parts per operand, F32 math up to summation order; the CPU tests'
// chunked-vs-recurrent bar), 1e-2 for the BF16 prefill mode (the chunk-parallel kernels: every
// MMA operand one BF16 part, as FLA's chunk_kda; 2.9e-3 .. 3.9e-3 in the host emulation,
// scripts/kda_chunk_emulate.sh, whose products of BF16 operands are exact; the mode's inputs
// already carry BF16 rounding from its GEMMs). Also: saturated and very fast decays (the F32
// mode's token-by-token fallback, the BF16 mode's direct scores for chunks the factored form
// cannot take), long sequences of many chunks at H = 32 and 96, a sequence split over two calls,
// untouched slots bit for bit, and batch invariance: every sequence of a varlen batch
// bit-identical to the same sequence run alone, and for every value-block width.
//
// Named CudaBackend* so scripts/gpu_check.sh's filter runs it; built only with -DKIMIRT_CUDA=ON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kimirt/backend/cpu/kda_kernels.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

constexpr int64_t kK = cuda::kKdaChunkHeadDim;

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(std::max<size_t>(host.size(), 1)) {
    EXPECT_EQ(cudaMalloc(&ptr_, sizeof(T) * n_), cudaSuccess);
    if (!host.empty()) {
      EXPECT_EQ(cudaMemcpy(ptr_, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> Download(size_t n) const {
    std::vector<T> host(n);
    if (n > 0) EXPECT_EQ(cudaMemcpy(host.data(), ptr_, sizeof(T) * n, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

double RelL2(const float* got, const float* want, size_t n) {
  double num = 0, den = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(got[i]) || !std::isfinite(want[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}
double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  return RelL2(got.data(), want.data(), std::min(got.size(), want.size()));
}
bool SameBits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }

// The decay regimes: K3's bounded gate, Kimi-Linear's softplus gate, K3 saturated (α = −5 on
// every channel: the factored form's largest exponents, 40), and a softplus gate driven to
// α ≈ −10 .. −30 on the tokens of the second chunk only (the fallback there, the tensor-core
// path elsewhere in the same sequence).
enum class Gate { kLowerBound, kSoftplus, kSaturated, kFastSecondChunk };

// One sequence's inputs of the KDA core, [T, H, K] (beta [T, H]), with realistic magnitudes.
struct Seq {
  int64_t T = 0, H = 0;
  std::vector<float> q, k, v, beta, alpha;
};

class CudaBackendKdaChunkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess) << "no CUDA device visible";
    ASSERT_GT(count, 0);
  }
  std::vector<float> Normal(int64_t n, double scale = 1.0, double mean = 0.0) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = static_cast<float>(mean + scale * rng_.Normal());
    return x;
  }
  Seq NewSeq(int64_t T, int64_t H, Gate gate) {
    const int64_t n = T * H * kK;
    Seq s{T, H, Normal(n), Normal(n), Normal(n), Normal(T * H, 2.0), std::vector<float>(static_cast<size_t>(n))};
    std::vector<float> a_log(static_cast<size_t>(H)), dt_bias;
    std::vector<float> f = Normal(n);
    cpu::KdaGateParams p;
    p.heads = H;
    p.head_dim = kK;
    if (gate == Gate::kSoftplus || gate == Gate::kFastSecondChunk) {
      for (float& a : a_log) a = static_cast<float>(std::log(0.1 + 1.9 * rng_.Uniform()));
      dt_bias = Normal(H * kK, 0.5, -1.0);
      if (gate == Gate::kFastSecondChunk) {
        for (float& a : a_log) a = std::log(5.0f);
        for (int64_t i = 64 * H * kK; i < std::min<int64_t>(T, 128) * H * kK; ++i) f[static_cast<size_t>(i)] += 4.0f;
      }
    } else {
      for (float& a : a_log) a = static_cast<float>(std::log(1.0 + 15.0 * rng_.Uniform()));
      dt_bias = Normal(H * kK, 0.1);
      p.lower_bound = -5.0f;
      if (gate == Gate::kSaturated) {
        for (float& x : f) x += 30.0f;  // sigmoid(≥ 30) rounds to 1: α = −5 in FP32
      }
    }
    p.a_log = a_log.data();
    p.dt_bias = dt_bias.data();
    cpu::KdaLogDecay(f.data(), T, p, s.alpha.data());
    return s;
  }
  std::vector<float> NewPool(int64_t slots, int64_t H) { return Normal(slots * H * kK * kK, 0.5); }

  // cpu::KdaRecurrent on one sequence from `state` [H, K, K] (updated); returns o.
  static std::vector<float> RunCpu(const Seq& s, float* state) {
    std::vector<float> o(s.q.size());
    const cpu::KdaCoreArgs a{s.T, s.H, kK, s.q.data(), s.k.data(), s.v.data(), s.beta.data(), s.alpha.data()};
    cpu::KdaRecurrent(a, state, o.data());
    return o;
  }

  // cuda::KdaChunked on the sequences as one varlen batch, sequence b on slot slots[b] of `pool`
  // (updated); returns o of all rows (NaN-poisoned before the call).
  static std::vector<float> RunGpu(const std::vector<const Seq*>& seqs, const std::vector<int32_t>& slots,
                                   std::vector<float>& pool, bool bf16, int value_block = 0,
                                   bool no_metadata = false) {
    const int64_t H = seqs.front()->H;
    std::vector<float> q, k, v, beta, alpha;
    std::vector<int32_t> cu{0};
    auto append = [](std::vector<float>& dst, const std::vector<float>& src) { dst.insert(dst.end(), src.begin(), src.end()); };
    for (const Seq* s : seqs) {
      append(q, s->q), append(k, s->k), append(v, s->v), append(beta, s->beta), append(alpha, s->alpha);
      cu.push_back(cu.back() + static_cast<int32_t>(s->T));
    }
    const std::vector<float> poison(q.size(), std::nanf(""));
    DeviceArray<float> dq(q), dk(k), dv(v), dbeta(beta), dalpha(alpha), dpool(pool), dout(poison);
    DeviceArray<int32_t> dcu(cu), dslots(slots);
    cuda::KdaChunkArgs a;
    a.q = dq.get(), a.k = dk.get(), a.v = dv.get(), a.beta_logits = dbeta.get(), a.alpha = dalpha.get();
    a.cu_seqlens = dcu.get(), a.slots = dslots.get(), a.state = dpool.get(), a.o = dout.get();
    a.batch = static_cast<int64_t>(seqs.size()), a.heads = H, a.head_dim = kK, a.tokens = cu.back();
    if (no_metadata) {  // one sequence on slot 0, as CudaBackend::KdaCore calls it
      a.cu_seqlens = nullptr, a.slots = nullptr;
    }
    // The BF16 mode's scratch, NaN-poisoned too (every byte the kernels read, they write first).
    const size_t scratch_floats = (cuda::KdaChunkScratchBytes(a.tokens, a.batch, H) + 3) / 4;
    DeviceArray<float> scratch(std::vector<float>(bf16 ? scratch_floats : 0, std::nanf("")));
    if (bf16) a.scratch = scratch.get();
    cuda::KdaChunked(a, nullptr, bf16, value_block);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    pool = dpool.Download(pool.size());
    return dout.Download(q.size());
  }

  // One sequence on slot 1 of a 3-slot pool against the CPU recurrence; the other slots must
  // keep their bits.
  void ExpectMatchesCpu(const Seq& s, bool bf16, double tol, int value_block = 0) {
    const int64_t per_slot = s.H * kK * kK;
    const std::vector<float> start = NewPool(3, s.H);
    std::vector<float> want_state(start.begin() + per_slot, start.begin() + 2 * per_slot);
    const std::vector<float> want = RunCpu(s, want_state.data());
    std::vector<float> pool = start;
    const std::vector<float> got = RunGpu({&s}, {1}, pool, bf16, value_block);
    const double err_o = RelL2(got, want), err_s = RelL2(&pool[per_slot], want_state.data(), want_state.size());
    EXPECT_LE(err_o, tol) << "output";
    EXPECT_LE(err_s, tol) << "state";
    RecordProperty("rel_l2_o_T" + std::to_string(s.T) + "_H" + std::to_string(s.H) + (bf16 ? "_bf16" : "_f32"),
                   std::to_string(err_o));
    EXPECT_TRUE(SameBits(pool.data(), start.data(), per_slot)) << "slot 0 changed";
    EXPECT_TRUE(SameBits(&pool[2 * per_slot], &start[2 * per_slot], per_slot)) << "slot 2 changed";
  }

  SplitMix64 rng_{20261201};
};

constexpr double kTolF32 = 1e-5, kTolBf16 = 1e-2;

TEST_F(CudaBackendKdaChunkTest, MatchesCpuRecurrence) {
  for (Gate gate : {Gate::kLowerBound, Gate::kSoftplus}) {
    for (int64_t H : {4, 32}) {
      for (int64_t T : {1, 63, 64, 65, 200, 1000}) {
        SCOPED_TRACE(std::string(gate == Gate::kLowerBound ? "K3 gate" : "softplus gate") + " H=" + std::to_string(H) +
                     " T=" + std::to_string(T));
        const Seq s = NewSeq(T, H, gate);
        ExpectMatchesCpu(s, false, kTolF32);
        ExpectMatchesCpu(s, true, kTolBf16);
      }
    }
  }
}

TEST_F(CudaBackendKdaChunkTest, BothValueBlocksMatchCpu) {
  const Seq s = NewSeq(200, 4, Gate::kLowerBound);
  for (int vb : {32, 64, 128}) {
    SCOPED_TRACE("value block " + std::to_string(vb));
    ExpectMatchesCpu(s, false, kTolF32, vb);
    ExpectMatchesCpu(s, true, kTolBf16, vb);
  }
}

TEST_F(CudaBackendKdaChunkTest, SaturatedAndFastDecaysMatchCpu) {
  for (Gate gate : {Gate::kSaturated, Gate::kFastSecondChunk}) {
    SCOPED_TRACE(gate == Gate::kSaturated ? "alpha = -5 everywhere" : "fast decay in the second chunk");
    const Seq s = NewSeq(200, 4, gate);
    if (gate == Gate::kFastSecondChunk) {
      // The regime must really be there: α in the second chunk averaging below −8, so runs of 8
      // tokens sum far below the factored form's −60.
      const auto first = s.alpha.begin() + 64 * 4 * kK, last = s.alpha.begin() + 128 * 4 * kK;
      ASSERT_LT(std::accumulate(first, last, 0.0) / static_cast<double>(last - first), -8.0);
    }
    ExpectMatchesCpu(s, false, kTolF32);
    ExpectMatchesCpu(s, true, kTolBf16);
  }
}

TEST_F(CudaBackendKdaChunkTest, SequenceSplitOverTwoCallsCarriesState) {
  const int64_t H = 4, T = 200, first = 130, row = H * kK;
  const Seq whole = NewSeq(T, H, Gate::kLowerBound);
  auto part = [&](int64_t t0, int64_t n) {
    Seq p{n, H, {}, {}, {}, {}, {}};
    auto cut = [&](const std::vector<float>& x, int64_t w) {
      return std::vector<float>(x.begin() + t0 * w, x.begin() + (t0 + n) * w);
    };
    p.q = cut(whole.q, row), p.k = cut(whole.k, row), p.v = cut(whole.v, row), p.alpha = cut(whole.alpha, row);
    p.beta = cut(whole.beta, H);
    return p;
  };
  const Seq a = part(0, first), b = part(first, T - first);
  const std::vector<float> start = NewPool(1, H);
  std::vector<float> want_state = start;
  const std::vector<float> want = RunCpu(whole, want_state.data());
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "BF16 prefill mode" : "F32 mode");
    std::vector<float> pool = start;
    std::vector<float> got = RunGpu({&a}, {0}, pool, bf16);
    const std::vector<float> got_b = RunGpu({&b}, {0}, pool, bf16);
    got.insert(got.end(), got_b.begin(), got_b.end());
    EXPECT_LE(RelL2(got, want), bf16 ? kTolBf16 : kTolF32);
    EXPECT_LE(RelL2(pool, want_state), bf16 ? kTolBf16 : kTolF32);
  }
}

// The BF16 mode's chunk-parallel path at the bench's head counts over many chunks (its map,
// 64 .. 100 chunk records a head, the state carried through all of them): one long sequence at
// H = 32 and 96, and a varlen batch of odd lengths at H = 96 (each sequence also alone, bit for
// bit). The error must not grow with the length: the same bar as for 200 tokens.
TEST_F(CudaBackendKdaChunkTest, LongSequencesAndOddVarlenInBf16Mode) {
  for (int64_t H : {32, 96}) {
    SCOPED_TRACE("H=" + std::to_string(H));
    const Seq s = NewSeq(H == 32 ? 6400 : 4097, H, Gate::kLowerBound);
    ExpectMatchesCpu(s, true, kTolBf16);
  }
  const int64_t H = 96, per_slot = H * kK * kK;
  const std::vector<int64_t> lens = {1537, 77, 1, 639, 1000};
  const std::vector<int32_t> slot_of = {4, 0, 2, 1, 3};
  std::vector<Seq> seqs;
  for (size_t i = 0; i < lens.size(); ++i) seqs.push_back(NewSeq(lens[i], H, i % 2 ? Gate::kSoftplus : Gate::kLowerBound));
  std::vector<const Seq*> ptrs;
  for (const Seq& s : seqs) ptrs.push_back(&s);
  const std::vector<float> start = NewPool(5, H);
  std::vector<float> pool = start;
  const std::vector<float> out = RunGpu(ptrs, slot_of, pool, true);
  int64_t row = 0;
  for (size_t b = 0; b < seqs.size(); ++b) {
    SCOPED_TRACE("sequence " + std::to_string(b) + " (T=" + std::to_string(lens[b]) + ")");
    const size_t n = static_cast<size_t>(lens[b] * H * kK), at = static_cast<size_t>(slot_of[b] * per_slot);
    std::vector<float> alone_pool = start;
    const std::vector<float> alone = RunGpu({&seqs[b]}, {slot_of[b]}, alone_pool, true);
    EXPECT_TRUE(SameBits(alone.data(), &out[static_cast<size_t>(row)], n)) << "output";
    EXPECT_TRUE(SameBits(&alone_pool[at], &pool[at], static_cast<size_t>(per_slot))) << "state";
    std::vector<float> want_state(start.begin() + static_cast<int64_t>(at), start.begin() + static_cast<int64_t>(at) + per_slot);
    const std::vector<float> want = RunCpu(seqs[b], want_state.data());
    EXPECT_LE(RelL2(&out[static_cast<size_t>(row)], want.data(), n), kTolBf16);
    EXPECT_LE(RelL2(&pool[at], want_state.data(), want_state.size()), kTolBf16);
    row += static_cast<int64_t>(n);
  }
}

// CudaBackend::KdaCore's call (no cu_seqlens or slots: one sequence on the pool's slot 0) gives
// the bits of the same sequence described by metadata.
TEST_F(CudaBackendKdaChunkTest, OneSequenceWithoutMetadataGivesTheSameBits) {
  const Seq s = NewSeq(150, 4, Gate::kLowerBound);
  for (bool bf16 : {false, true}) {
    std::vector<float> pool = NewPool(1, 4), pool_meta = pool;
    const std::vector<float> out = RunGpu({&s}, {0}, pool, bf16, 0, true);
    const std::vector<float> out_meta = RunGpu({&s}, {0}, pool_meta, bf16);
    EXPECT_TRUE(SameBits(out.data(), out_meta.data(), out.size())) << (bf16 ? "BF16 mode" : "F32 mode");
    EXPECT_TRUE(SameBits(pool.data(), pool_meta.data(), pool.size())) << (bf16 ? "BF16 mode" : "F32 mode");
  }
}

// Batch invariance: a varlen batch (lengths around the chunk size, an empty sequence, several
// chunks) on scattered slots gives each sequence the bits it gets alone, in both modes and for
// every value-block width; and matches the CPU per sequence.
TEST_F(CudaBackendKdaChunkTest, VarlenBatchBitIdenticalToEachSequenceAlone) {
  const int64_t H = 4, slots = 11, per_slot = H * kK * kK;
  const std::vector<int64_t> lens = {65, 1, 200, 64, 0, 130, 63, 300};
  const std::vector<int32_t> slot_of = {7, 2, 10, 0, 5, 3, 9, 4};
  std::vector<Seq> seqs;
  for (size_t i = 0; i < lens.size(); ++i) seqs.push_back(NewSeq(lens[i], H, i % 2 ? Gate::kSoftplus : Gate::kLowerBound));
  std::vector<const Seq*> ptrs;
  for (const Seq& s : seqs) ptrs.push_back(&s);
  const std::vector<float> start = NewPool(slots, H);
  for (bool bf16 : {false, true}) {
    SCOPED_TRACE(bf16 ? "BF16 prefill mode" : "F32 mode");
    std::vector<float> pool = start;
    const std::vector<float> out = RunGpu(ptrs, slot_of, pool, bf16);
    for (int vb : {32, 64, 128}) {  // the automatic choice is one of them; every one gives the same bits
      std::vector<float> pool_vb = start;
      const std::vector<float> out_vb = RunGpu(ptrs, slot_of, pool_vb, bf16, vb);
      EXPECT_TRUE(SameBits(out.data(), out_vb.data(), out.size())) << "value block " << vb << " changed the output";
      EXPECT_TRUE(SameBits(pool.data(), pool_vb.data(), pool.size())) << "value block " << vb << " changed the states";
    }
    int64_t row = 0;
    for (size_t b = 0; b < seqs.size(); ++b) {
      SCOPED_TRACE("sequence " + std::to_string(b) + " (T=" + std::to_string(lens[b]) + ")");
      const size_t n = static_cast<size_t>(lens[b] * H * kK), at = static_cast<size_t>(slot_of[b] * per_slot);
      std::vector<float> alone_pool = start;
      const std::vector<float> alone = RunGpu({&seqs[b]}, {slot_of[b]}, alone_pool, bf16);
      EXPECT_TRUE(SameBits(alone.data(), &out[static_cast<size_t>(row)], n)) << "output";
      EXPECT_TRUE(SameBits(&alone_pool[at], &pool[at], static_cast<size_t>(per_slot))) << "state";
      std::vector<float> want_state(start.begin() + static_cast<int64_t>(at), start.begin() + static_cast<int64_t>(at) + per_slot);
      const std::vector<float> want = RunCpu(seqs[b], want_state.data());
      if (n > 0) EXPECT_LE(RelL2(&out[static_cast<size_t>(row)], want.data(), n), bf16 ? kTolBf16 : kTolF32);
      EXPECT_LE(RelL2(&pool[at], want_state.data(), want_state.size()), bf16 ? kTolBf16 : kTolF32);
      row += static_cast<int64_t>(n);
    }
    // Slots no sequence uses keep their bits.
    for (int32_t slot = 0; slot < slots; ++slot) {
      if (std::find(slot_of.begin(), slot_of.end(), slot) != slot_of.end()) continue;
      const size_t at = static_cast<size_t>(slot * per_slot);
      EXPECT_TRUE(SameBits(&pool[at], &start[at], static_cast<size_t>(per_slot))) << "slot " << slot;
    }
  }
}

}  // namespace
}  // namespace kimirt
