#include "kimirt/eval/prometheus_histograms.h"

#include <cmath>
#include <cstdlib>
#include <limits>

namespace kimirt::eval {
namespace {

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

double ParseValue(std::string_view v) {
  if (v == "+Inf" || v == "Inf") return std::numeric_limits<double>::infinity();
  if (v == "-Inf") return -std::numeric_limits<double>::infinity();
  const std::string s(v);
  char* end = nullptr;
  const double x = std::strtod(s.c_str(), &end);
  return end == s.c_str() ? std::numeric_limits<double>::quiet_NaN() : x;
}

// The value of label `key` in a `{a="x",b="y"}` block, or empty.
std::string LabelValue(std::string_view labels, std::string_view key) {
  size_t pos = 0;
  while (pos < labels.size()) {
    const size_t eq = labels.find('=', pos);
    if (eq == std::string_view::npos) break;
    std::string_view name = labels.substr(pos, eq - pos);
    while (!name.empty() && (name.front() == ',' || name.front() == ' ')) name.remove_prefix(1);
    size_t q = eq + 1;
    if (q >= labels.size() || labels[q] != '"') break;
    std::string value;
    ++q;
    while (q < labels.size() && labels[q] != '"') {
      if (labels[q] == '\\' && q + 1 < labels.size()) ++q;
      value.push_back(labels[q]);
      ++q;
    }
    if (name == key) return value;
    pos = q + 1;
  }
  return "";
}

}  // namespace

std::map<std::string, PromHistogram> ParsePromHistograms(std::string_view text) {
  // name -> (bound -> cumulative count), sums and counts; bounds merged across label sets.
  std::map<std::string, std::map<double, double>> buckets;
  std::map<std::string, PromHistogram> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t eol = text.find('\n', pos);
    if (eol == std::string_view::npos) eol = text.size();
    std::string_view line = text.substr(pos, eol - pos);
    pos = eol + 1;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    const std::string_view name = line.substr(0, name_end);
    std::string_view labels;
    size_t value_start = name_end;
    if (line[name_end] == '{') {
      const size_t close = line.find('}', name_end);
      if (close == std::string_view::npos) continue;
      labels = line.substr(name_end + 1, close - name_end - 1);
      value_start = close + 1;
    }
    std::string_view rest = line.substr(value_start);
    while (!rest.empty() && rest.front() == ' ') rest.remove_prefix(1);
    const size_t sp = rest.find(' ');  // an optional timestamp follows
    const double value = ParseValue(rest.substr(0, sp));
    if (std::isnan(value)) continue;
    if (EndsWith(name, "_bucket")) {
      const std::string base(name.substr(0, name.size() - 7));
      const std::string le = LabelValue(labels, "le");
      if (le.empty()) continue;
      buckets[base][ParseValue(le)] += value;
    } else if (EndsWith(name, "_sum")) {
      out[std::string(name.substr(0, name.size() - 4))].sum += value;
    } else if (EndsWith(name, "_count")) {
      out[std::string(name.substr(0, name.size() - 6))].count += value;
    }
  }
  std::map<std::string, PromHistogram> result;
  for (auto& [name, b] : buckets) {
    PromHistogram h = out[name];
    for (const auto& [bound, cum] : b) {
      h.upper_bounds.push_back(bound);
      h.cumulative.push_back(cum);
    }
    result[name] = std::move(h);
  }
  return result;
}

PromHistogram HistogramDelta(const PromHistogram& after, const PromHistogram* before) {
  PromHistogram d = after;
  if (before == nullptr) return d;
  d.sum -= before->sum;
  d.count -= before->count;
  for (size_t i = 0; i < d.upper_bounds.size(); ++i) {
    for (size_t j = 0; j < before->upper_bounds.size(); ++j) {
      if (before->upper_bounds[j] == d.upper_bounds[i]) {
        d.cumulative[i] -= before->cumulative[j];
        break;
      }
    }
  }
  return d;
}

std::pair<double, double> QuantileBucket(const PromHistogram& h, double q) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  if (h.cumulative.empty()) return {nan, nan};
  const double total = h.cumulative.back();
  if (!(total > 0)) return {nan, nan};
  const double rank = q * total;
  for (size_t i = 0; i < h.cumulative.size(); ++i) {
    if (h.cumulative[i] >= rank) return {i == 0 ? 0.0 : h.upper_bounds[i - 1], h.upper_bounds[i]};
  }
  return {h.upper_bounds.back(), std::numeric_limits<double>::infinity()};
}

const PromHistogram* FindHistogram(const std::map<std::string, PromHistogram>& all,
                                   const std::vector<std::string>& suffixes, std::string* name) {
  for (const std::string& suffix : suffixes) {
    for (const auto& [n, h] : all) {
      if (EndsWith(n, suffix)) {
        if (name != nullptr) *name = n;
        return &h;
      }
    }
  }
  return nullptr;
}

}  // namespace kimirt::eval
