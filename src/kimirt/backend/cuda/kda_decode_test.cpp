// The fused KDA decode kernel (cuda::KdaDecode) against the CPU reference (cpu::KdaDecode, the
// unfused CPU kernels row by row), on random inputs and random state pools: K3 (gate lower
// bound) and Kimi-Linear (softplus gate), K = V = 128, W = 4, several batch sizes on distinct
// slots of one pool, each call continuing from the state the previous one left. Outputs are
// poisoned with NaN first. Checked: the output and the updated recurrent states (relative L2
// 2e-5, the CUDA backend's bar for the KDA core: both FP32, they differ in the l2norm's summation
// order and FMA contraction), the updated windows exactly (they are copies), the untouched slots bit for bit,
// and batch invariance: every row of a batch bit-identical to the same row computed alone. Every
// kernel variant (cuda::KdaDecodeVariant) is checked; the two column variants (one code, two
// register budgets) and split512 / split512plain (one code, with and without cache hints) must
// give each other's bits.
//
// Named CudaBackend* so scripts/gpu_check.sh's filter runs it; built only with -DKIMIRT_CUDA=ON.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kimirt/backend/cpu/kda_kernels.h"
#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

// A device copy of a host vector, freed on scope exit.
template <typename T>
class DeviceArray {
 public:
  explicit DeviceArray(const std::vector<T>& host) : n_(host.size()) {
    EXPECT_EQ(cudaMalloc(&ptr_, sizeof(T) * n_), cudaSuccess);
    EXPECT_EQ(cudaMemcpy(ptr_, host.data(), sizeof(T) * n_, cudaMemcpyHostToDevice), cudaSuccess);
  }
  ~DeviceArray() { cudaFree(ptr_); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  T* get() const { return ptr_; }
  std::vector<T> Download() const {
    std::vector<T> host(n_);
    EXPECT_EQ(cudaMemcpy(host.data(), ptr_, sizeof(T) * n_, cudaMemcpyDeviceToHost), cudaSuccess);
    return host;
  }

 private:
  size_t n_;
  T* ptr_ = nullptr;
};

double RelL2(const std::vector<float>& got, const std::vector<float>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return INFINITY;
    num += (static_cast<double>(got[i]) - want[i]) * (static_cast<double>(got[i]) - want[i]);
    den += static_cast<double>(want[i]) * want[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

bool SameBits(const float* a, const float* b, size_t n) { return std::memcmp(a, b, sizeof(float) * n) == 0; }
// The first index where two arrays differ in bits, or -1 (so a failure prints one number, not
// a million floats).
int64_t FirstDiff(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!SameBits(&a[i], &b[i], 1)) return static_cast<int64_t>(i);
  }
  return -1;
}

// One layer's weights and state pools on the host, and the step's inputs for B rows.
struct Layer {
  int64_t H, K, W, slots;
  std::optional<float> lower_bound;
  std::vector<float> conv_q, conv_k, conv_v, a_log, dt_bias, o_norm;
  std::vector<float> recurrent, window_q, window_k, window_v;
};

struct Step {
  std::vector<float> q, k, v, beta, f, gate;
  std::vector<int32_t> slots;
};

class CudaBackendKdaDecodeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int count = 0;
    ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess) << "no CUDA device visible";
    ASSERT_GT(count, 0);
  }
  std::vector<float> Random(int64_t n, float scale, float offset = 0.0f) {
    std::vector<float> x(static_cast<size_t>(n));
    for (float& e : x) e = offset + scale * rng_.FastNormal();
    return x;
  }
  Layer NewLayer(int64_t H, int64_t slots, std::optional<float> lb) {
    const int64_t K = kimirt::cuda::kKdaDecodeHeadDim, W = 4, P = H * K;
    Layer l{H, K, W, slots, lb, {}, {}, {}, {}, {}, {}, {}, {}, {}, {}};
    l.conv_q = Random(P * W, 0.5f);
    l.conv_k = Random(P * W, 0.5f);
    l.conv_v = Random(P * W, 0.5f);
    l.a_log = Random(H, 0.5f);
    l.dt_bias = Random(P, 0.5f);
    l.o_norm = Random(K, 0.2f, 1.0f);
    l.recurrent = Random(slots * H * K * K, 0.1f);
    l.window_q = Random(slots * (W - 1) * P, 1.0f);
    l.window_k = Random(slots * (W - 1) * P, 1.0f);
    l.window_v = Random(slots * (W - 1) * P, 1.0f);
    return l;
  }
  // B rows on B distinct slots drawn at random from the pool.
  Step NewStep(const Layer& l, int64_t B) {
    const int64_t P = l.H * l.K;
    Step s{Random(B * P, 1.0f), Random(B * P, 1.0f), Random(B * P, 1.0f), Random(B * l.H, 1.0f),
           Random(B * P, 2.0f), Random(B * P, 1.0f), {}};
    std::vector<int32_t> perm(static_cast<size_t>(l.slots));
    std::iota(perm.begin(), perm.end(), 0);
    for (size_t i = perm.size() - 1; i > 0; --i) std::swap(perm[i], perm[rng_.Next() % (i + 1)]);
    s.slots.assign(perm.begin(), perm.begin() + B);
    return s;
  }
  static KdaDecodeArgs Args(const Layer& l, int64_t B) {
    KdaDecodeArgs a;
    a.rows = B;
    a.heads = l.H;
    a.head_dim = l.K;
    a.conv_taps = l.W;
    a.norm_eps = 1e-5f;
    a.has_lower_bound = l.lower_bound.has_value();
    a.lower_bound = l.lower_bound.value_or(0.0f);
    a.slot_count = l.slots;
    return a;
  }
  // The CPU reference on host copies: updates l's pools, returns the output.
  static std::vector<float> RunCpu(Layer& l, const Step& s) {
    const int64_t B = static_cast<int64_t>(s.slots.size());
    std::vector<float> out(static_cast<size_t>(B * l.H * l.K));
    KdaDecodeArgs a = Args(l, B);
    a.q = s.q.data(), a.k = s.k.data(), a.v = s.v.data(), a.beta_logits = s.beta.data(), a.f = s.f.data();
    a.gate = s.gate.data();
    a.conv_q = l.conv_q.data(), a.conv_k = l.conv_k.data(), a.conv_v = l.conv_v.data();
    a.a_log = l.a_log.data(), a.dt_bias = l.dt_bias.data(), a.o_norm = l.o_norm.data();
    a.slots = s.slots.data();
    a.recurrent = l.recurrent.data();
    a.window_q = l.window_q.data(), a.window_k = l.window_k.data(), a.window_v = l.window_v.data();
    a.out = out.data();
    cpu::KdaDecode(a);
    return out;
  }
  // The fused kernel on device copies of l's pools: updates l's pools, returns the output.
  static std::vector<float> RunGpu(Layer& l, const Step& s, cuda::KdaDecodeVariant variant) {
    const int64_t B = static_cast<int64_t>(s.slots.size());
    std::vector<float> poison(static_cast<size_t>(B * l.H * l.K), std::nanf(""));
    DeviceArray<float> q(s.q), k(s.k), v(s.v), beta(s.beta), f(s.f), gate(s.gate), out(poison);
    DeviceArray<float> cq(l.conv_q), ck(l.conv_k), cv(l.conv_v), a_log(l.a_log), dt(l.dt_bias), on(l.o_norm);
    DeviceArray<float> rec(l.recurrent), wq(l.window_q), wk(l.window_k), wv(l.window_v);
    DeviceArray<int32_t> slots(s.slots);
    KdaDecodeArgs a = Args(l, B);
    a.q = q.get(), a.k = k.get(), a.v = v.get(), a.beta_logits = beta.get(), a.f = f.get(), a.gate = gate.get();
    a.conv_q = cq.get(), a.conv_k = ck.get(), a.conv_v = cv.get();
    a.a_log = a_log.get(), a.dt_bias = dt.get(), a.o_norm = on.get();
    a.slots = slots.get();
    a.recurrent = rec.get(), a.window_q = wq.get(), a.window_k = wk.get(), a.window_v = wv.get();
    a.out = out.get();
    cuda::KdaDecode(a, nullptr, variant);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    l.recurrent = rec.Download();
    l.window_q = wq.Download(), l.window_k = wk.Download(), l.window_v = wv.Download();
    return out.Download();
  }

  SplitMix64 rng_{20261201};
};

TEST_F(CudaBackendKdaDecodeTest, MatchesCpuReferenceWithStatesBySlot) {
  for (std::optional<float> lb : {std::optional<float>(-5.0f), std::optional<float>()}) {
    SCOPED_TRACE(lb ? "K3 (gate lower bound)" : "Kimi-Linear (softplus gate)");
    const int64_t H = 4, slots = 11;
    Layer cpu_l = NewLayer(H, slots, lb);
    // Successive decode steps over one pool: each continues from the states the last one left.
    for (int64_t B : {1, 3, 8, 11}) {
      SCOPED_TRACE("B=" + std::to_string(B));
      const Step s = NewStep(cpu_l, B);
      const Layer before = cpu_l;
      const std::vector<float> want = RunCpu(cpu_l, s);
      for (cuda::KdaDecodeVariant v : cuda::kKdaDecodeVariants) {
        SCOPED_TRACE(cuda::KdaDecodeVariantName(v));
        // Every variant from the state the CPU started this step from, so rounding differences
        // do not compound.
        Layer gpu_l = before;
        const std::vector<float> got = RunGpu(gpu_l, s, v);
        EXPECT_LE(RelL2(got, want), 2e-5);
        EXPECT_LE(RelL2(gpu_l.recurrent, cpu_l.recurrent), 2e-5);
        EXPECT_EQ(FirstDiff(gpu_l.window_q, cpu_l.window_q), -1);
        EXPECT_EQ(FirstDiff(gpu_l.window_k, cpu_l.window_k), -1);
        EXPECT_EQ(FirstDiff(gpu_l.window_v, cpu_l.window_v), -1);
        // The state really moved on the slots used, and only there.
        const size_t per_slot = static_cast<size_t>(H * cpu_l.K * cpu_l.K);
        for (int32_t slot = 0; slot < slots; ++slot) {
          const bool used = std::find(s.slots.begin(), s.slots.end(), slot) != s.slots.end();
          const size_t at = static_cast<size_t>(slot) * per_slot;
          EXPECT_EQ(SameBits(&gpu_l.recurrent[at], &before.recurrent[at], per_slot), !used) << "slot " << slot;
        }
      }
    }
  }
}

TEST_F(CudaBackendKdaDecodeTest, EachRowBitIdenticalAloneOrInABatch) {
  for (std::optional<float> lb : {std::optional<float>(-5.0f), std::optional<float>()}) {
    SCOPED_TRACE(lb ? "K3" : "Kimi-Linear");
    const int64_t H = 3, slots = 19, K = cuda::kKdaDecodeHeadDim, P = H * K;
    const Layer start = NewLayer(H, slots, lb);
    // No variant's shape depends on B (blocks or clusters per (head, row)), so a few sizes, up
    // to the whole pool, cover it.
    for (int64_t B : {2, 7, 19}) {
      SCOPED_TRACE("B=" + std::to_string(B));
      const Step s = NewStep(start, B);
      std::vector<std::vector<float>> outs, states;
      for (cuda::KdaDecodeVariant v : cuda::kKdaDecodeVariants) {
        SCOPED_TRACE(cuda::KdaDecodeVariantName(v));
        Layer batched = start;
        const std::vector<float> out = RunGpu(batched, s, v);
        for (int64_t b = 0; b < B; ++b) {
          Step one;
          auto row = [&](const std::vector<float>& x, int64_t n) {
            return std::vector<float>(x.begin() + b * n, x.begin() + (b + 1) * n);
          };
          one.q = row(s.q, P), one.k = row(s.k, P), one.v = row(s.v, P), one.beta = row(s.beta, H);
          one.f = row(s.f, P), one.gate = row(s.gate, P);
          one.slots = {s.slots[static_cast<size_t>(b)]};
          Layer alone = start;
          const std::vector<float> got = RunGpu(alone, one, v);
          ASSERT_TRUE(SameBits(got.data(), &out[static_cast<size_t>(b * P)], static_cast<size_t>(P))) << "row " << b;
          const size_t per_slot = static_cast<size_t>(H * K * K);
          const size_t at = static_cast<size_t>(one.slots[0]) * per_slot;
          ASSERT_TRUE(SameBits(&alone.recurrent[at], &batched.recurrent[at], per_slot)) << "state of row " << b;
        }
        outs.push_back(out);
        states.push_back(batched.recurrent);
      }
      // Same code under another register budget, or without the cache hints: the same bits.
      auto index = [](cuda::KdaDecodeVariant v) {
        const auto* all = std::begin(cuda::kKdaDecodeVariants);
        return static_cast<size_t>(std::find(all, std::end(cuda::kKdaDecodeVariants), v) - all);
      };
      for (auto [x, y] : {std::pair{cuda::KdaDecodeVariant::kColumn2, cuda::KdaDecodeVariant::kColumn3},
                          std::pair{cuda::KdaDecodeVariant::kSplit512, cuda::KdaDecodeVariant::kSplit512Plain}}) {
        SCOPED_TRACE(std::string(cuda::KdaDecodeVariantName(x)) + " vs " + cuda::KdaDecodeVariantName(y));
        EXPECT_EQ(FirstDiff(outs[index(x)], outs[index(y)]), -1);
        EXPECT_EQ(FirstDiff(states[index(x)], states[index(y)]), -1);
      }
    }
  }
}

}  // namespace
}  // namespace kimirt
