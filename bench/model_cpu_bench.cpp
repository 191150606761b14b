// CPU reference throughput, for the record (issue: the CPU backend is the reference, not the fast
// path): prefill tokens/s of a prompt in one call and decode tokens/s of single-token steps, per
// model directory. Prints a table, and --json for tracking.
//
//   model_cpu_bench --model DIR [--model DIR ...] [--prompt-len 64] [--decode-tokens 32]
//                   [--repeats 5] [--json out.json]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kimirt/backend/cpu/cpu_backend.h"
#include "kimirt/model/model.h"

namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

int Usage() {
  std::fprintf(stderr,
               "usage: model_cpu_bench --model DIR [--model DIR ...] [--prompt-len N] [--decode-tokens N]\n"
               "                       [--repeats N] [--json FILE]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace kimirt;
  std::vector<std::string> models;
  int64_t prompt_len = 64, decode_tokens = 32;
  int repeats = 5;
  std::string json_path;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    const char* v = nullptr;
    if (a == "--model" && (v = next())) models.push_back(v);
    else if (a == "--prompt-len" && (v = next())) prompt_len = std::atoll(v);
    else if (a == "--decode-tokens" && (v = next())) decode_tokens = std::atoll(v);
    else if (a == "--repeats" && (v = next())) repeats = std::atoi(v);
    else if (a == "--json" && (v = next())) json_path = v;
    else return Usage();
  }
  if (models.empty() || prompt_len < 1 || decode_tokens < 1 || repeats < 1) return Usage();

  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  std::printf("%-40s %10s %14s %14s %14s\n", "model", "prompt", "prefill tok/s", "decode tok/s", "decode ms/tok");
  for (const std::string& dir : models) {
    auto backend = MakeCpuBackend();
    auto comm = MakeSingleRankCommunicator();
    auto model = Model::Load(dir, *backend, *comm);
    if (!model.ok()) {
      std::fprintf(stderr, "%s: %s\n", dir.c_str(), model.status().message().c_str());
      return 1;
    }
    const int64_t V = (*model)->config().vocab_size;
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    for (int64_t i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % V);
    ForwardOptions last;
    last.all_logits = false;
    std::vector<double> prefill_s, decode_s;
    for (int r = 0; r < repeats; ++r) {
      SequenceState st = (*model)->NewSequence();
      const auto t0 = Clock::now();
      auto logits = (*model)->Forward(&st, prompt, last);
      const auto t1 = Clock::now();
      if (!logits.ok()) {
        std::fprintf(stderr, "%s: %s\n", dir.c_str(), logits.status().message().c_str());
        return 1;
      }
      int32_t next = 0;
      for (int64_t s = 0; s < decode_tokens; ++s) {
        next = static_cast<int32_t>(std::max_element(logits->f32(), logits->f32() + V) - logits->f32());
        logits = (*model)->Forward(&st, std::vector<int32_t>{next}, last);
      }
      const auto t2 = Clock::now();
      prefill_s.push_back(std::chrono::duration<double>(t1 - t0).count());
      decode_s.push_back(std::chrono::duration<double>(t2 - t1).count());
    }
    const double pre = Median(prefill_s), dec = Median(decode_s);
    const double pre_tps = static_cast<double>(prompt_len) / pre;
    const double dec_tps = static_cast<double>(decode_tokens) / dec;
    std::printf("%-40s %10lld %14.1f %14.1f %14.3f\n", dir.c_str(), static_cast<long long>(prompt_len), pre_tps,
                dec_tps, 1e3 * dec / static_cast<double>(decode_tokens));
    out.push_back({{"model", dir},
                   {"prompt_tokens", prompt_len},
                   {"decode_tokens", decode_tokens},
                   {"repeats", repeats},
                   {"prefill_seconds_median", pre},
                   {"decode_seconds_median", dec},
                   {"prefill_tokens_per_s", pre_tps},
                   {"decode_tokens_per_s", dec_tps}});
  }
  if (!json_path.empty()) {
    FILE* f = std::fopen(json_path.c_str(), "w");
    if (f == nullptr) {
      std::fprintf(stderr, "cannot write %s\n", json_path.c_str());
      return 1;
    }
    std::fputs((out.dump(2) + "\n").c_str(), f);
    std::fclose(f);
  }
  return 0;
}
