#include "kimirt/eval/gsm8k.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "kimirt/eval/mt19937.h"

namespace kimirt::eval {
namespace {

namespace fs = std::filesystem;

bool HasTestFile(const fs::path& dir) {
  std::error_code ec;
  return fs::is_regular_file(dir / "test.jsonl", ec);
}

}  // namespace

std::vector<std::string> Gsm8kStopSequences() { return {"Question:", "</s>", "<|im_end|>"}; }

Result<std::vector<Gsm8kDoc>> LoadGsm8kJsonl(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return NotFound(path + ": cannot open (give the GSM8K directory with --data-dir)");
  std::vector<Gsm8kDoc> docs;
  std::string line;
  int64_t line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.find_first_not_of(" \t") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const std::string where = path + ":" + std::to_string(line_no);
    if (j.is_discarded() || !j.is_object()) return Corrupt(where + ": not a JSON object");
    auto q = j.find("question");
    auto a = j.find("answer");
    if (q == j.end() || !q->is_string()) return Corrupt(where + ": no string field \"question\"");
    if (a == j.end() || !a->is_string()) return Corrupt(where + ": no string field \"answer\"");
    docs.push_back({q->get<std::string>(), a->get<std::string>()});
  }
  if (in.bad()) return IoError(path + ": read failed");
  if (docs.empty()) return Corrupt(path + ": no documents");
  return docs;
}

Result<Gsm8kData> LoadGsm8k(const std::string& dir) {
  Gsm8kData d;
  d.dir = dir;
  KIMIRT_ASSIGN_OR_RETURN(d.train, LoadGsm8kJsonl((fs::path(dir) / "train.jsonl").string()));
  KIMIRT_ASSIGN_OR_RETURN(d.test, LoadGsm8kJsonl((fs::path(dir) / "test.jsonl").string()));
  return d;
}

std::string DefaultGsm8kDataDir(const char* argv0) {
  std::vector<fs::path> candidates;
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (ec && argv0 != nullptr) exe = fs::absolute(argv0, ec);
  if (!exe.empty()) {
    // build/kimirt → <repo>/data/gsm8k; an installed bin/kimirt → <prefix>/data/gsm8k.
    for (fs::path dir = exe.parent_path(); !dir.empty(); dir = dir.parent_path()) {
      candidates.push_back(dir / "data" / "gsm8k");
      if (dir == dir.parent_path() || candidates.size() >= 4) break;
    }
  }
#ifdef KIMIRT_EVAL_SOURCE_DATA_DIR
  candidates.emplace_back(KIMIRT_EVAL_SOURCE_DATA_DIR);
#endif
  for (const fs::path& c : candidates) {
    if (HasTestFile(c)) return fs::weakly_canonical(c, ec).string();
  }
  return "";
}

std::string Gsm8kDocToText(const Gsm8kDoc& doc) { return "Question: " + doc.question + "\nAnswer:"; }

Result<std::vector<Gsm8kPrompt>> BuildGsm8kPrompts(const std::vector<Gsm8kDoc>& train,
                                                   const std::vector<Gsm8kDoc>& test, int64_t limit,
                                                   int num_fewshot, uint64_t fewshot_seed,
                                                   bool fewshot_as_multiturn) {
  if (num_fewshot < 0) return InvalidArgument("--num-fewshot must be >= 0");
  if (static_cast<size_t>(num_fewshot) > train.size()) {
    return InvalidArgument("--num-fewshot " + std::to_string(num_fewshot) + " exceeds the " +
                           std::to_string(train.size()) + " train documents");
  }
  const size_t n = limit < 0 ? test.size() : std::min(test.size(), static_cast<size_t>(limit));
  Mt19937 rnd = Mt19937::PythonSeeded(fewshot_seed);
  std::vector<Gsm8kPrompt> prompts;
  prompts.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    Gsm8kPrompt p;
    p.doc_id = i;
    // ContextSampler.sample returns [] for n == 0 without drawing.
    if (num_fewshot > 0) p.fewshot_ids = rnd.PythonSampleIndices(train.size(), static_cast<size_t>(num_fewshot));
    for (size_t id : p.fewshot_ids) {
      const std::string q = Gsm8kDocToText(train[id]);
      p.text += q + " " + train[id].answer + "\n\n";
      p.messages.push_back({"user", q});
      p.messages.push_back({"assistant", train[id].answer});
    }
    const std::string q = Gsm8kDocToText(test[i]);
    p.text += q;
    p.messages.push_back({"user", q});
    if (!fewshot_as_multiturn) p.messages = {{"user", p.text}};
    prompts.push_back(std::move(p));
  }
  return prompts;
}

}  // namespace kimirt::eval
