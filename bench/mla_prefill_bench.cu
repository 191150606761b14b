// MLA prefill attention (issue 14) at Kimi-Linear-48B's widths (configs/kimi-linear-48b-a3b.json:
// 32 heads, dn = dv = 128, dr = 64, latent 512), side by side with today's path in the same run:
//   kernel   the flash-attention kernel on tensor cores (cuda::MlaPrefillAttention, BF16 k_nope ‖ v
//            and k_s already expanded), each of its shapes (kernels.h kMlaPrefillVariants: the
//            same bits, so speed alone picks the default), against cuda::CausalAttention (the
//            F32 CUDA-core kernel the F32 path runs) over the same values in F32: ms and TFLOP/s
//            of the causal FLOPs, Σ_t (start + t + 1) · H · 2 · (dn + dr + dv);
//   paged    the whole prefill op through the paged BF16 latent cache: KvStorage::AttendPrefill
//            (gather + per-sequence expansion GEMM + BF16 conversion + flash kernel) against
//            today's Gather + Backend::MlaAttention (expanded), both by wall time around the call
//            up to a synchronizing download.
// Cases: T = 8192 new tokens from start 0 (an 8K prompt in one chunk), T = 8192 from start
// 24576 (the last chunk of a 32K prompt), and, new path only (today's would take minutes): a
// 32K prompt in one chunk, in chunks of 8K, and an 8K prompt in chunks of 2K and of 256 (the
// engine's default; each chunk's call expands the whole history again, so the paged time grows
// with the number of chunks, and a 256-token call fills only 4 × 32 blocks). The table
// ends with the ratios the issue asks about: 32K over 8K.
// Inputs are random (a hash, never zeros); every CUDA call is checked. The kernel time is the
// median of --reps event-timed calls after one warm-up; today's kernels, slow, run once each.
//
// Usage: mla_prefill_bench [--reps N] [--skip-old] [--json PATH]
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cuda_bench_util.cuh"
#include "kimirt/backend/backend_factory.h"
#include "kimirt/backend/cuda/kernels.h"

namespace {

constexpr int64_t kH = 32, kDn = 128, kDr = 64, kDv = 128, kR = 512;

using kimirt::bench::Fill;
using kimirt::bench::Median;
using kimirt::bench::TimeMs;

template <typename T>
T* DeviceAlloc(int64_t n) {
  void* p = nullptr;
  BENCH_CUDA_OK(cudaMalloc(&p, static_cast<size_t>(n) * sizeof(T)));
  return static_cast<T*>(p);
}

struct Case {
  const char* name;
  int64_t start, T;
  bool old;       // also time today's path (minutes at 32K from 0: left out there)
  int64_t chunk;  // the T new tokens in calls of this many (the engine's chunked prefill)
};

// The (start, tokens) of each call of a case.
std::vector<std::pair<int64_t, int64_t>> Calls(const Case& c) {
  std::vector<std::pair<int64_t, int64_t>> calls;
  for (int64_t t0 = 0; t0 < c.T; t0 += c.chunk) calls.push_back({c.start + t0, std::min(c.chunk, c.T - t0)});
  return calls;
}

struct Result {
  Case c;
  double gflop = 0, flash_ms = 0, causal_ms = NAN, paged_ms = 0, old_path_ms = NAN, max_diff = 0;
  double variant_ms[kimirt::cuda::kMlaPrefillVariants] = {};  // flash_ms: the default's
  static_assert(kimirt::cuda::kMlaPrefillVariants == 3, "the table prints three variants");
};

double CausalGflop(int64_t start, int64_t T) {
  const double pairs = static_cast<double>(T) * static_cast<double>(start) + 0.5 * T * (T + 1.0);
  return pairs * kH * 2.0 * (kDn + kDr + kDv) * 1e-9;
}

// The two kernels over the same expanded keys and values.
void RunKernels(const Case& c, int reps, bool skip_old, Result* res) {
  const int64_t S = c.start + c.T, dkv = kDn + kDv, dq = kDn + kDr;
  float* q = DeviceAlloc<float>(c.T * kH * dq);
  __nv_bfloat16* kv16 = DeviceAlloc<__nv_bfloat16>(S * kH * dkv);
  __nv_bfloat16* ks16 = DeviceAlloc<__nv_bfloat16>(S * kDr);
  float* kv32 = skip_old ? nullptr : DeviceAlloc<float>(S * kH * dkv);
  float* ks32 = skip_old ? nullptr : DeviceAlloc<float>(S * kDr);
  float* o_new = DeviceAlloc<float>(c.T * kH * kDv);
  float* o_old = skip_old ? nullptr : DeviceAlloc<float>(c.T * kH * kDv);
  Fill(nullptr, q, c.T * kH * dq, 1, 1.0f);
  Fill(kv16, kv32, S * kH * dkv, 2, 1.0f, /*f32_as_bf16=*/true);
  Fill(ks16, ks32, S * kDr, 3, 1.0f, /*f32_as_bf16=*/true);

  // One planned call per chunk, all over the same keys (a chunk's keys are a prefix of them),
  // for each kernel shape; the default's last, so o_new holds its output.
  std::vector<int32_t*> metas;
  auto run_calls = [&](int variant) {
    std::vector<kimirt::cuda::MlaPrefillArgs> calls;
    for (auto [start, n] : Calls(c)) {
      const kimirt::cuda::MlaPrefillPlan plan = kimirt::cuda::PlanMlaPrefill({start}, {n}, {start - c.start}, variant);
      metas.push_back(DeviceAlloc<int32_t>(static_cast<int64_t>(plan.meta.size())));
      BENCH_CUDA_OK(
          cudaMemcpy(metas.back(), plan.meta.data(), plan.meta.size() * sizeof(int32_t), cudaMemcpyHostToDevice));
      kimirt::cuda::MlaPrefillArgs a = kimirt::cuda::PlannedMlaPrefillArgs(plan, metas.back(), kH, kDn, kDr, kDv);
      a.q = q;
      a.kv = kv16;
      a.ks = ks16;
      a.o = o_new;
      calls.push_back(a);
    }
    return TimeMs(nullptr, 1, reps, [&](int) {
      for (const auto& a : calls) kimirt::cuda::MlaPrefillAttention(a, nullptr);
    });
  };
  for (int v = 0; v < kimirt::cuda::kMlaPrefillVariants; ++v) {
    if (v != kimirt::cuda::kMlaPrefillDefaultVariant) res->variant_ms[v] = run_calls(v);
  }
  res->flash_ms = res->variant_ms[kimirt::cuda::kMlaPrefillDefaultVariant] =
      run_calls(kimirt::cuda::kMlaPrefillDefaultVariant);

  if (!skip_old) {
    kimirt::cuda::AttentionArgs o;
    o.T = c.T;
    o.H = kH;
    o.start = c.start;
    o.scale = 1.0f / std::sqrt(static_cast<float>(dq));
    o.q = q;
    o.q_t = kH * dq;
    o.q_h = dq;
    o.ka = kv32;
    o.ka_s = kH * dkv;
    o.ka_h = dkv;
    o.da = kDn;
    o.kb = ks32;
    o.kb_s = kDr;
    o.db = kDr;
    o.v = kv32 + kDn;
    o.v_s = kH * dkv;
    o.v_h = dkv;
    o.dv = kDv;
    o.o = o_old;
    o.o_t = kH * kDv;
    o.o_h = kDv;
    res->causal_ms = TimeMs(nullptr, 0, 1, [&](int) { kimirt::cuda::CausalAttention(o, nullptr); });
    // The two outputs side by side (BF16 P and operands against F32 throughout).
    std::vector<float> hn(static_cast<size_t>(c.T * kH * kDv)), ho(hn.size());
    BENCH_CUDA_OK(cudaMemcpy(hn.data(), o_new, hn.size() * sizeof(float), cudaMemcpyDeviceToHost));
    BENCH_CUDA_OK(cudaMemcpy(ho.data(), o_old, ho.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    for (size_t i = 0; i < hn.size(); ++i) {
      num += (double{hn[i]} - ho[i]) * (double{hn[i]} - ho[i]);
      den += double{ho[i]} * ho[i];
    }
    res->max_diff = std::sqrt(num / std::max(den, 1e-300));
  }
  for (void* p : {static_cast<void*>(q), static_cast<void*>(kv16), static_cast<void*>(ks16), static_cast<void*>(kv32),
                  static_cast<void*>(ks32), static_cast<void*>(o_new), static_cast<void*>(o_old)}) {
    if (p != nullptr) BENCH_CUDA_OK(cudaFree(p));
  }
  for (int32_t* m : metas) BENCH_CUDA_OK(cudaFree(m));
}

// The whole op through the paged BF16 latent cache, new path and old, by wall time.
void RunPaged(kimirt::Backend& be, const Case& c, int reps, bool skip_old, Result* res) {
  using kimirt::DType;
  using kimirt::Tensor;
  const int64_t S = c.start + c.T;
  const int block = 64;
  const int64_t blocks = (S + block - 1) / block;
  auto storage = be.MakeKvStorage({1, block, kR, kDr, DType::kBF16});
  storage->Resize(blocks);
  std::vector<int32_t> table(static_cast<size_t>(blocks));
  for (int64_t i = 0; i < blocks; ++i) table[static_cast<size_t>(i)] = static_cast<int32_t>(blocks - 1 - i);
  Tensor lat = be.Empty({S, kR}), ks = be.Empty({S, kDr});
  Tensor q = be.Empty({c.T, kH * (kDn + kDr)});
  Tensor w = be.Empty({kH * (kDn + kDv), kR}, DType::kBF16);
  Fill(nullptr, static_cast<float*>(lat.raw()), lat.numel(), 4, 1.0f);
  Fill(nullptr, static_cast<float*>(ks.raw()), ks.numel(), 5, 1.0f);
  Fill(nullptr, static_cast<float*>(q.raw()), q.numel(), 6, 1.0f);
  Fill(w.raw(), nullptr, w.numel(), 7, 0.05f);
  BENCH_CUDA_OK(cudaDeviceSynchronize());  // filled on the default stream; the backend has its own
  storage->Write(0, table, 0, lat, ks);
  kimirt::MlaShape shape;
  shape.heads = kH;
  shape.nope_dim = kDn;
  shape.rope_dim = kDr;
  shape.v_dim = kDv;
  shape.latent_dim = kR;
  Tensor o = be.Empty({c.T, kH * kDv});
  auto wall_ms = [&](auto fn) {
    (void)be.Download(o.Rows(0, 1));
    const auto t0 = std::chrono::steady_clock::now();
    fn();
    (void)be.Download(o.Rows(0, 1));  // waits for the backend's stream
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  std::vector<kimirt::PagedPrefill> batches;
  for (auto [start, n] : Calls(c)) {
    batches.emplace_back();
    batches.back().Add(table, start, n, start - c.start);
  }
  auto paged = [&] {
    for (const auto& batch : batches) storage->AttendPrefill(0, batch, q, w, shape, &o);
  };
  wall_ms(paged);
  std::vector<float> ms;
  for (int i = 0; i < reps; ++i) ms.push_back(static_cast<float>(wall_ms(paged)));
  res->paged_ms = Median(ms);
  if (!skip_old) {
    res->old_path_ms = wall_ms([&] {
      Tensor cc = be.Empty({S, kR}), cks = be.Empty({S, kDr});
      storage->Gather(0, table, S, &cc, &cks);
      be.MlaAttention(q, cc, cks, w, shape, c.start, kimirt::MlaForm::kExpanded, &o);
    });
  }
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 5;
  bool skip_old = false;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--skip-old") {
      skip_old = true;
    } else if (a == "--json" && i + 1 < argc) {
      json = argv[++i];
    } else {
      std::fprintf(stderr, "usage: mla_prefill_bench [--reps N] [--skip-old] [--json PATH]\n");
      return 2;
    }
  }
  auto be = kimirt::MakeBackend("cuda");
  if (!be.ok()) {
    std::fprintf(stderr, "mla_prefill_bench: %s\n", be.status().ToString().c_str());
    return 1;
  }
  const Case cases[] = {
      {"8K prompt", 0, 8192, true, 8192},
      {"32K, last 8K chunk", 24576, 8192, true, 8192},
      {"32K prompt", 0, 32768, false, 32768},
      {"32K in 8K chunks", 0, 32768, false, 8192},
      {"8K in 2K chunks", 0, 8192, false, 2048},
      {"8K in 256 chunks", 0, 8192, false, 256}};  // the engine's default prefill chunk
  std::vector<Result> results;
  for (const Case& c : cases) {
    Result r;
    r.c = c;
    r.gflop = CausalGflop(c.start, c.T);
    RunKernels(c, reps, skip_old || !c.old, &r);
    RunPaged(**be, c, reps, skip_old || !c.old, &r);
    results.push_back(r);
    std::fprintf(stderr, "%s done\n", c.name);
  }
  std::printf("MLA prefill, Kimi-Linear-48B widths (H %lld, dn %lld, dr %lld, dv %lld, r %lld); TFLOP/s of causal "
              "FLOPs\n",
              static_cast<long long>(kH), static_cast<long long>(kDn), static_cast<long long>(kDr),
              static_cast<long long>(kDv), static_cast<long long>(kR));
  std::printf("(flash: kernel variant %d, the default; v0-v2 ms: kernels.h MlaPrefillVariant shapes, same bits)\n",
              kimirt::cuda::kMlaPrefillDefaultVariant);
  std::printf("%-20s %6s %6s %9s %9s %8s %8s %8s %8s %10s %8s %9s %10s %8s %9s\n", "case", "start", "T", "GFLOP",
              "flash ms", "TFLOP/s", "v0 ms", "v1 ms", "v2 ms", "causal ms", "TFLOP/s", "speedup", "paged ms",
              "old ms", "rel diff");
  for (const Result& r : results) {
    std::printf("%-20s %6lld %6lld %9.0f %9.3f %8.1f %8.3f %8.3f %8.3f %10.3f %8.1f %8.1fx %10.3f %8.1f %9.2e\n",
                r.c.name, static_cast<long long>(r.c.start), static_cast<long long>(r.c.T), r.gflop, r.flash_ms,
                r.gflop / r.flash_ms, r.variant_ms[0], r.variant_ms[1], r.variant_ms[2], r.causal_ms,
                r.gflop / r.causal_ms, r.causal_ms / r.flash_ms, r.paged_ms, r.old_path_ms, r.max_diff);
  }
  // Issue 14: 32K prefill ≤ 4.5× the 8K one (whole forward); here MLA's share of each.
  auto paged_of = [&](const char* name) -> double {
    for (const Result& r : results) {
      if (std::string(r.c.name) == name) return r.paged_ms;
    }
    return NAN;
  };
  const double p8 = paged_of("8K prompt");
  std::printf("paged 32K / 8K: %.2fx in one chunk, %.2fx in 8K chunks (a linear part would be 4x)\n",
              paged_of("32K prompt") / p8, paged_of("32K in 8K chunks") / p8);
  if (!json.empty()) {
    FILE* f = std::fopen(json.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "mla_prefill_bench: cannot write %s\n", json.c_str());
      return 1;
    }
    std::fprintf(f, "{\"bench\": \"mla_prefill\", \"heads\": %lld, \"nope_dim\": %lld, \"rope_dim\": %lld, "
                    "\"v_dim\": %lld, \"latent_dim\": %lld, \"results\": [\n",
                 static_cast<long long>(kH), static_cast<long long>(kDn), static_cast<long long>(kDr),
                 static_cast<long long>(kDv), static_cast<long long>(kR));
    for (size_t i = 0; i < results.size(); ++i) {
      const Result& r = results[i];
      auto num = [](double v) { return std::isfinite(v) ? std::to_string(v) : std::string("null"); };
      std::fprintf(f,
                   "  {\"case\": \"%s\", \"start\": %lld, \"tokens\": %lld, \"gflop\": %s, \"flash_ms\": %s, "
                   "\"flash_tflops\": %s, \"causal_attention_ms\": %s, \"causal_attention_tflops\": %s, "
                   "\"kernel_speedup\": %s, \"paged_prefill_ms\": %s, \"old_path_ms\": %s, \"path_speedup\": %s, "
                   "\"rel_l2_vs_f32\": %s, \"variant_ms\": [%s, %s, %s]}%s\n",
                   r.c.name, static_cast<long long>(r.c.start), static_cast<long long>(r.c.T), num(r.gflop).c_str(),
                   num(r.flash_ms).c_str(), num(r.gflop / r.flash_ms).c_str(), num(r.causal_ms).c_str(),
                   num(r.gflop / r.causal_ms).c_str(), num(r.causal_ms / r.flash_ms).c_str(), num(r.paged_ms).c_str(),
                   num(r.old_path_ms).c_str(), num(r.old_path_ms / r.paged_ms).c_str(), num(r.max_diff).c_str(),
                   num(r.variant_ms[0]).c_str(), num(r.variant_ms[1]).c_str(), num(r.variant_ms[2]).c_str(),
                   i + 1 < results.size() ? "," : "");
    }
    std::fprintf(f, "]}\n");
    std::fclose(f);
  }
  return 0;
}
