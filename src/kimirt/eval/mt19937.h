// MT19937 (Matsumoto & Nishimura 1998) with the two seedings and the draws that the Python tools
// we reproduce use, so our choices match theirs bit for bit:
//   - CPython's random.Random(int): init_by_array over the seed's 32-bit words, getrandbits,
//     _randbelow and sample() (lm-eval draws GSM8K's few-shot examples with
//     random.Random(1234).sample: EleutherAI/lm-evaluation-harness:lm_eval/api/samplers.py).
//   - NumPy's legacy np.random.seed(int): init_genrand, random_sample (53-bit doubles) and the
//     shape-1 gamma (= exponential) draw that `vllm bench serve` uses for Poisson arrivals
//     (vllm-project/vllm:vllm/benchmarks/serve.py, get_request).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kimirt::eval {

class Mt19937 {
 public:
  // CPython random.Random(seed) for a non-negative integer seed (abs() is taken, as CPython does).
  static Mt19937 PythonSeeded(uint64_t seed);
  // NumPy's legacy RandomState(seed) / np.random.seed(seed), seed < 2^32.
  static Mt19937 NumpySeeded(uint32_t seed);

  uint32_t NextUint32();

  // Python's getrandbits(k), 1 <= k <= 64: words are filled least significant first and the
  // last (most significant) word keeps its top bits.
  uint64_t GetRandBits(int k);
  // Python's _randbelow_with_getrandbits(n): rejection sampling on n.bit_length() bits. n >= 1.
  uint64_t RandBelow(uint64_t n);
  // Indices of random.Random.sample(population_of_size_n, k): both CPython algorithms (the pool
  // for small populations, the rejection set otherwise), chosen by CPython's size rule.
  std::vector<size_t> PythonSampleIndices(size_t n, size_t k);

  // NumPy's random_sample(): a 53-bit double in [0, 1) from two words.
  double NumpyDouble();
  // NumPy's legacy standard exponential: -log(1 - random_sample()).
  double NumpyStandardExponential();

 private:
  Mt19937() = default;
  void InitGenrand(uint32_t s);
  void InitByArray(const uint32_t* key, size_t len);
  void Twist();

  static constexpr int kN = 624;
  std::array<uint32_t, kN> mt_{};
  int mti_ = kN + 1;
};

}  // namespace kimirt::eval
