// Backend::CaptureAbandon: a decode-graph capture whose launches threw (a tensor-parallel peer
// died mid-step: the collective's abort is an exception out of RunLayers, Model::Launch) ends
// there. Before it, the stream stayed in capture mode: every later call on it was refused, and
// the backend's destructor would leave "operation not permitted when stream is capturing" as the
// thread's last error for an unrelated later CheckLaunch to report as its own. That is one way
// to the stale error session 39 saw in tp2shared (tiny-a's TP 2 test after the real-width and
// fault tests); whether it was that way is gpu_check capdiag2's question.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include "kimirt/testing/cuda_cpu_test.h"

namespace kimirt {
namespace {

class CudaBackendCaptureAbandon : public testing::CudaCpuTest {
 protected:
  // y := a + b, then y + y, on `be`, checked on the host.
  void ExpectEagerWorks(Backend& be, const char* what) {
    const Tensor a = Random({3, 70}), b = Random({3, 70});
    Tensor y = be.Empty({3, 70}), z = be.Empty({3, 70});
    be.Add(be.Upload(a), be.Upload(b), &y);
    be.Add(y, y, &z);
    const Tensor got = be.Download(z);
    for (int64_t i = 0; i < a.numel(); ++i) {
      ASSERT_EQ(got.f32()[i], (a.f32()[i] + b.f32()[i]) + (a.f32()[i] + b.f32()[i])) << what << " at " << i;
    }
  }
};

TEST_F(CudaBackendCaptureAbandon, AnAbandonedCaptureEndsAndLeavesNoErrorBehind) {
  const Tensor a = gpu_->Upload(Random({3, 70})), b = gpu_->Upload(Random({3, 70}));
  const Tensor w = gpu_->Upload(Random({9, 70}, 0.1f));
  const Tensor* const prefetch[] = {&w};
  Tensor y = gpu_->Empty({3, 70});
  gpu_->CaptureBegin("abandoned");
  gpu_->PrefetchWeights(prefetch);  // a fork onto the prefetch stream, left unjoined
  gpu_->Add(a, b, &y);
  gpu_->CaptureAbandon();  // what Model::Launch does when RunLayers throws
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_FALSE(gpu_->HasGraph("abandoned"));
  ExpectEagerWorks(*gpu_, "eager after the abandoned capture");
  // A capture after it works and replays.
  Tensor z = gpu_->Empty({3, 70});
  gpu_->CaptureBegin("after");
  gpu_->Add(a, b, &z);
  ASSERT_TRUE(gpu_->CaptureEnd(z));
  gpu_->Replay("after");
  gpu_->Add(a, b, &y);  // the same sum, eagerly (the abandoned capture ran nothing)
  const Tensor got = gpu_->Download(z), want = gpu_->Download(y);
  for (int64_t i = 0; i < got.numel(); ++i) ASSERT_EQ(got.f32()[i], want.f32()[i]) << i;
  gpu_->CaptureAbandon();  // not capturing: nothing
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST_F(CudaBackendCaptureAbandon, ABackendDestroyedMidCaptureLeavesNoErrorBehind) {
  {
    auto be = MakeBackend("cuda");
    ASSERT_TRUE(be.ok()) << be.status().ToString();
    const Tensor a = (*be)->Upload(Random({3, 70}));
    Tensor y = (*be)->Empty({3, 70});
    (*be)->CaptureBegin("never ended");
    (*be)->Add(a, a, &y);
  }  // destroyed while capturing
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  ExpectEagerWorks(*gpu_, "another backend after it");
}

}  // namespace
}  // namespace kimirt
