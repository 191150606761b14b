// Deterministic random numbers that do not depend on the standard library's distribution
// implementations (std::normal_distribution differs between libstdc++ and libc++), so a
// checkpoint written with --random --seed N is the same everywhere.
#pragma once

#include <cmath>
#include <cstdint>
#include <string_view>

namespace kimirt {

// SplitMix64 (Steele, Lea, Flood 2014): small, fast, good enough for test weights.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) : state_(seed) {}
  uint64_t Next() {
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  // Uniform in [0, 1) with 53 random bits.
  double Uniform() { return static_cast<double>(Next() >> 11) * 0x1.0p-53; }
  // Standard normal by Box-Muller (one value per call; simple beats fast here).
  double Normal() {
    const double u1 = 1.0 - Uniform();  // (0, 1]
    const double u2 = Uniform();
    return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
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
