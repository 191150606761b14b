#include "kimirt/dist/slurm_nodelist.h"

namespace kimirt {

Result<std::string> FirstSlurmHost(std::string_view nodelist) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("Slurm node list '" + std::string(nodelist) + "': " + why);
  };
  std::string host;
  size_t i = 0;
  // The first entry ends at the first comma outside brackets; inside a bracket group only the
  // first element (up to ',' or '-') names the first host.
  while (i < nodelist.size() && nodelist[i] != ',') {
    const char c = nodelist[i];
    if (c == ']') return bad("']' without '['");
    if (c != '[') {
      host += c;
      ++i;
      continue;
    }
    const size_t close = nodelist.find(']', i);
    if (close == std::string_view::npos) return bad("'[' without ']'");
    const std::string_view group = nodelist.substr(i + 1, close - i - 1);
    if (group.find('[') != std::string_view::npos) return bad("nested '['");
    const std::string_view first = group.substr(0, group.find_first_of(",-"));
    if (first.empty()) return bad("empty bracket group");
    for (char d : first) {
      if (d < '0' || d > '9') return bad("bracket group '" + std::string(group) + "' is not a numeric range");
    }
    host += first;
    i = close + 1;
  }
  if (host.empty()) return bad("no host");
  return host;
}

}  // namespace kimirt
