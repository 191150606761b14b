// mla_decode_bench: the paged absorbed MLA decode op (KvStorage::AttendDecode, backend.h) on a
// device, as a fraction of the memory roofline (issue 12).
//
//   mla_decode_bench [--device cuda] [--contexts 4096,8192,32768,131072] [--dtypes bf16,fp8]
//                    [--heads 32] [--batch 1] [--iters 100] [--peak-gbps 4800] [--json OUT.json]
//                    [--variants ring4,ring2,wgmma,wgmma-item,wgmma-ws] [--kvb-dtype f32|bf16]
//
// One MLA layer at K3 / Kimi-Linear widths (latent 512 + shared key 64, head dims 128), a pool
// of 64-token blocks handed out in reverse (tables run downwards, like a pool in use), random
// latents. Each call is one decode step of `batch` sequences of the same context. Time per call
// is the wall time of --iters back-to-back calls over the count (the queue stays full; one
// download at the end waits for it): eager (`us/call`: every launch from the host, as with
// --enforce-eager), and, where the backend has graphs, the same call captured once and replayed
// (`graph us`: the GPU's time, as a decode step in a graph sees it). Bytes are what the op must read: the latent codes of every
// position (values and, for FP8, the two F32 scales per row); queries and outputs are left out.
// kv_b (the absorb GEMVs' weight, [heads · 256, 512]) is F32 by default, as the bench always
// held it, or BF16 (--kvb-dtype bf16, as `serve --dtype bfloat16` holds it); its bytes are not
// in `bytes` but each JSON row gives them (`kvb_bytes`) and the fraction with them counted
// (`fraction_of_peak_graph_with_kvb`: the whole op's reads). Uses only the Backend interface, so it builds everywhere and
// says so when the device is missing.
//
// Every variant of the CUDA tensor-core split (KIMIRT_MLA_DECODE_VARIANT, read once a process:
// kernels.h MlaDecodeVariant) is timed in the same run: the measurements of each run in a child
// process of their own with the variable set (the device is opened in the children only), and
// the parent prints them side by side; each JSON row names its `variant`. One variant runs in
// the process itself (a child's _exit would skip a kernel tracer's exit handler: mlatrace).
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "backend_timing.h"
#include "kimirt/backend/backend_factory.h"
#include "kimirt/core/dtype_convert.h"
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

struct Options {
  std::string device = "cuda", contexts = "4096,8192,32768,131072", dtypes = "bf16,fp8", json,
              variants = "ring4,ring2,wgmma,wgmma-ws", kvb_dtype = "f32";
  int64_t heads = 32, batch = 1, iters = 100;
  double peak_gbps = 4800;
};

// The measurements of one process (one variant), printed as they come and appended to `rows`.
int Measure(const Options& opt, const std::string& variant, nlohmann::json& rows) {
  const std::string &device = opt.device, &contexts = opt.contexts, &dtypes = opt.dtypes;
  const int64_t heads = opt.heads, batch = opt.batch, iters = opt.iters;
  const double peak_gbps = opt.peak_gbps;
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
      Tensor w_host = RandomHost(rng, {heads * 256, 512}, 0.05f);
      Tensor w;
      if (opt.kvb_dtype == "bf16") {
        Tensor wb = Tensor::Host(w_host.shape(), DType::kBF16);
        F32ToBf16(w_host.f32(), static_cast<uint16_t*>(wb.raw()), static_cast<size_t>(w_host.numel()));
        w = be.Upload(wb);
      } else {
        w = be.Upload(w_host);
      }
      const double kvb_bytes = static_cast<double>(w.numel() * DTypeSize(w.dtype()));
      Tensor o = be.Empty({batch, heads * 128});
      for (int i = 0; i < 5; ++i) kv->AttendDecode(0, q, w, mla, &o);  // warm up
      be.Download(o);
      const double t0 = Now();
      for (int64_t i = 0; i < iters; ++i) kv->AttendDecode(0, q, w, mla, &o);
      be.Download(o);
      const double us = (Now() - t0) / static_cast<double>(iters) * 1e6;
      // The same call as a graph, replayed back to back.
      const std::string key = "mla_decode_bench:" + dt + ":" + cs;
      const auto attend = [&] { kv->AttendDecode(0, q, w, mla, &o); };
      const double us_graph = 1e6 * GraphSecondsPerCall(be, key, o, static_cast<int>(iters), attend, /*warmup=*/5);
      const double row_bytes = 576.0 * static_cast<double>(DTypeSize(ks.dtype)) + (ks.dtype == DType::kF8E4M3 ? 8.0 : 0.0);
      const double bytes = row_bytes * static_cast<double>(ctx * batch);
      const double gbps = bytes / (us * 1e-6) / 1e9;
      const double gbps_graph = us_graph > 0 ? bytes / (us_graph * 1e-6) / 1e9 : 0.0;
      std::printf("%-10s %-5s %8lld %6lld %6lld %10.1f %9.0f %8.3f %10.1f %8.3f\n", variant.c_str(), dt.c_str(),
                  static_cast<long long>(ctx), static_cast<long long>(heads), static_cast<long long>(batch), us, gbps,
                  gbps / peak_gbps, us_graph, gbps_graph / peak_gbps);
      std::fflush(stdout);
      rows.push_back({{"variant", variant}, {"dtype", dt}, {"context", ctx}, {"heads", heads}, {"batch", batch}, {"us_per_call", us},
                      {"bytes", bytes}, {"gbps", gbps}, {"fraction_of_peak", gbps / peak_gbps},
                      {"us_per_call_graph", us_graph}, {"fraction_of_peak_graph", gbps_graph / peak_gbps},
                      {"kvb_dtype", opt.kvb_dtype}, {"kvb_bytes", kvb_bytes},
                      {"fraction_of_peak_graph_with_kvb",
                       us_graph > 0 ? (bytes + kvb_bytes) / (us_graph * 1e-6) / 1e9 / peak_gbps : 0.0}});
    }
  }
  return 0;
}

int Run(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "mla_decode_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    const std::string v = argv[++i];
    if (a == "--device") opt.device = v;
    else if (a == "--contexts") opt.contexts = v;
    else if (a == "--dtypes") opt.dtypes = v;
    else if (a == "--heads") opt.heads = std::stoll(v);
    else if (a == "--batch") opt.batch = std::stoll(v);
    else if (a == "--iters") opt.iters = std::stoll(v);
    else if (a == "--peak-gbps") opt.peak_gbps = std::stod(v);
    else if (a == "--json") opt.json = v;
    else if (a == "--variants") opt.variants = v;
    else if (a == "--kvb-dtype") {
      if (v != "f32" && v != "bf16") {
        std::fprintf(stderr, "mla_decode_bench: --kvb-dtype %s: f32 or bf16\n", v.c_str());
        return 2;
      }
      opt.kvb_dtype = v;
    }
    else {
      std::fprintf(stderr, "mla_decode_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  const std::vector<std::string> variants = Split(opt.variants);
  if (variants.empty()) {
    std::fprintf(stderr, "mla_decode_bench: --variants names none\n");
    return 2;
  }
  std::printf("%-10s %-5s %8s %6s %6s %10s %9s %8s %10s %8s\n", "variant", "dtype", "context", "heads", "batch", "us/call",
              "GB/s", "of peak", "graph us", "of peak");
  std::fflush(stdout);
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& variant : variants) {
    if (variants.size() == 1) {  // one variant: in this process, so a CUPTI tracer's exit handler runs
      setenv("KIMIRT_MLA_DECODE_VARIANT", variant.c_str(), 1);
      if (const int rc = Measure(opt, variant, rows); rc != 0) return rc;
      break;
    }
    char path[] = "/tmp/mla_decode_bench.XXXXXX";
    const int fd = mkstemp(path);
    if (fd < 0) {
      std::perror("mla_decode_bench: mkstemp");
      return 1;
    }
    close(fd);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("mla_decode_bench: fork");
      return 1;
    }
    if (pid == 0) {  // the child: this variant alone, its rows to `path`
      setenv("KIMIRT_MLA_DECODE_VARIANT", variant.c_str(), 1);
      nlohmann::json mine = nlohmann::json::array();
      const int rc = Measure(opt, variant, mine);
      std::ofstream(path) << mine.dump() << "\n";
      std::fflush(nullptr);
      _exit(rc);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    nlohmann::json mine;
    std::ifstream in(path);
    const bool read = static_cast<bool>(in >> mine);
    std::remove(path);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !read) {
      std::fprintf(stderr, "mla_decode_bench: variant %s failed (status %d)\n", variant.c_str(), status);
      return 1;
    }
    for (auto& r : mine) rows.push_back(r);
  }
  // Side by side: each variant's time at each point (the graph's where the device has graphs,
  // else the eager call's) and its fraction of peak.
  if (variants.size() > 1) {
    std::printf("\n%-5s %8s", "dtype", "context");
    for (const std::string& v : variants) std::printf(" %10s %8s", (v + " us").c_str(), "of peak");
    std::printf("\n");
    for (const auto& r : rows) {
      if (r["variant"] != variants[0]) continue;
      std::printf("%-5s %8lld", r["dtype"].get<std::string>().c_str(), static_cast<long long>(r["context"].get<int64_t>()));
      for (const std::string& v : variants) {
        for (const auto& o : rows) {
          if (o["variant"] == v && o["dtype"] == r["dtype"] && o["context"] == r["context"]) {
            const bool graph = o["us_per_call_graph"].get<double>() > 0;
            std::printf(" %10.1f %8.3f", o[graph ? "us_per_call_graph" : "us_per_call"].get<double>(),
                        o[graph ? "fraction_of_peak_graph" : "fraction_of_peak"].get<double>());
          }
        }
      }
      std::printf("\n");
    }
  }
  if (!opt.json.empty()) {
    std::ofstream f(opt.json);
    f << nlohmann::json{{"bench", "mla_decode"}, {"device", opt.device}, {"peak_gbps", opt.peak_gbps}, {"results", rows}}.dump(2)
      << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kimirt

int main(int argc, char** argv) { return kimirt::Run(argc, argv); }
