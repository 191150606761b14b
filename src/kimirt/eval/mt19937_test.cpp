// Expected values were printed by CPython 3.11's random module and NumPy 2.4's legacy
// np.random (the generators lm-eval and `vllm bench serve` use).
#include "kimirt/eval/mt19937.h"

#include <gtest/gtest.h>

namespace kimirt::eval {
namespace {

TEST(Mt19937, PythonGetrandbitsMatchesCPython) {
  // random.Random(0).getrandbits(32) x3
  Mt19937 r = Mt19937::PythonSeeded(0);
  EXPECT_EQ(r.GetRandBits(32), 3626764237u);
  EXPECT_EQ(r.GetRandBits(32), 1654615998u);
  EXPECT_EQ(r.GetRandBits(32), 3255389356u);
}

TEST(Mt19937, PythonSeedWiderThan32BitsAndWideDraws) {
  // r = random.Random(2**40 + 5); r.getrandbits(40), r.getrandbits(13), r.getrandbits(64)
  Mt19937 r = Mt19937::PythonSeeded((1ull << 40) + 5);
  EXPECT_EQ(r.GetRandBits(40), 569101979940ull);
  EXPECT_EQ(r.GetRandBits(13), 2200ull);
  EXPECT_EQ(r.GetRandBits(64), 17077747508935831298ull);
}

TEST(Mt19937, PythonSampleMatchesLmEvalFewshotDraws) {
  // r = random.Random(1234); r.sample(range(7473), 5) twice, then r.sample(range(7473), 8):
  // the first two are lm-eval's few-shot picks for GSM8K test documents 0 and 1.
  Mt19937 r = Mt19937::PythonSeeded(1234);
  EXPECT_EQ(r.PythonSampleIndices(7473, 5), (std::vector<size_t>{6374, 3610, 957, 61, 742}));
  EXPECT_EQ(r.PythonSampleIndices(7473, 5), (std::vector<size_t>{7462, 6610, 4769, 286, 5501}));
  EXPECT_EQ(r.PythonSampleIndices(7473, 8), (std::vector<size_t>{5677, 687, 806, 6279, 2905, 1939, 142, 252}));
}

TEST(Mt19937, PythonSamplePoolAlgorithmForSmallPopulations) {
  // r = random.Random(7); r.sample(range(10), 4); r.sample(range(30), 7)  (both n <= setsize)
  Mt19937 r = Mt19937::PythonSeeded(7);
  EXPECT_EQ(r.PythonSampleIndices(10, 4), (std::vector<size_t>{5, 2, 6, 9}));
  EXPECT_EQ(r.PythonSampleIndices(30, 7), (std::vector<size_t>{1, 2, 26, 17, 3, 11, 18}));
}

TEST(Mt19937, NumpyLegacyExponentialMatchesNumpy) {
  // np.random.seed(42); np.random.gamma(1.0, 1.0, size=4)
  Mt19937 r = Mt19937::NumpySeeded(42);
  EXPECT_DOUBLE_EQ(r.NumpyStandardExponential(), 0.4692680899768591);
  EXPECT_DOUBLE_EQ(r.NumpyStandardExponential(), 3.010121430917521);
  EXPECT_DOUBLE_EQ(r.NumpyStandardExponential(), 1.3167456935454493);
  EXPECT_DOUBLE_EQ(r.NumpyStandardExponential(), 0.9129425537759532);
  // np.random.seed(0); np.random.random_sample(); np.random.seed(2**32-1) likewise
  Mt19937 z = Mt19937::NumpySeeded(0);
  EXPECT_DOUBLE_EQ(z.NumpyDouble(), 0.5488135039273248);
  Mt19937 m = Mt19937::NumpySeeded(4294967295u);
  EXPECT_DOUBLE_EQ(m.NumpyDouble(), 0.0976320289940138);
}

}  // namespace
}  // namespace kimirt::eval
