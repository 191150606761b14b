// tokenizer_bench: encoding throughput of the tiktoken-format tokenizer (spec §10.1), one thread.
//
//   tokenizer_bench --model-dir DIR (--text FILE | --jsonl FILE) [--runs N] [--json OUT.json]
//
// --text encodes a file's bytes; --jsonl takes GSM8K-style records and uses "question\nanswer"
// per record. Two measurements: the whole text as one Encode() call, and one call per document
// (per record for --jsonl, per paragraph for --text), which is how a server sees requests.
// Best of --runs (default 5). tests/python/tokenizer_bench_tiktoken.py measures the PyPI tiktoken
// library the same way; compare MB/s.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kimirt/tokenizer/tokenizer.h"

namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Usage() {
  std::fprintf(stderr,
               "usage: tokenizer_bench --model-dir DIR (--text FILE | --jsonl FILE) [--runs N] "
               "[--json OUT.json]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string model_dir, text_file, jsonl_file, json_out;
  int runs = 5;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string { return i + 1 < argc ? argv[++i] : ""; };
    if (a == "--model-dir")
      model_dir = next();
    else if (a == "--text")
      text_file = next();
    else if (a == "--jsonl")
      jsonl_file = next();
    else if (a == "--json")
      json_out = next();
    else if (a == "--runs")
      runs = std::max(1, std::atoi(next().c_str()));
    else
      return Usage();
  }
  if (model_dir.empty() || text_file.empty() == jsonl_file.empty()) return Usage();

  auto tok = kimirt::Tokenizer::Load(model_dir);
  if (!tok.ok()) {
    std::fprintf(stderr, "%s\n", tok.status().ToString().c_str());
    return 1;
  }
  const std::string path = text_file.empty() ? jsonl_file : text_file;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "cannot open %s\n", path.c_str());
    return 1;
  }
  std::vector<std::string> docs;
  std::string text;
  if (!jsonl_file.empty()) {
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty()) continue;
      const nlohmann::json rec = nlohmann::json::parse(line, nullptr, false);
      if (rec.is_discarded() || !rec.contains("question") || !rec.contains("answer")) {
        std::fprintf(stderr, "%s: not a question/answer record: %.80s\n", path.c_str(),
                     line.c_str());
        return 1;
      }
      docs.push_back(rec["question"].get<std::string>() + "\n" + rec["answer"].get<std::string>());
    }
    for (size_t i = 0; i < docs.size(); ++i) text += (i ? "\n\n" : "") + docs[i];
  } else {
    std::stringstream ss;
    ss << in.rdbuf();
    text = ss.str();
    for (size_t pos = 0; pos < text.size();) {
      size_t end = text.find("\n\n", pos);
      end = end == std::string::npos ? text.size() : end + 2;
      docs.push_back(text.substr(pos, end - pos));
      pos = end;
    }
  }

  const kimirt::Tokenizer& t = **tok;
  size_t tokens = 0, doc_tokens = 0;
  double best_whole = 1e30, best_docs = 1e30;
  for (int r = 0; r < runs; ++r) {
    double t0 = Now();
    tokens = t.Encode(text).size();
    best_whole = std::min(best_whole, Now() - t0);
    t0 = Now();
    doc_tokens = 0;
    for (const std::string& d : docs) doc_tokens += t.Encode(d).size();
    best_docs = std::min(best_docs, Now() - t0);
  }
  const double mb = static_cast<double>(text.size()) / 1e6;
  size_t doc_bytes = 0;
  for (const std::string& d : docs) doc_bytes += d.size();
  const double whole_mbps = mb / best_whole,
               docs_mbps = static_cast<double>(doc_bytes) / 1e6 / best_docs;
  std::printf("kimirt tokenizer (%s, %d base tokens): %.2f MB, %zu tokens\n", model_dir.c_str(),
              t.num_base_tokens(), mb, tokens);
  std::printf("  whole text:      %8.2f MB/s (%.3f s)\n", whole_mbps, best_whole);
  std::printf("  %6zu documents: %8.2f MB/s (%.3f s, %zu tokens)\n", docs.size(), docs_mbps,
              best_docs, doc_tokens);
  if (!json_out.empty()) {
    const nlohmann::json j = {{"bench", "tokenizer"},
                              {"impl", "kimirt"},
                              {"model_dir", model_dir},
                              {"text", path},
                              {"bytes", text.size()},
                              {"tokens", tokens},
                              {"documents", docs.size()},
                              {"document_tokens", doc_tokens},
                              {"whole_mb_per_s", whole_mbps},
                              {"documents_mb_per_s", docs_mbps},
                              {"runs", runs}};
    std::ofstream(json_out) << j.dump(1) << "\n";
  }
  return 0;
}
