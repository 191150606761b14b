#include "kimirt/eval/mt19937.h"

#include <cmath>
#include <unordered_set>

namespace kimirt::eval {
namespace {
constexpr int kM = 397;
constexpr uint32_t kMatrixA = 0x9908b0dfu;
constexpr uint32_t kUpperMask = 0x80000000u;
constexpr uint32_t kLowerMask = 0x7fffffffu;
}  // namespace

void Mt19937::InitGenrand(uint32_t s) {
  mt_[0] = s;
  for (int i = 1; i < kN; ++i) {
    mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + static_cast<uint32_t>(i);
  }
  mti_ = kN;
}

void Mt19937::InitByArray(const uint32_t* key, size_t len) {
  InitGenrand(19650218u);
  int i = 1;
  size_t j = 0;
  for (size_t k = (kN > len ? kN : len); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + static_cast<uint32_t>(j);
    ++i;
    ++j;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (j >= len) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - static_cast<uint32_t>(i);
    ++i;
    if (i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;  // MSB is 1, assuring a non-zero initial array
  mti_ = kN;
}

Mt19937 Mt19937::PythonSeeded(uint64_t seed) {
  // CPython's random_seed(): the absolute value as little-endian 32-bit words, at least one.
  Mt19937 r;
  uint32_t key[2] = {static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32)};
  r.InitByArray(key, key[1] != 0 ? 2 : 1);
  return r;
}

Mt19937 Mt19937::NumpySeeded(uint32_t seed) {
  Mt19937 r;
  r.InitGenrand(seed);
  return r;
}

void Mt19937::Twist() {
  int k = 0;
  for (; k < kN - kM; ++k) {
    const uint32_t y = (mt_[k] & kUpperMask) | (mt_[k + 1] & kLowerMask);
    mt_[k] = mt_[k + kM] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  }
  for (; k < kN - 1; ++k) {
    const uint32_t y = (mt_[k] & kUpperMask) | (mt_[k + 1] & kLowerMask);
    mt_[k] = mt_[k + (kM - kN)] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  }
  const uint32_t y = (mt_[kN - 1] & kUpperMask) | (mt_[0] & kLowerMask);
  mt_[kN - 1] = mt_[kM - 1] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  mti_ = 0;
}

uint32_t Mt19937::NextUint32() {
  if (mti_ >= kN) Twist();
  uint32_t y = mt_[mti_++];
  y ^= (y >> 11);
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= (y >> 18);
  return y;
}

uint64_t Mt19937::GetRandBits(int k) {
  if (k <= 32) return NextUint32() >> (32 - k);
  const uint64_t low = NextUint32();
  const uint64_t high = NextUint32() >> (64 - k);
  return low | (high << 32);
}

uint64_t Mt19937::RandBelow(uint64_t n) {
  int k = 0;
  for (uint64_t x = n; x != 0; x >>= 1) ++k;  // n.bit_length()
  uint64_t r = GetRandBits(k);
  while (r >= n) r = GetRandBits(k);
  return r;
}

std::vector<size_t> Mt19937::PythonSampleIndices(size_t n, size_t k) {
  std::vector<size_t> result(k);
  // CPython: setsize = 21, plus 4 ** ceil(log(3k, 4)) when k > 5; a list pool when n <= setsize.
  size_t setsize = 21;
  if (k > 5) {
    setsize += static_cast<size_t>(std::pow(4.0, std::ceil(std::log(static_cast<double>(k) * 3.0) / std::log(4.0))));
  }
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = static_cast<size_t>(RandBelow(n - i));
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::unordered_set<size_t> selected;
    for (size_t i = 0; i < k; ++i) {
      size_t j = static_cast<size_t>(RandBelow(n));
      while (selected.count(j) != 0) j = static_cast<size_t>(RandBelow(n));
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

double Mt19937::NumpyDouble() {
  const uint32_t a = NextUint32() >> 5;
  const uint32_t b = NextUint32() >> 6;
  return (static_cast<double>(a) * 67108864.0 + static_cast<double>(b)) / 9007199254740992.0;
}

double Mt19937::NumpyStandardExponential() { return -std::log(1.0 - NumpyDouble()); }

}  // namespace kimirt::eval
