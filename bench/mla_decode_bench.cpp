// mla_decode_bench: the paged absorbed MLA decode op (KvStorage::AttendDecode, backend.h) on a
// device, as a fraction of the memory roofline (issue 12).
//
//   mla_decode_bench [--device cuda] [--contexts 4096,8192,32768,131072] [--dtypes bf16,fp8]
//                    [--heads 32] [--batch 1] [--iters 100] [--peak-gbps 4800] [--json OUT.json]
//
// One MLA layer at K3 / Kimi-Linear widths (latent 512 + shared key 64, head dims 128), a pool
// of 64-token blocks handed out in reverse (tables run downwards, like a pool in use), random
// latents. Each call is one decode step of `batch` sequences of the same context. Time per call
// is the wall time of --iters back-to-back calls over the count (the queue stays full; one
// download at the end waits for it): eager (`us/call`: every launch from the host, as with
// --enforce-eager), and, where the backend has graphs, the same call captured once and replayed
// (`graph us`: the GPU's time, as a decode step in a graph sees it). Bytes are what the op must read: the latent codes of every
// position (values and, for FP8, the two F32 scales per row); queries, kv_b and outputs are
// left out (they are < 1% at 4K). Uses only the Backend interface, so it builds everywhere and
// says so when the device is missing.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/random.h"

namespace kimirt {
namespace {

double Now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string x; std::getline(in, x, ',');) out.push_back(x);
  return out;
}

Tensor RandomHost(SplitMix64& rng, Shape shape, float scale) {
  Tensor t = Tensor::Host(std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.f32()[i] = scale * rng.FastNormal();
  return t;
}

int Run(int argc, char** argv) {
  std::string device = "cuda", contexts = "4096,8192,32768,131072", dtypes = "bf16,fp8", json;
  int64_t heads = 32, batch = 1, iters = 100;
  double peak_gbps = 4800;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "mla_decode_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--device") device = v;
    else if (a == "--contexts") contexts = v;
    else if (a == "--dtypes") dtypes = v;
    else if (a == "--heads") heads = std::stoll(v);
    else if (a == "--batch") batch = std::stoll(v);
    else if (a == "--iters") iters = std::stoll(v);
    else if (a == "--peak-gbps") peak_gbps = std::stod(v);
    else if (a == "--json") json = v;
    else {
      std::fprintf(stderr, "mla_decode_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  auto made = MakeBackend(device);
  if (!made.ok()) {
    std::fprintf(stderr, "mla_decode_bench: %s\n", made.status().ToString().c_str());
    return 1;
  }
  Backend& be = *made.value();
  SplitMix64 rng(12);
  MlaShape mla;
  mla.heads = heads;
  mla.nope_dim = 128;
  mla.rope_dim = 64;
  mla.v_dim = 128;
  mla.latent_dim = 512;
  const int block = 64;
  nlohmann::json rows = nlohmann::json::array();
  std::printf("%-5s %8s %6s %6s %10s %9s %8s %10s %8s\n", "dtype", "context", "heads", "batch", "us/call", "GB/s",
              "of peak", "graph us", "of peak");
  for (const std::string& dt : Split(dtypes)) {
    KvStorageShape ks;
    ks.layers = 1;
    ks.block_size = block;
    ks.latent_dim = 512;
    ks.rope_dim = 64;
    if (dt == "bf16") ks.dtype = DType::kBF16;
    else if (dt == "fp8") ks.dtype = DType::kF8E4M3;
    else if (dt == "f32") ks.dtype = DType::kF32;
    else {
      std::fprintf(stderr, "mla_decode_bench: unknown dtype %s (bf16, fp8, f32)\n", dt.c_str());
      return 2;
    }
    for (const std::string& cs : Split(contexts)) {
      const int64_t ctx = std::stoll(cs), nb = (ctx + block - 1) / block;
      auto kv = be.MakeKvStorage(ks);
      kv->Resize(nb * batch);
      PagedDecodeStep step;
      std::vector<std::vector<int32_t>> tables(static_cast<size_t>(batch));
      for (int64_t b = 0; b < batch; ++b) {
        for (int64_t i = 0; i < nb; ++i) tables[static_cast<size_t>(b)].push_back(static_cast<int32_t>(nb * batch - 1 - (i * batch + b)));
        // The history in chunks of 4K rows (one upload each).
        for (int64_t p = 0; p < ctx; p += 4096) {
          const int64_t n = std::min<int64_t>(4096, ctx - p);
          kv->Write(0, tables[static_cast<size_t>(b)], p, be.Upload(RandomHost(rng, {n, 512}, 1.0f)),
                    be.Upload(RandomHost(rng, {n, 64}, 1.0f)));
        }
        step.Add(tables[static_cast<size_t>(b)], ctx);
      }
      kv->SetDecodeStep(step);
      Tensor q = be.Upload(RandomHost(rng, {batch, heads * 192}, 1.0f));
      Tensor w = be.Upload(RandomHost(rng, {heads * 256, 512}, 0.05f));
      Tensor o = be.Empty({batch, heads * 128});
      for (int i = 0; i < 5; ++i) kv->AttendDecode(0, q, w, mla, &o);  // warm up
      be.Download(o);
      const double t0 = Now();
      for (int64_t i = 0; i < iters; ++i) kv->AttendDecode(0, q, w, mla, &o);
      be.Download(o);
      const double us = (Now() - t0) / static_cast<double>(iters) * 1e6;
      // The same call as a graph, replayed back to back.
      double us_graph = 0;
      if (be.SupportsGraphs()) {
        const std::string key = "mla_decode_bench:" + dt + ":" + cs;
        be.CaptureBegin(key);
        kv->AttendDecode(0, q, w, mla, &o);
        if (be.CaptureEnd(o)) {
          for (int i = 0; i < 5; ++i) be.Replay(key);
          be.Download(o);
          const double g0 = Now();
          Tensor out;
          for (int64_t i = 0; i < iters; ++i) out = be.Replay(key);
          be.Download(out);
          us_graph = (Now() - g0) / static_cast<double>(iters) * 1e6;
        }
      }
      const double row_bytes = 576.0 * static_cast<double>(DTypeSize(ks.dtype)) + (ks.dtype == DType::kF8E4M3 ? 8.0 : 0.0);
      const double bytes = row_bytes * static_cast<double>(ctx * batch);
      const double gbps = bytes / (us * 1e-6) / 1e9;
      const double gbps_graph = us_graph > 0 ? bytes / (us_graph * 1e-6) / 1e9 : 0.0;
      std::printf("%-5s %8lld %6lld %6lld %10.1f %9.0f %8.3f %10.1f %8.3f\n", dt.c_str(), static_cast<long long>(ctx),
                  static_cast<long long>(heads), static_cast<long long>(batch), us, gbps, gbps / peak_gbps, us_graph,
                  gbps_graph / peak_gbps);
      rows.push_back({{"dtype", dt}, {"context", ctx}, {"heads", heads}, {"batch", batch}, {"us_per_call", us},
                      {"bytes", bytes}, {"gbps", gbps}, {"fraction_of_peak", gbps / peak_gbps},
                      {"us_per_call_graph", us_graph}, {"fraction_of_peak_graph", gbps_graph / peak_gbps}});
    }
  }
  if (!json.empty()) {
    std::ofstream f(json);
    f << nlohmann::json{{"bench", "mla_decode"}, {"device", device}, {"peak_gbps", peak_gbps}, {"results", rows}}.dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kimirt

int main(int argc, char** argv) { return kimirt::Run(argc, argv); }
