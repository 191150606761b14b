// A PDL launch inside a stream capture right after a memset or memcpy node (pdl.cuh): captured as
// a plain launch, since a programmatic edge may only join kernel nodes (driver_types.h), and the
// graph gives the eager bits. Also the common case: a PDL launch after a kernel node keeps its
// attribute and the graph still gives the eager bits.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <cstdint>
#include <vector>

#include "kimirt/backend/cuda/kernels.h"

namespace kimirt {
namespace {

constexpr int64_t kT = 3, kC = 40, kN = kT * kC;

class CudaBackendPdlCapture : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_EQ(cudaStreamCreateWithFlags(&s_, cudaStreamNonBlocking), cudaSuccess);
    for (float** p : {&a_, &b_, &y_, &c_, &cols_}) ASSERT_EQ(cudaMalloc(p, kN * sizeof(float)), cudaSuccess);
    std::vector<float> b(kN);
    for (int64_t i = 0; i < kN; ++i) b[i] = 0.25f * static_cast<float>(i) - 7.0f;
    ASSERT_EQ(cudaMemcpy(b_, b.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  }
  void TearDown() override {
    for (float* p : {a_, b_, y_, c_, cols_}) cudaFree(p);
    cudaStreamDestroy(s_);
  }

  // a := 0 (memset), y := a + b (PDL, after the memset), c := y (memcpy), cols := c's columns
  // [5, 26) (PDL, after the memcpy), y := cols + cols (PDL, after a kernel).
  void Work() {
    EXPECT_EQ(cudaMemsetAsync(a_, 0, kN * sizeof(float), s_), cudaSuccess);
    cuda::Add(a_, b_, y_, kN, s_);
    EXPECT_EQ(cudaMemcpyAsync(c_, y_, kN * sizeof(float), cudaMemcpyDeviceToDevice, s_), cudaSuccess);
    cuda::CopyColumns(c_, kT, kC, 5, 21, cols_, s_);
    cuda::Add(cols_, cols_, y_, kT * 21, s_);
  }

  std::vector<float> Y() {
    std::vector<float> y(kT * 21);
    EXPECT_EQ(cudaMemcpyAsync(y.data(), y_, y.size() * sizeof(float), cudaMemcpyDeviceToHost, s_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(s_), cudaSuccess);
    return y;
  }

  cudaStream_t s_ = nullptr;
  float *a_ = nullptr, *b_ = nullptr, *y_ = nullptr, *c_ = nullptr, *cols_ = nullptr;
};

TEST_F(CudaBackendPdlCapture, LaunchAfterMemsetOrMemcpyNodeIsCapturedAndGivesTheEagerBits) {
  Work();
  const std::vector<float> eager = Y();
  for (int64_t t = 0; t < kT; ++t) {
    for (int64_t j = 0; j < 21; ++j) {
      const float b = 0.25f * static_cast<float>(t * kC + 5 + j) - 7.0f;  // (0 + b) doubled
      ASSERT_EQ(eager[t * 21 + j], 2 * b) << "row " << t << " column " << j;
    }
  }
  ASSERT_EQ(cudaMemsetAsync(y_, 0xff, kN * sizeof(float), s_), cudaSuccess);  // a graph that ran nothing fails
  ASSERT_EQ(cudaStreamBeginCapture(s_, cudaStreamCaptureModeRelaxed), cudaSuccess);
  Work();
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(s_, &graph), cudaSuccess);
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, s_), cudaSuccess);
  EXPECT_EQ(Y(), eager);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
}

}  // namespace
}  // namespace kimirt
