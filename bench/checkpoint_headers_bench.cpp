// checkpoint_headers_bench: how long Checkpoint::Open takes (every shard header + the index,
// all validated; no tensor data is read). The full Kimi-K3 checkpoint (96 shards, 497,220
// tensors, ~80 MB of JSON) must open in well under 2 s.
//
//   checkpoint_headers_bench DIR [--runs N] [--json OUT.json]
//   checkpoint_headers_bench --synthetic N_SHARDS TENSORS_PER_SHARD DIR [--runs N] [--json OUT]
//
// --synthetic first writes a sparse checkpoint into DIR (created if missing; payloads are file
// holes, so 96 × 5180 K3-like tensors take ~100 MB of disk for ~1.5 TB apparent) with
// K3-style names and an index sorted by name, as transformers writes it, then times it.
// Timings are with the headers in the page cache (the generator or the first run puts them
// there); the first run is reported separately.
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kimirt/io/safetensors.h"

namespace {

using kimirt::Checkpoint;
using kimirt::DType;
using kimirt::SafetensorsWriter;
using kimirt::Status;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// The k-th routed-expert tensor of a K3-like MXFP4 checkpoint: per expert, w1/w2/w3 each with
// a packed U8 weight and an E8M0 scale; 384 experts per layer.
void ExpertTensor(uint64_t k, std::string* name, DType* dtype, kimirt::Shape* shape) {
  static const char* kProj[] = {"w1", "w2", "w3"};
  const uint64_t per_expert = 6, experts = 384;
  const uint64_t layer = k / (per_expert * experts);
  const uint64_t expert = (k / per_expert) % experts;
  const uint64_t which = k % per_expert;
  const char* proj = kProj[which / 2];
  const bool scale = which % 2 == 1;
  const bool down = which / 2 == 1;  // w2: [hidden, inter]; w1/w3: [inter, hidden]
  const int64_t rows = down ? 7168 : 3072, cols = down ? 3072 : 7168;
  *name = "language_model.model.layers." + std::to_string(layer) + ".block_sparse_moe.experts." +
          std::to_string(expert) + "." + proj + (scale ? ".weight_scale" : ".weight_packed");
  *dtype = scale ? DType::kF8E8M0 : DType::kU8;
  *shape = {rows, scale ? cols / 32 : cols / 2};
}

int Generate(int shards, int per_shard, const std::string& dir) {
  ::mkdir(dir.c_str(), 0755);
  std::vector<std::pair<std::string, std::string>> weight_map;
  weight_map.reserve(static_cast<size_t>(shards) * per_shard);
  uint64_t total = 0, k = 0;
  const double t0 = Now();
  for (int s = 0; s < shards; ++s) {
    char shard[64];
    std::snprintf(shard, sizeof shard, "model-%05d-of-%05d.safetensors", s + 1, shards);
    SafetensorsWriter w;
    for (int i = 0; i < per_shard; ++i, ++k) {
      std::string name;
      DType dtype;
      kimirt::Shape shape;
      ExpertTensor(k, &name, &dtype, &shape);
      w.Add(name, dtype, shape);
      weight_map.emplace_back(std::move(name), shard);
    }
    total += w.data_bytes();
    Status st = w.Write(dir + "/" + shard, /*sparse=*/true);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", st.ToString().c_str());
      return 1;
    }
  }
  std::sort(weight_map.begin(), weight_map.end());
  Status st = kimirt::WriteSafetensorsIndex(dir, weight_map, total);
  if (!st.ok()) {
    std::fprintf(stderr, "%s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("generated %d shards × %d tensors (%.1f TB apparent) in %s in %.1f s\n", shards,
              per_shard, static_cast<double>(total) / 1e12, dir.c_str(), Now() - t0);
  return 0;
}

int Usage() {
  std::fprintf(stderr,
               "usage: checkpoint_headers_bench DIR [--runs N] [--json OUT.json]\n"
               "       checkpoint_headers_bench --synthetic N_SHARDS TENSORS_PER_SHARD DIR "
               "[--runs N] [--json OUT.json]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, json_out;
  int runs = 5;
  int synth_shards = 0, synth_per_shard = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--synthetic" && i + 3 < argc) {
      synth_shards = std::atoi(argv[++i]);
      synth_per_shard = std::atoi(argv[++i]);
      dir = argv[++i];
      if (synth_shards <= 0 || synth_per_shard <= 0) return Usage();
    } else if (a == "--runs" && i + 1 < argc) {
      runs = std::max(1, std::atoi(argv[++i]));
    } else if (a == "--json" && i + 1 < argc) {
      json_out = argv[++i];
    } else if (!a.empty() && a[0] != '-' && dir.empty()) {
      dir = a;
    } else {
      return Usage();
    }
  }
  if (dir.empty()) return Usage();
  if (synth_shards > 0 && Generate(synth_shards, synth_per_shard, dir) != 0) return 1;

  std::vector<double> times;
  size_t tensors = 0, shards = 0;
  uint64_t header_bytes = 0;
  for (int r = 0; r < runs + 1; ++r) {  // run 0 is the (possibly cold) first open
    const double t0 = Now();
    auto ckpt = Checkpoint::Open(dir);
    const double dt = Now() - t0;
    if (!ckpt.ok()) {
      std::fprintf(stderr, "%s\n", ckpt.status().ToString().c_str());
      return 1;
    }
    tensors = (*ckpt)->num_tensors();
    shards = (*ckpt)->shards().size();
    header_bytes = (*ckpt)->header_bytes();
    times.push_back(dt);
  }
  const double first = times[0];
  std::vector<double> warm(times.begin() + 1, times.end());
  std::sort(warm.begin(), warm.end());
  const double median = warm[warm.size() / 2];
  const double mb_per_s = static_cast<double>(header_bytes) / 1e6 / median;
  std::printf("Checkpoint::Open %s: %zu shards, %zu tensors, %.1f MB of header+index JSON\n",
              dir.c_str(), shards, tensors, static_cast<double>(header_bytes) / 1e6);
  std::printf("  median %.3f s over %d runs (min %.3f, max %.3f, first %.3f), %.0f MB/s\n",
              median, runs, warm.front(), warm.back(), first, mb_per_s);
  if (!json_out.empty()) {
    FILE* f = std::fopen(json_out.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "%s: %s\n", json_out.c_str(), std::strerror(errno));
      return 1;
    }
    std::fprintf(f,
                 "{\"bench\": \"checkpoint_headers\", \"shards\": %zu, \"tensors\": %zu, "
                 "\"header_bytes\": %llu, \"runs\": %d, \"seconds_median\": %.6f, "
                 "\"seconds_min\": %.6f, \"seconds_max\": %.6f, \"seconds_first\": %.6f, "
                 "\"mb_per_s\": %.1f}\n",
                 shards, tensors, static_cast<unsigned long long>(header_bytes), runs, median,
                 warm.front(), warm.back(), first, mb_per_s);
    std::fclose(f);
  }
  return 0;
}
