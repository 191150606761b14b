// moe_bench: one MoE layer's routed experts (Backend::MoeExperts, spec §7.2) and its router
// (Backend::MoeRoute: the F32 router GEMV, then top-k) on a device, at the widths the issues
// measure, uniformly random routing:
//   k3          K3: 896 experts of latent 3584 × intermediate 3072, top-16, MXFP4 held as stored
//               (spec §2.9), router 896 × 7168;
//   k3-tp8      the same experts sliced 8 ways along the intermediate width (384), as one rank of
//               TP 8 holds them;
//   kimi-linear Kimi-Linear-48B: 256 experts of 2304 × 1024, top-8, BF16, router 256 × 2304.
// For each batch size, the mean time of one MoeExperts call (--iters calls after warm-up, eager;
// then the call captured in a CUDA graph and replayed, as a decode step runs it: "graph us") and its
// bandwidth: the stored bytes (MXFP4: codes + scales, 4.25 bits a weight; BF16: 2 bytes) of the
// distinct experts the batch chose, each read once, over the time, against --peak-gbps.
// Activations (a few MB) are not counted. The router's time (MoeRoute: its GEMV and top-k, eager
// and in a graph) is reported beside it.
//
// Usage: moe_bench [--device cuda] [--configs k3,k3-tp8,kimi-linear] [--batch-sizes 1,8,32,64]
//                  [--iters 50] [--peak-gbps 4800] [--router-dtype stored|f32] [--json FILE]
// The router is held as the loader holds it (--router-dtype stored: BF16 where the backend takes
// it as stored, Backend::RouterAsStored) or widened to F32 (the engine's hold before session 28).
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

#include "backend_timing.h"
#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/dtype_convert.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

// An environment switch's value as the run saw it, for the JSON ("" when unset).
std::string EnvValue(const char* name) {
  const char* v = std::getenv(name);
  return v != nullptr ? v : "";
}

struct Config {
  std::string name;
  int64_t experts, latent, inter, top_k, hidden;
  bool mxfp4;
  GluParams glu;
};

const std::vector<Config>& Configs() {
  static const std::vector<Config> configs = {
      {"k3", 896, 3584, 3072, 16, 7168, true, GluParams{GluKind::kSitu, 4.0f, 25.0f}},
      {"k3-tp8", 896, 3584, 384, 16, 7168, true, GluParams{GluKind::kSitu, 4.0f, 25.0f}},
      {"kimi-linear", 256, 2304, 1024, 8, 2304, false, GluParams{GluKind::kSilu, 1.0f, std::nullopt}},
  };
  return configs;
}

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

Tensor RandomF32(Shape shape, SplitMix64& rng, float scale) {
  Tensor t = Tensor::Host(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = scale * rng.FastNormal();
  return t;
}

Tensor Bf16ToF32Host(const Tensor& b) {
  Tensor f = Tensor::Host(b.shape());
  Bf16ToF32(static_cast<const uint16_t*>(b.raw()), f.f32(), static_cast<size_t>(b.numel()));
  return f;
}

Tensor RandomBf16(Shape shape, SplitMix64& rng) {
  const Tensor f = RandomF32(shape, rng, 0.02f);
  Tensor b = Tensor::Host(std::move(shape), DType::kBF16);
  F32ToBf16(f.f32(), static_cast<uint16_t*>(b.raw()), static_cast<size_t>(f.numel()));
  return b;
}

// Four random experts' bytes, uploaded as all of the config's experts (the values do not
// matter to the time). Returns the stored bytes of one expert.
uint64_t MakeExperts(Backend& be, const Config& c, SplitMix64& rng, ExpertWeights* ex) {
  std::vector<std::vector<Tensor>> hosts;
  for (int h = 0; h < 4; ++h) {
    if (c.mxfp4) {
      hosts.push_back({RandomBytes({c.inter, c.latent / 2}, rng), RandomBytes({c.inter, c.latent / 2}, rng),
                       RandomBytes({c.latent, c.inter / 2}, rng), RandomBytes({c.inter, c.latent / 32}, rng, 118, 122),
                       RandomBytes({c.inter, c.latent / 32}, rng, 118, 122),
                       RandomBytes({c.latent, c.inter / 32}, rng, 118, 122)});
    } else {
      hosts.push_back({RandomBf16({c.inter, c.latent}, rng), RandomBf16({c.inter, c.latent}, rng),
                       RandomBf16({c.latent, c.inter}, rng)});
    }
  }
  uint64_t bytes = 0;
  for (const Tensor& t : hosts[0]) bytes += t.nbytes();
  for (int64_t e = 0; e < c.experts; ++e) {
    const std::vector<Tensor>& h = hosts[static_cast<size_t>(e % 4)];
    ex->gate.push_back(be.Upload(h[0]));
    ex->up.push_back(be.Upload(h[1]));
    ex->down.push_back(be.Upload(h[2]));
    if (c.mxfp4) {
      ex->gate_scales.push_back(be.Upload(h[3]));
      ex->up_scales.push_back(be.Upload(h[4]));
      ex->down_scales.push_back(be.Upload(h[5]));
    }
  }
  return bytes;
}


int Run(int argc, char** argv) {
  std::string device = "cuda", json_path;
  std::vector<std::string> names = {"k3", "k3-tp8", "kimi-linear"};
  std::vector<int64_t> batches = {1, 8, 32, 64};
  int iters = 50;
  double peak = 4800;
  bool router_f32 = false;
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
    } else if (a == "--router-dtype" && (v == "stored" || v == "f32")) {
      router_f32 = v == "f32";
    } else if (a == "--batch-sizes" || a == "--configs") {
      std::stringstream ss(v);
      if (a == "--configs") {
        names.clear();
        for (std::string b; std::getline(ss, b, ',');) names.push_back(b);
      } else {
        batches.clear();
        for (std::string b; std::getline(ss, b, ',');) batches.push_back(std::atoll(b.c_str()));
      }
    } else {
      std::fprintf(stderr, "moe_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (device == "cpu") {
    std::fprintf(stderr, "moe_bench: MXFP4 experts held as stored need a GPU backend (the CPU widens them)\n");
    return 2;
  }
  if (iters < 1) {
    std::fprintf(stderr, "moe_bench: --iters must be at least 1\n");
    return 2;
  }
  auto made = MakeBackend(device);
  if (!made.ok()) {
    std::fprintf(stderr, "moe_bench: %s\n", made.status().ToString().c_str());
    return 1;
  }
  Backend& be = **made;
  SplitMix64 rng(20261201);
  nlohmann::ordered_json report;
  report["device"] = device;
  report["peak_gb_per_s"] = peak;
  report["configs"] = nlohmann::ordered_json::array();
  std::printf("%-12s %6s %8s %10s %10s %10s %9s %10s %9s %9s %9s\n", "config", "batch", "experts", "MB read",
              "us/layer", "GB/s", "of peak", "router us", "graph us", "of peak", "router g");
  for (const std::string& name : names) {
    const auto it = std::find_if(Configs().begin(), Configs().end(), [&](const Config& c) { return c.name == name; });
    if (it == Configs().end()) {
      std::fprintf(stderr, "moe_bench: unknown config %s (k3, k3-tp8, kimi-linear)\n", name.c_str());
      return 2;
    }
    const Config& c = *it;
    ExpertWeights ex;
    const uint64_t expert_bytes = MakeExperts(be, c, rng, &ex);
    // Held as the model's loader holds them (LoadModelWeights → HoldExpertWeights): on CUDA BF16
    // experts decode-tiled unless KIMIRT_DECODE_TILED=0, MXFP4 codes tiled unless
    // KIMIRT_MXFP4_TILED=0 (which wants bf16_prefill, serve's default with BF16 weights).
    be.set_bf16_prefill(true);
    be.HoldExpertWeights(&ex, nullptr, nullptr, nullptr);
    ex.light_load = LightRoutedLoad(c.top_k, c.experts);  // as the loader sets it from the config
    // The router as the loader holds it: as stored (BF16) where the backend's router math takes
    // it (Backend::RouterAsStored, CUDA), else widened to F32 (--router-dtype f32: F32 anyway).
    const Tensor router_bf16 = RandomBf16({c.experts, c.hidden}, rng);
    const Tensor router = be.Upload(be.RouterAsStored() && !router_f32 ? router_bf16 : Bf16ToF32Host(router_bf16));
    const Tensor bias = be.Upload(RandomF32({c.experts}, rng, 0.01f));
    RouteParams rp;
    rp.top_k = c.top_k;
    nlohmann::ordered_json cj = {{"config", c.name},
                                 {"experts", c.experts},
                                 {"latent", c.latent},
                                 {"intermediate", c.inter},
                                 {"light_load", ex.light_load},
                                 {"part_columns_env", EnvValue("KIMIRT_MOE_PART_COLUMNS")},
                                 {"top_k", c.top_k},
                                 {"weights", c.mxfp4 ? "MXFP4" : "BF16"},
                                 {"decode_tiled_env", EnvValue("KIMIRT_DECODE_TILED")},
                                 {"mxfp4_tiled_env", EnvValue("KIMIRT_MXFP4_TILED")},
                                 {"expert_bytes", expert_bytes},
                                 {"router_bytes", router.nbytes()},
                                 {"router_dtype", DTypeName(router.dtype())},
                                 {"points", nlohmann::ordered_json::array()}};
    for (int64_t T : batches) {
      Tensor z = RandomF32({T, c.latent}, rng, 1.0f), y = RandomF32({T, c.hidden}, rng, 1.0f);
      Tensor idx = Tensor::Host({T, c.top_k}, DType::kI32), w = Tensor::Host({T, c.top_k});
      std::set<int32_t> distinct;
      std::vector<int32_t> perm(static_cast<size_t>(c.experts));
      for (int64_t t = 0; t < T; ++t) {
        std::iota(perm.begin(), perm.end(), 0);
        for (int64_t j = 0; j < c.top_k; ++j) {
          std::swap(perm[static_cast<size_t>(j)],
                    perm[static_cast<size_t>(j + static_cast<int64_t>(rng.Next() % (c.experts - j)))]);
          idx.i32()[t * c.top_k + j] = perm[static_cast<size_t>(j)];
          distinct.insert(perm[static_cast<size_t>(j)]);
          w.f32()[t * c.top_k + j] = 1.0f / static_cast<float>(c.top_k);
        }
      }
      Tensor dz = be.Upload(z), dy = be.Upload(y), didx = be.Upload(idx), dw = be.Upload(w);
      Tensor out = be.Empty({T, c.latent});
      Tensor ridx = be.Empty({T, c.top_k}, DType::kI32), rw = be.Empty({T, c.top_k});
      const double s = SecondsPerCall(be, out, iters, [&] { be.MoeExperts(dz, didx, dw, ex, c.glu, &out); });
      const double rs = SecondsPerCall(be, rw, iters, [&] { be.MoeRoute(dy, router, bias, rp, &ridx, &rw); });
      const std::string key = "moe_bench:" + c.name + ":" + std::to_string(T);
      Tensor gout = be.Empty({T, c.latent}), grw = be.Empty({T, c.top_k});
      const double sg = GraphSecondsPerCall(be, key + ":experts", gout, iters,
                                            [&] { be.MoeExperts(dz, didx, dw, ex, c.glu, &gout); });
      const double rsg = GraphSecondsPerCall(be, key + ":route", grw, iters,
                                             [&] { be.MoeRoute(dy, router, bias, rp, &ridx, &grw); });
      const uint64_t bytes = distinct.size() * expert_bytes;
      const double gbps = static_cast<double>(bytes) / s / 1e9;
      const double gbps_graph = sg > 0 ? static_cast<double>(bytes) / sg / 1e9 : 0.0;
      std::printf("%-12s %6lld %8zu %10.1f %10.1f %10.1f %9.3f %10.1f %9.1f %9.3f %9.1f\n", c.name.c_str(),
                  static_cast<long long>(T), distinct.size(), static_cast<double>(bytes) / 1e6, s * 1e6, gbps,
                  gbps / peak, rs * 1e6, sg * 1e6, gbps_graph / peak, rsg * 1e6);
      cj["points"].push_back({{"batch", T},
                              {"distinct_experts", distinct.size()},
                              {"bytes", bytes},
                              {"seconds_per_call", s},
                              {"gb_per_s", gbps},
                              {"bandwidth_fraction", gbps / peak},
                              {"router_seconds_per_call", rs},
                              {"seconds_per_call_graph", sg},
                              {"bandwidth_fraction_graph", gbps_graph / peak},
                              {"router_seconds_per_call_graph", rsg},
                              {"router_bandwidth_fraction", static_cast<double>(router.nbytes()) / rs / 1e9 / peak}});
    }
    report["configs"].push_back(cj);
  }
  if (!json_path.empty()) std::ofstream(json_path) << report.dump(2) << "\n";
  return 0;
}

}  // namespace
}  // namespace kimirt

int main(int argc, char** argv) { return kimirt::Run(argc, argv); }
