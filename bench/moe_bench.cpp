// moe_bench: one K3 MoE layer's routed experts (Backend::MoeExperts) on a device, MXFP4 held as
// stored (spec §2.9, §7.2): 896 experts of latent 3584 × intermediate 3072, top-16, random codes
// and scales, uniformly random routing. For each batch size, the time of one MoeExperts call (the
// mean of --iters calls after warm-up) and its bandwidth: the stored bytes (codes + scales, 4.25
// bits a weight) of the distinct experts the batch chose, each read once, over the time, against
// --peak-gbps. Activations (a few MB) are not counted.
//
// Usage: moe_bench [--device cuda] [--batch-sizes 1,32] [--iters 50] [--peak-gbps 4800] [--json FILE]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <numeric>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

constexpr int64_t kExperts = 896, kLatent = 3584, kInter = 3072, kTopK = 16;

Tensor RandomBytes(Shape shape, SplitMix64& rng, int lo = 0, int hi = 255) {
  Tensor t = Tensor::Host(std::move(shape), DType::kU8);
  uint8_t* p = static_cast<uint8_t*>(t.raw());
  if (lo == 0 && hi == 255) {
    for (int64_t i = 0; i < t.numel(); i += 8) {
      const uint64_t r = rng.Next();
      std::memcpy(p + i, &r, static_cast<size_t>(std::min<int64_t>(8, t.numel() - i)));
    }
  } else {
    for (int64_t i = 0; i < t.numel(); ++i) p[i] = static_cast<uint8_t>(lo + rng.Next() % (hi - lo + 1));
  }
  return t;
}

int Run(int argc, char** argv) {
  std::string device = "cuda", json_path;
  std::vector<int64_t> batches = {1, 32};
  int iters = 50;
  double peak = 4800;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--device") {
      device = v;
    } else if (a == "--iters") {
      iters = std::atoi(v.c_str());
    } else if (a == "--peak-gbps") {
      peak = std::atof(v.c_str());
    } else if (a == "--json") {
      json_path = v;
    } else if (a == "--batch-sizes") {
      batches.clear();
      std::stringstream ss(v);
      for (std::string b; std::getline(ss, b, ',');) batches.push_back(std::atoll(b.c_str()));
    } else {
      std::fprintf(stderr, "moe_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (device == "cpu") {
    std::fprintf(stderr, "moe_bench: MXFP4 experts held as stored need a GPU backend (the CPU widens them)\n");
    return 2;
  }
  auto made = MakeBackend(device);
  if (!made.ok()) {
    std::fprintf(stderr, "moe_bench: %s\n", made.status().ToString().c_str());
    return 1;
  }
  Backend& be = **made;
  SplitMix64 rng(20261201);
  // Four random experts' bytes, uploaded as all 896 (the values do not matter to the time).
  struct Host {
    Tensor g, u, d, gs, us, ds;
  };
  std::vector<Host> hosts;
  for (int h = 0; h < 4; ++h) {
    hosts.push_back({RandomBytes({kInter, kLatent / 2}, rng), RandomBytes({kInter, kLatent / 2}, rng),
                     RandomBytes({kLatent, kInter / 2}, rng), RandomBytes({kInter, kLatent / 32}, rng, 118, 122),
                     RandomBytes({kInter, kLatent / 32}, rng, 118, 122), RandomBytes({kLatent, kInter / 32}, rng, 118, 122)});
  }
  ExpertWeights ex;
  uint64_t expert_bytes = 0;
  for (int64_t e = 0; e < kExperts; ++e) {
    const Host& h = hosts[static_cast<size_t>(e % 4)];
    ex.gate.push_back(be.Upload(h.g));
    ex.up.push_back(be.Upload(h.u));
    ex.down.push_back(be.Upload(h.d));
    ex.gate_scales.push_back(be.Upload(h.gs));
    ex.up_scales.push_back(be.Upload(h.us));
    ex.down_scales.push_back(be.Upload(h.ds));
    if (e == 0) {
      for (const Tensor* t : {&h.g, &h.u, &h.d, &h.gs, &h.us, &h.ds}) expert_bytes += t->nbytes();
    }
  }
  const GluParams situ{GluKind::kSitu, 4.0f, 25.0f};
  nlohmann::ordered_json report;
  report["device"] = device;
  report["experts"] = kExperts;
  report["latent"] = kLatent;
  report["intermediate"] = kInter;
  report["top_k"] = kTopK;
  report["expert_bytes"] = expert_bytes;
  report["peak_gb_per_s"] = peak;
  report["points"] = nlohmann::ordered_json::array();
  std::printf("%8s %10s %12s %12s %10s %10s\n", "batch", "experts", "MB read", "us/call", "GB/s", "of peak");
  for (int64_t T : batches) {
    Tensor z = Tensor::Host({T, kLatent}), idx = Tensor::Host({T, kTopK}, DType::kI32), w = Tensor::Host({T, kTopK});
    for (int64_t i = 0; i < z.numel(); ++i) z.f32()[i] = rng.FastNormal();
    std::set<int32_t> distinct;
    std::vector<int32_t> perm(static_cast<size_t>(kExperts));
    for (int64_t t = 0; t < T; ++t) {
      std::iota(perm.begin(), perm.end(), 0);
      for (int64_t j = 0; j < kTopK; ++j) {
        std::swap(perm[static_cast<size_t>(j)], perm[static_cast<size_t>(j + static_cast<int64_t>(rng.Next() % (kExperts - j)))]);
        idx.i32()[t * kTopK + j] = perm[static_cast<size_t>(j)];
        distinct.insert(perm[static_cast<size_t>(j)]);
        w.f32()[t * kTopK + j] = 1.0f / kTopK;
      }
    }
    Tensor dz = be.Upload(z), didx = be.Upload(idx), dw = be.Upload(w), out = be.Empty({T, kLatent});
    for (int i = 0; i < 3; ++i) be.MoeExperts(dz, didx, dw, ex, situ, &out);
    be.Download(out);  // waits for the stream
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i) be.MoeExperts(dz, didx, dw, ex, situ, &out);
    be.Download(out);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
    const uint64_t bytes = distinct.size() * expert_bytes;
    const double gbps = static_cast<double>(bytes) / s / 1e9;
    std::printf("%8lld %10zu %12.1f %12.1f %10.1f %10.3f\n", static_cast<long long>(T), distinct.size(),
                static_cast<double>(bytes) / 1e6, s * 1e6, gbps, gbps / peak);
    report["points"].push_back({{"batch", T},
                                {"distinct_experts", distinct.size()},
                                {"bytes", bytes},
                                {"seconds_per_call", s},
                                {"gb_per_s", gbps},
                                {"bandwidth_fraction", gbps / peak}});
  }
  if (!json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kimirt

int main(int argc, char** argv) { return kimirt::Run(argc, argv); }
