// pp_step_flow_bench: a pipeline-parallel step of decode rows and prefill chunks in one flow
// (ModelRunner::ForwardStep: the decode micro-batches, then the chunks, through the stages as
// one; docs/distributed.md "A step in one flow") against the same step in two flows
// (ForwardDecode, then ForwardChunks: the decodes' fill and drain, then the chunks'), on CPU
// thread ranks. `--decodes` sequences decode a fixed token a step beside `--chunks` sequences
// that prefill `--chunk` tokens a step; the two ways alternate step by step on the same runner,
// so both see the same contexts. Reported: each way's median step time and their ratio.
//
// Stages overlap only where each has a core: run it with --threads 1 (each stage one core, as
// each would have its own device) on a machine with a core per stage free.
//
// Usage: pp_step_flow_bench [--model DIR] [--pp 2] [--decodes 4] [--chunks 2] [--chunk 32]
//                           [--steps 12] [--threads 1] [--json FILE]   (--steps: each way's)
//   (no --model: the built-in model, tools/builtin_model.h)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/engine/model_runner.h"
#include "kimirt/tools/builtin_model.h"

namespace kimirt {
namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

int Run(int argc, char** argv) {
  std::string model, json_path;
  int pp = 2, decodes = 4, chunks = 2, chunk = 32, steps = 12, threads = 1;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i], v = argv[i + 1];
    if (a == "--model") {
      model = v;
    } else if (a == "--pp") {
      pp = std::atoi(v.c_str());
    } else if (a == "--decodes") {
      decodes = std::atoi(v.c_str());
    } else if (a == "--chunks") {
      chunks = std::atoi(v.c_str());
    } else if (a == "--chunk") {
      chunk = std::atoi(v.c_str());
    } else if (a == "--steps") {
      steps = std::atoi(v.c_str());
    } else if (a == "--threads") {
      threads = std::atoi(v.c_str());
    } else if (a == "--json") {
      json_path = v;
    } else {
      std::fprintf(stderr, "pp_step_flow_bench: unknown flag %s\n", a.c_str());
      return 2;
    }
  }
  if (pp < 2 || decodes < 1 || chunks < 1 || chunk < 2 || steps < 2 || threads < 1) {
    std::fprintf(stderr, "pp_step_flow_bench: needs --pp >= 2, --decodes, --chunks >= 1, --chunk >= 2, --steps >= 2\n");
    return 2;
  }
  if (model.empty()) {
    Result<std::string> dir = EnsureBuiltinModel();
    if (!dir.ok()) {
      std::fprintf(stderr, "pp_step_flow_bench: %s\n", dir.status().ToString().c_str());
      return 1;
    }
    model = *dir;
  }
  SetCpuBackendThreads(threads);
  RunnerOptions ro;
  ro.pp = pp;
  ro.block_size = 16;
  const int total_steps = 2 * (steps + 1);  // each way `steps` times, after one to warm up
  const int64_t longest = 16 + static_cast<int64_t>(total_steps) * chunk;
  ro.num_kv_blocks = (decodes + chunks) * (longest / ro.block_size + 2);
  Result<std::unique_ptr<ModelRunner>> r = ModelRunner::Create(model, ro);
  if (!r.ok()) {
    std::fprintf(stderr, "pp_step_flow_bench: %s\n", r.status().ToString().c_str());
    return 1;
  }
  ModelRunner& runner = **r;
  const int32_t V = static_cast<int32_t>(runner.config().vocab_size);
  std::vector<ModelRunner::Handle> decoding, prefilling;
  std::vector<int32_t> prompt;
  for (int k = 0; k < 16; ++k) prompt.push_back((k * 37 + 11) % V);
  for (int i = 0; i < decodes + chunks; ++i) {
    const ModelRunner::Handle h = runner.NewSequence();
    Status s = runner.Reserve(h, longest);
    if (s.ok()) s = runner.Forward(h, prompt, true).status();
    if (!s.ok()) {
      std::fprintf(stderr, "pp_step_flow_bench: %s\n", s.ToString().c_str());
      return 1;
    }
    (i < decodes ? decoding : prefilling).push_back(h);
  }
  std::vector<int32_t> chunk_ids;
  for (int k = 0; k < chunk; ++k) chunk_ids.push_back((k * 53 + 5) % V);
  std::vector<ModelRunner::Chunk> step_chunks;
  for (ModelRunner::Handle h : prefilling) step_chunks.push_back({h, chunk_ids, true, nullptr});
  std::vector<double> one_flow_ms, two_flows_ms;
  for (int step = 0; step < total_steps; ++step) {
    std::vector<int32_t> next;
    for (int i = 0; i < decodes; ++i) next.push_back((step * 7 + i * 3 + 1) % V);
    const bool one = step % 2 == 0;
    const auto t0 = std::chrono::steady_clock::now();
    Status s;
    if (one) {
      s = runner.ForwardStep({decoding, next, nullptr}, step_chunks).status();
    } else {
      s = runner.ForwardDecode(decoding, next).status();
      if (s.ok()) s = runner.ForwardChunks(step_chunks).status();
    }
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!s.ok()) {
      std::fprintf(stderr, "pp_step_flow_bench: step %d: %s\n", step, s.ToString().c_str());
      return 1;
    }
    if (step >= 2) (one ? one_flow_ms : two_flows_ms).push_back(ms);  // the first of each warms up
  }
  const double one = Median(one_flow_ms), two = Median(two_flows_ms);
  std::printf("PP %d, %d decode rows + %d chunks of %d tokens a step, %d thread(s) per stage, %zu steps each:\n", pp,
              decodes, chunks, chunk, threads, one_flow_ms.size());
  std::printf("  one flow   %8.2f ms (median step)\n  two flows  %8.2f ms\n  two / one  %8.3f\n", one, two, two / one);
  if (!json_path.empty()) {
    nlohmann::ordered_json j = {{"bench", "pp_step_flow"}, {"model", model},        {"pp", pp},
                                {"decodes", decodes},      {"chunks", chunks},      {"chunk", chunk},
                                {"threads", threads},      {"one_flow_ms", one_flow_ms},
                                {"two_flows_ms", two_flows_ms}, {"one_flow_median_ms", one},
                                {"two_flows_median_ms", two}};
    std::ofstream(json_path) << j.dump(2) << "\n";
  }
  return 0;
}

}  // namespace
}  // namespace kimirt

int main(int argc, char** argv) { return kimirt::Run(argc, argv); }
