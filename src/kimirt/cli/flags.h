// FlagSet: each flag declared once with its default and help (style-examples.md, gemma.cpp's
// gemma_args.h). Spellings are normalized in one place: leading dashes are dropped and '_'
// equals '-', so `-tp 8`, `--tp=8`, `--kv_cache_dtype fp8` and `--kv-cache-dtype=fp8` all parse
// (the seed's ATOM/vLLM command lines work as written). Unknown flags are errors, never ignored.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt {

class FlagSet {
 public:
  FlagSet(std::string command, std::string summary);

  // `names` is "name" or "name,alias,..." (without dashes).
  void String(const std::string& names, std::string* out, const std::string& help);
  void Int(const std::string& names, int64_t* out, const std::string& help);
  void Int(const std::string& names, int* out, const std::string& help);
  void Double(const std::string& names, double* out, const std::string& help);
  // A switch: `--name` sets true, `--no-name` sets false; `--name=true|false` also accepted.
  void Bool(const std::string& names, bool* out, const std::string& help);
  // Accepted with no effect (e.g. --trust-remote-code), listed in the help.
  void Ignored(const std::string& names, bool takes_value, const std::string& help);
  // Parses argv[first..argc). Positional arguments are appended to `positional` (an error if
  // `positional` is null). --help sets help_requested().
  Status Parse(int argc, char** argv, int first, std::vector<std::string>* positional);
  bool help_requested() const { return help_requested_; }
  bool WasSet(const std::string& name) const;
  std::string Help() const;

 private:
  struct Flag {
    std::vector<std::string> names;
    std::string help;
    std::string default_text;
    bool is_bool = false;
    bool takes_value = true;
    bool set = false;
    std::function<Status(const std::string&)> apply;
  };
  void Add(const std::string& names, Flag flag);
  Flag* Find(const std::string& normalized);

  std::string command_;
  std::string summary_;
  std::vector<Flag> flags_;
  bool help_requested_ = false;
};

// Drops leading dashes and maps '_' to '-'.
std::string NormalizeFlagName(std::string_view raw);

}  // namespace kimirt
