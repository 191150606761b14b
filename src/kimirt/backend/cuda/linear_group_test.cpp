// CudaBackend::LinearGroup and cuda::DecodeGemmGroup (decode_gemm.cu, docs/cuda.md "Grouped decode
// GEMMs"): a group's every output bit-identical (memcmp) to its own Linear, at Kimi-Linear-48B's
// projection widths (hidden 2304; KDA q/k/v 4096, b 32, f_a/g_a 128 and f_b/g_b back to 4096;
// MLA q 6144, kv_a 576; shared expert gate/up 1024) and odd ones (n no multiple of 16 or 128, k
// no multiple of 8: the scalar loads, in one group with aligned problems; no split and 28
// splits; more problems than one launch takes), for every row bucket and its edges, eagerly and
// replayed from a CUDA graph. Outputs are poisoned with NaN first; weights are random BF16.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstring>
#include <string>
#include <vector>

#include "kimirt/backend/cuda/kernels.h"
#include "kimirt/testing/cuda_cpu_test.h"

namespace kimirt {
namespace {

struct ProblemShape {
  int x;  // which input of the group (problems of one x read the same tensor)
  int64_t n, k;
};

struct GroupCase {
  std::string name;
  std::vector<ProblemShape> problems;
};

std::vector<GroupCase> Cases() {
  const int64_t D = 2304, P = 4096, K = 128;
  return {
      {"kda_x", {{0, P, D}, {0, P, D}, {0, P, D}, {0, 32, D}, {0, K, D}, {0, K, D}}},
      {"kda_fb_gb", {{0, P, K}, {1, P, K}}},
      {"mla_q_kv_a", {{0, 6144, D}, {0, 576, D}}},
      {"shared_gate_up", {{0, 1024, D}, {0, 1024, D}}},
      // k = 300 and 5: scalar loads, in one group with aligned ones (two GEMM launches); k = 7168
      // splits 28 ways, k = 300 and 5 not at all.
      {"odd", {{0, 77, 300}, {1, 1000, 2304}, {0, 129, 300}, {2, 512, 7168}, {3, 33, 5}}},
      // More problems than one launch takes (kMaxGroup = 8), split and unsplit.
      {"ten", {{0, 40, 640}, {0, 300, 640}, {0, 17, 640}, {0, 1, 640}, {0, 2000, 640},
               {0, 128, 640}, {0, 129, 640}, {0, 4096, 640}, {0, 8, 640}, {0, 250, 640}}},
  };
}

class CudaBackendLinearGroup : public testing::CudaCpuTest {
 protected:
  // A case's inputs on the device: its BF16 weights (random, never zeros; one set for every
  // row count) and each x [m, k].
  struct Inputs {
    std::vector<Tensor> x, w;
  };
  std::vector<Tensor> Weights(const GroupCase& c) {
    std::vector<Tensor> w;
    for (const ProblemShape& p : c.problems) {
      Tensor h = Random({p.n, p.k}, 0.05f);
      w.push_back(UpBf16(h));
    }
    return w;
  }
  Inputs Make(const GroupCase& c, const std::vector<Tensor>& w, int64_t m) {
    Inputs in{{}, w};
    for (const ProblemShape& p : c.problems) {
      if (static_cast<size_t>(p.x) == in.x.size()) in.x.push_back(gpu_->Upload(Random({m, p.k})));
    }
    return in;
  }
  std::vector<Tensor> PoisonedOutputs(const GroupCase& c, int64_t m) {
    std::vector<Tensor> y;
    for (const ProblemShape& p : c.problems) y.push_back(Poisoned({m, p.n}));
    return y;
  }
  std::vector<Backend::LinearProblem> Problems(const GroupCase& c, const Inputs& in, std::vector<Tensor>& y) {
    std::vector<Backend::LinearProblem> problems;
    for (size_t i = 0; i < c.problems.size(); ++i) {
      problems.push_back({&in.x[static_cast<size_t>(c.problems[i].x)], &in.w[i], &y[i]});
    }
    return problems;
  }
  void ExpectSameBits(const std::vector<Tensor>& got, const std::vector<Tensor>& want, const std::string& what) {
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) {
      const Tensor g = gpu_->Download(got[i]), w = gpu_->Download(want[i]);
      EXPECT_EQ(std::memcmp(g.raw(), w.raw(), g.nbytes()), 0) << what << ": problem " << i;
    }
  }

  // fn(case, m, inputs) for every case and every row bucket and edge.
  template <typename Fn>
  void ForEachCase(Fn fn) {
    for (const GroupCase& c : Cases()) {
      const std::vector<Tensor> w = Weights(c);
      for (const int64_t m : {1, 2, 3, 8, 9, 16, 17, 32, 33, 64}) {
        SCOPED_TRACE(c.name + " m=" + std::to_string(m));
        fn(c, m, Make(c, w, m));
      }
    }
  }
};

// Eagerly, and replayed from a graph (the grouped launches as Model::Launch captures them; the
// scratch then comes from the graph's own pool): each output has its own Linear's bits.
TEST_F(CudaBackendLinearGroup, EachOutputHasTheBitsOfItsLinear) {
  ForEachCase([&](const GroupCase& c, int64_t m, const Inputs& in) {
    std::vector<Tensor> alone = PoisonedOutputs(c, m);
    for (size_t i = 0; i < c.problems.size(); ++i) {
      gpu_->Linear(in.x[static_cast<size_t>(c.problems[i].x)], in.w[i], &alone[i]);
    }
    std::vector<Tensor> grouped = PoisonedOutputs(c, m);
    gpu_->LinearGroup(Problems(c, in, grouped));
    ExpectSameBits(grouped, alone, "eager");

    std::vector<Tensor> replayed = PoisonedOutputs(c, m);
    const std::string key = "linear-group-" + c.name + "-" + std::to_string(m);
    gpu_->CaptureBegin(key);
    gpu_->LinearGroup(Problems(c, in, replayed));
    ASSERT_TRUE(gpu_->CaptureEnd(replayed[0]));
    gpu_->Replay(key);
    ExpectSameBits(replayed, alone, "graph");
  });
}

// cuda::DecodeGemmGroup called directly (so the grouped kernel is what runs, whatever the
// backend routes), against cuda::DecodeGemm of each problem alone.
TEST_F(CudaBackendLinearGroup, DecodeGemmGroupGivesEachDecodeGemmsBits) {
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
  ForEachCase([&](const GroupCase& c, int64_t m, const Inputs& in) {
    std::vector<Tensor> alone = PoisonedOutputs(c, m), grouped = PoisonedOutputs(c, m);
    std::vector<cuda::DecodeGemmProblem> dp;
    for (size_t i = 0; i < c.problems.size(); ++i) {
      const ProblemShape& p = c.problems[i];
      dp.push_back({static_cast<const float*>(in.x[static_cast<size_t>(p.x)].raw()), in.w[i].raw(),
                    static_cast<float*>(grouped[i].raw()), p.n, p.k});
    }
    const int count = static_cast<int>(dp.size());
    Tensor scratch =
        gpu_->Empty({static_cast<int64_t>(cuda::DecodeGemmGroupScratchBytes(m, dp.data(), count))}, DType::kU8);
    std::vector<Tensor> scratches;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the uploads and poisoning (the backend's stream)
    for (size_t i = 0; i < c.problems.size(); ++i) {
      const ProblemShape& p = c.problems[i];
      scratches.push_back(gpu_->Empty({static_cast<int64_t>(cuda::DecodeGemmScratchBytes(m, p.n, p.k))}, DType::kU8));
      cuda::DecodeGemm(dp[i].x, dp[i].w, static_cast<float*>(alone[i].raw()), m, p.n, p.k, scratches.back().raw(), s);
    }
    cuda::DecodeGemmGroup(m, dp.data(), count, scratch.raw(), s);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ExpectSameBits(grouped, alone, "direct");
  });
  EXPECT_EQ(cudaStreamDestroy(s), cudaSuccess);
}

}  // namespace
}  // namespace kimirt
