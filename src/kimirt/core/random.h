// Deterministic random numbers that do not depend on the standard library's distribution
// implementations (std::normal_distribution differs between libstdc++ and libc++), so a
// checkpoint written with --random --seed N is the same everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace kimirt {

// SplitMix64 (Steele, Lea, Flood 2014): small, fast, good enough for test weights. It is
// counter-based: output k (from 0) of the stream seeded `s` is Mix(s + (k + 1)·γ), so At(s, k)
// gives any output directly (model/random_weights.h makes every weight so).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  static constexpr uint64_t kGamma = 0x9E3779B97F4A7C15ull;
  static uint64_t Mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Output k of the stream seeded `seed`: what the (k + 1)-th Next() returns.
  static uint64_t At(uint64_t seed, uint64_t k) { return Mix(seed + (k + 1) * kGamma); }
  uint64_t Next() { return Mix(state_ += kGamma); }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return UniformOf(Next()); }
  static double UniformOf(uint64_t r) { return static_cast<double>(r >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller (exact distribution; one value per call).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  }
  // Mean 0, variance 1, bell-shaped: the Irwin-Hall sum of four 16-bit uniforms from one draw,
  // centred and scaled (a sum of 4 U(0,1) has variance 1/3). Tails stop at ±2√3; about 20×
  // cheaper than Normal(), which matters when filling billions of random test weights.
  float FastNormal() { return FastNormalOf(Next()); }
  static float FastNormalOf(uint64_t r) {
    // The sum is below 2^18: exact as an int32 and as a float (int32 converts in vector lanes).
    const int32_t sum = static_cast<int32_t>((r & 0xFFFF) + ((r >> 16) & 0xFFFF) + ((r >> 32) & 0xFFFF) + (r >> 48));
    // (sum / 65536 - mean) * sqrt(3); the mean of sum / 65536 is 4 * 32767.5 / 65536.
    return (static_cast<float>(sum) * (1.0f / 65536.0f) - 1.999969482421875f) * 1.7320508075688772f;
  }

 private:
  uint64_t state_;
};

// FNV-1a of a name, to give every tensor its own stream: seed ^ hash(name).
inline uint64_t HashName(std::string_view s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace kimirt
