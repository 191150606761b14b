// Host emulation of the paged MLA decode split on tensor cores (see ../mla_decode_emulate.sh): runs
// chosen (sequence, split) blocks of mla_decode_kernels.cu's two variants over random paged
// latents and checks, per block and head, the split's max m, its sum l and its normalized ō
// against a float64 softmax over the same positions (the codes widened exactly, FP8 scales
// applied), that nothing outside the blocks' outputs is written (outputs NaN-poisoned first),
// and that ring2's outputs are bit-identical to ring4's.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "kernel_host.cpp"

namespace {

using kimirt::cuda::PagedDecodeArgs;
constexpr int kW = 576, kR = 512, kThreadsPerBlock = 256;

uint64_t g_state = 20261201;
double Uniform() {
  g_state = g_state * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<double>(g_state >> 11) * 0x1.0p-53;
}

struct Case {
  std::string name;
  int kind;  // 1 BF16, 2 FP8 E4M3 with per-row scales
  int64_t heads;
  int block_size;
  std::vector<int> context;                  // per sequence
  std::vector<std::array<int32_t, 3>> work;  // (sequence, first position, end)
  std::vector<int> run;                      // the work items emulated (the others must stay unwritten)
};

struct Cache {
  int layers = 2, layer = 1, block_size = 0, blocks = 0;
  std::vector<uint16_t> bf16;     // [blocks, layers, block_size, kW]
  std::vector<uint8_t> fp8;       // the same, E4M3 codes
  std::vector<float> scales;      // [blocks, layers, block_size, 2]
  std::vector<int32_t> tables, table_begin;
  // Row `pos` of sequence b as F64 values (scales applied).
  double At(int kind, int b, int pos, int e) const {
    const int32_t blk = tables[static_cast<size_t>(table_begin[static_cast<size_t>(b)] + pos / block_size)];
    const size_t row = (static_cast<size_t>(blk) * layers + layer) * block_size + pos % block_size;
    if (kind == 1) return BfToF(bf16[row * kW + e]);
    return double{E4m3ToFloat(fp8[row * kW + e])} * scales[row * 2 + (e < kR ? 0 : 1)];
  }
};

// One block of `kernel` (blockIdx = (bx, by)) as 256 threads over a fresh shared-memory buffer
// (filled with garbage, as the device's is).
template <class Kernel>
void RunBlock(Kernel kernel, size_t smem_bytes, const PagedDecodeArgs& a, const float* qc, float* part_o,
              float* part_ml, unsigned bx, unsigned by) {
  const size_t n = (smem_bytes + 127) / 128 * 128;
  auto* smem = static_cast<unsigned char*>(std::aligned_alloc(128, n));
  for (size_t i = 0; i < n; ++i) smem[i] = static_cast<unsigned char>(0x5a ^ (i * 131));
  g_smem = smem;
  BlockCtx ctx;
  g_ctx = &ctx;
  blockIdx = {bx, by, 0};
  RunBlockThreads(kThreadsPerBlock, [&](unsigned) { kernel(a, qc, part_o, part_ml); });
  std::free(smem);
}

int Check(const Case& c) {
  Cache cache;
  cache.block_size = c.block_size;
  const int B = static_cast<int>(c.context.size());
  // Every sequence's blocks dealt from one pool in a shuffled order (non-contiguous tables), a few
  // blocks nobody owns.
  int total = 0;
  for (int ctx : c.context) total += (ctx + cache.block_size - 1) / cache.block_size;
  cache.blocks = total + 3;
  std::vector<int32_t> pool(static_cast<size_t>(cache.blocks));
  for (int i = 0; i < cache.blocks; ++i) pool[static_cast<size_t>(i)] = i;
  for (int i = cache.blocks - 1; i > 0; --i) std::swap(pool[static_cast<size_t>(i)], pool[static_cast<size_t>(Uniform() * (i + 1))]);
  for (int b = 0, next = 0; b < B; ++b) {
    cache.table_begin.push_back(static_cast<int32_t>(cache.tables.size()));
    for (int i = 0; i < (c.context[static_cast<size_t>(b)] + cache.block_size - 1) / cache.block_size; ++i) {
      cache.tables.push_back(pool[static_cast<size_t>(next++)]);
    }
  }
  cache.table_begin.push_back(static_cast<int32_t>(cache.tables.size()));
  const size_t rows = static_cast<size_t>(cache.blocks) * cache.layers * cache.block_size;
  cache.bf16.resize(rows * kW);
  cache.fp8.resize(rows * kW);
  cache.scales.resize(rows * 2);
  for (auto& v : cache.bf16) v = BfRn(static_cast<float>(Uniform() * 4 - 2));
  // E4M3 codes of magnitude 2^-3 .. 2^3 and either sign; scales 0.05 .. 0.5.
  for (auto& v : cache.fp8) {
    v = static_cast<uint8_t>((Uniform() < 0.5 ? 0x80 : 0) | (4 + static_cast<int>(Uniform() * 7)) << 3 |
                             static_cast<int>(Uniform() * 8));
  }
  for (auto& v : cache.scales) v = static_cast<float>(0.05 + 0.45 * Uniform());
  std::vector<float> qc(static_cast<size_t>(B * c.heads * kW));
  for (auto& v : qc) v = static_cast<float>(Uniform() * 2 - 1);

  std::vector<int32_t> work;
  for (const auto& w : c.work) work.insert(work.end(), w.begin(), w.end());
  const int32_t work_count = static_cast<int32_t>(c.work.size());
  std::vector<int32_t> context(c.context.begin(), c.context.end());
  PagedDecodeArgs a;
  a.values = c.kind == 1 ? static_cast<const void*>(cache.bf16.data()) : static_cast<const void*>(cache.fp8.data());
  a.scales = c.kind == 2 ? cache.scales.data() : nullptr;
  a.kind = c.kind;
  a.layers = cache.layers;
  a.layer = cache.layer;
  a.block_size = cache.block_size;
  a.r = kR;
  a.dr = kW - kR;
  a.B = B;
  a.H = c.heads;
  a.scale = static_cast<float>(1.0 / std::sqrt(192.0));
  a.work_count = &work_count;
  a.context = context.data();
  a.table_begin = cache.table_begin.data();
  a.tables = cache.tables.data();
  a.work = work.data();
  a.num_work = work_count;
  if (!kimirt::cuda::MlaPagedDecodeTcSupported(a)) {
    std::printf("FAIL %s: not supported\n", c.name.c_str());
    return 1;
  }

  const size_t n_o = static_cast<size_t>(work_count * c.heads * kR), n_ml = static_cast<size_t>(work_count * c.heads * 2);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> o4(n_o, nan), ml4(n_ml, nan), o2(n_o, nan), ml2(n_ml, nan);
  const unsigned head_blocks = static_cast<unsigned>((c.heads + 15) / 16);
  using kimirt::cuda::Ring2;
  using kimirt::cuda::Ring4;
  using kimirt::cuda::Smem;
  for (int w : c.run) {
    for (unsigned by = 0; by < head_blocks; ++by) {
      if (c.kind == 1) {
        RunBlock(kimirt::cuda::MlaDecodeTcKernel<1>, sizeof(Smem<1, Ring4>), a, qc.data(),
                 o4.data(), ml4.data(), static_cast<unsigned>(w), by);
        RunBlock(kimirt::cuda::MlaDecodeTcRing2Kernel<1>, sizeof(Smem<1, Ring2>), a,
                 qc.data(), o2.data(), ml2.data(), static_cast<unsigned>(w), by);
      } else {
        RunBlock(kimirt::cuda::MlaDecodeTcKernel<2>, sizeof(Smem<2, Ring4>), a, qc.data(),
                 o4.data(), ml4.data(), static_cast<unsigned>(w), by);
        RunBlock(kimirt::cuda::MlaDecodeTcRing2Kernel<2>, sizeof(Smem<2, Ring2>), a,
                 qc.data(), o2.data(), ml2.data(), static_cast<unsigned>(w), by);
      }
    }
  }

  int failures = 0;
  double worst = 0;  // the largest ō relative L2 seen
  auto fail = [&](const std::string& what) {
    if (failures++ < 12) std::printf("FAIL %s: %s\n", c.name.c_str(), what.c_str());
  };
  const bool same_bits = std::memcmp(o4.data(), o2.data(), n_o * 4) == 0 && std::memcmp(ml4.data(), ml2.data(), n_ml * 4) == 0;
  if (!same_bits) fail("ring2's outputs are not ring4's bits");
  for (const auto* variant : {&o4, &o2}) {
    const std::vector<float>& o = *variant;
    const std::vector<float>& ml = variant == &o4 ? ml4 : ml2;
    const char* name = variant == &o4 ? "ring4" : "ring2";
    for (int w = 0; w < work_count; ++w) {
      const bool ran = std::find(c.run.begin(), c.run.end(), w) != c.run.end();
      const auto [b, s0, s1] = c.work[static_cast<size_t>(w)];
      for (int64_t h = 0; h < c.heads; ++h) {
        const float* oh = o.data() + (w * c.heads + h) * kR;
        const float m = ml[static_cast<size_t>((w * c.heads + h) * 2)], l = ml[static_cast<size_t>((w * c.heads + h) * 2 + 1)];
        const std::string where = std::string(name) + " work " + std::to_string(w) + " head " + std::to_string(h);
        if (!ran) {
          bool untouched = std::isnan(m) && std::isnan(l);
          for (int d = 0; d < kR; ++d) untouched = untouched && std::isnan(oh[d]);
          if (!untouched) fail(where + ": written, but no block of it ran");
          continue;
        }
        const float* q = qc.data() + (b * c.heads + h) * kW;
        std::vector<double> s;
        for (int t = s0; t < s1; ++t) {
          double dot = 0;
          for (int e = 0; e < kW; ++e) dot += double{q[e]} * cache.At(c.kind, b, t, e);
          s.push_back(dot * a.scale);
        }
        const double m_ref = *std::max_element(s.begin(), s.end());
        double l_ref = 0;
        std::vector<double> o_ref(kR, 0.0);
        for (int t = s0; t < s1; ++t) {
          const double p = std::exp(s[static_cast<size_t>(t - s0)] - m_ref);
          l_ref += p;
          for (int d = 0; d < kR; ++d) o_ref[static_cast<size_t>(d)] += p * cache.At(c.kind, b, t, d);
        }
        // The scores carry q̄'s hi + lo rounding (2⁻¹⁷ of each product): m and l within 5e-5.
        if (!(std::fabs(m - m_ref) <= 5e-5 * std::max(1.0, std::fabs(m_ref)))) {
          fail(where + ": max " + std::to_string(m) + ", float64 " + std::to_string(m_ref));
        }
        const double l_scaled = l * std::exp(double{m} - m_ref);
        if (!(std::fabs(l_scaled - l_ref) <= 5e-5 * l_ref)) {
          fail(where + ": sum " + std::to_string(l_scaled) + ", float64 " + std::to_string(l_ref));
        }
        double num = 0, den = 0;
        for (int d = 0; d < kR; ++d) {
          const double got = oh[d] / double{l}, want = o_ref[static_cast<size_t>(d)] / l_ref;
          num += std::isnan(got) ? INFINITY : (got - want) * (got - want);
          den += want * want;
        }
        // q̄ and P go in as hi + lo BF16 parts (16 significant bits): ~1e-5, the CUDA tests' 2e-5.
        worst = std::max(worst, std::sqrt(num / den));
        if (!(std::sqrt(num / den) <= 2e-5)) fail(where + ": ō relative L2 " + std::to_string(std::sqrt(num / den)));
      }
    }
  }
  std::printf("%s %s: %zu blocks x %u head groups x 2 variants, ring2 %s ring4's bits, worst ō relative L2 %.2g\n",
              failures == 0 ? "ok  " : "FAIL", c.name.c_str(), c.run.size(), head_blocks, same_bits ? "=" : "!=", worst);
  return failures;
}

}  // namespace

int main() {
  // Sequence 1 (999 positions in a shuffled pool of blocks) split as the schedule does (64 a
  // split: the first, a middle one, the last of 39), a split of 300 starting mid-block (10 tiles:
  // both rings wrap), one position; sequence 0 (333) whole (11 tiles) and its last 13. Blocks of
  // 16 (two a tile), 48 (not a power of two) and 64 positions. The work items not run must stay
  // unwritten.
  const std::vector<std::array<int32_t, 3>> work = {{1, 0, 64},  {1, 448, 512}, {1, 960, 999}, {1, 37, 337},
                                                    {1, 998, 999}, {0, 0, 333},  {0, 320, 333}, {0, 64, 128}};
  const std::vector<Case> cases = {
      {"bf16_heads20_block16", 1, 20, 16, {333, 999}, work, {0, 2, 3, 4, 5}},
      {"fp8_heads12_block48", 2, 12, 48, {333, 999}, work, {1, 2, 3, 5, 6}},
      {"bf16_heads32_block64", 1, 32, 64, {333, 999}, work, {3, 6, 7}},
      {"fp8_heads32_block16", 2, 32, 16, {333, 999}, work, {0, 3}},
  };
  using kimirt::cuda::Ring2;
  using kimirt::cuda::Ring4;
  using kimirt::cuda::Smem;
  std::printf("shared memory a block: ring4 BF16 %zu, FP8 %zu bytes; ring2 BF16 %zu, FP8 %zu bytes\n",
              sizeof(Smem<1, Ring4>), sizeof(Smem<2, Ring4>),
              sizeof(Smem<1, Ring2>), sizeof(Smem<2, Ring2>));
  int failures = 0;
  for (const Case& c : cases) failures += Check(c);
  std::printf("%s\n", failures == 0 ? "all passed" : "FAILED");
  return failures == 0 ? 0 : 1;
}
