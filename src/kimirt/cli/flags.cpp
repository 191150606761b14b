#include "kimirt/cli/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <sstream>

namespace kimirt {
namespace {

std::vector<std::string> SplitNames(const std::string& names) {
  std::vector<std::string> out;
  std::stringstream ss(names);
  std::string part;
  while (std::getline(ss, part, ',')) out.push_back(NormalizeFlagName(part));
  return out;
}

Status ParseInt(const std::string& flag, const std::string& v, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE) {
    return InvalidArgument("--" + flag + ": expected an integer, got \"" + v + "\"");
  }
  *out = x;
  return Status::Ok();
}

}  // namespace

std::string NormalizeFlagName(std::string_view raw) {
  while (!raw.empty() && raw.front() == '-') raw.remove_prefix(1);
  std::string s(raw);
  for (char& c : s) {
    if (c == '_') c = '-';
  }
  return s;
}

FlagSet::FlagSet(std::string command, std::string summary)
    : command_(std::move(command)), summary_(std::move(summary)) {}

void FlagSet::Add(const std::string& names, Flag flag) {
  flag.names = SplitNames(names);
  flags_.push_back(std::move(flag));
}

void FlagSet::String(const std::string& names, std::string* out, const std::string& help) {
  Flag f;
  f.help = help;
  f.default_text = out->empty() ? "" : *out;
  f.apply = [out](const std::string& v) {
    *out = v;
    return Status::Ok();
  };
  Add(names, std::move(f));
}

void FlagSet::Int(const std::string& names, int64_t* out, const std::string& help) {
  Flag f;
  f.help = help;
  f.default_text = std::to_string(*out);
  const std::string name = SplitNames(names)[0];
  f.apply = [out, name](const std::string& v) { return ParseInt(name, v, out); };
  Add(names, std::move(f));
}

void FlagSet::Int(const std::string& names, int* out, const std::string& help) {
  Flag f;
  f.help = help;
  f.default_text = std::to_string(*out);
  const std::string name = SplitNames(names)[0];
  f.apply = [out, name](const std::string& v) {
    int64_t x = 0;
    KIMIRT_RETURN_IF_ERROR(ParseInt(name, v, &x));
    if (x < std::numeric_limits<int>::min() || x > std::numeric_limits<int>::max()) {
      return InvalidArgument("--" + name + ": " + v + " is out of range");
    }
    *out = static_cast<int>(x);
    return Status::Ok();
  };
  Add(names, std::move(f));
}

void FlagSet::Double(const std::string& names, double* out, const std::string& help) {
  Flag f;
  f.help = help;
  std::ostringstream d;
  d << *out;
  f.default_text = d.str();
  const std::string name = SplitNames(names)[0];
  f.apply = [out, name](const std::string& v) {
    errno = 0;
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    if (v.empty() || end != v.c_str() + v.size() || errno == ERANGE || !std::isfinite(x)) {
      return InvalidArgument("--" + name + ": expected a number, got \"" + v + "\"");
    }
    *out = x;
    return Status::Ok();
  };
  Add(names, std::move(f));
}

void FlagSet::Bool(const std::string& names, bool* out, const std::string& help) {
  Flag f;
  f.help = help;
  f.is_bool = true;
  f.takes_value = false;
  f.default_text = *out ? "true" : "false";
  const std::string name = SplitNames(names)[0];
  f.apply = [out, name](const std::string& v) {
    if (v == "" || v == "true" || v == "1") {
      *out = true;
    } else if (v == "false" || v == "0") {
      *out = false;
    } else {
      return InvalidArgument("--" + name + ": expected true or false, got \"" + v + "\"");
    }
    return Status::Ok();
  };
  Add(names, std::move(f));
}

void FlagSet::Ignored(const std::string& names, bool takes_value, const std::string& help) {
  Flag f;
  f.help = help + " (accepted, no effect)";
  f.takes_value = takes_value;
  f.is_bool = !takes_value;
  f.apply = [](const std::string&) { return Status::Ok(); };
  Add(names, std::move(f));
}

FlagSet::Flag* FlagSet::Find(const std::string& normalized) {
  for (Flag& f : flags_) {
    for (const std::string& n : f.names) {
      if (n == normalized) return &f;
    }
  }
  return nullptr;
}

bool FlagSet::WasSet(const std::string& name) const {
  const std::string n = NormalizeFlagName(name);
  for (const Flag& f : flags_) {
    for (const std::string& x : f.names) {
      if (x == n) return f.set;
    }
  }
  return false;
}

Status FlagSet::Parse(int argc, char** argv, int first, std::vector<std::string>* positional) {
  for (int i = first; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg.size() < 2 || arg[0] != '-' || arg == "--") {
      if (arg == "--") {
        for (++i; i < argc; ++i) {
          if (!positional) return InvalidArgument(command_ + ": unexpected argument \"" + std::string(argv[i]) + "\"");
          positional->push_back(argv[i]);
        }
        break;
      }
      if (!positional) return InvalidArgument("unexpected argument \"" + arg + "\"");
      positional->push_back(arg);
      continue;
    }
    std::string value;
    bool has_value = false;
    const size_t eq = arg.find('=');
    std::string name = NormalizeFlagName(eq == std::string::npos ? arg : arg.substr(0, eq));
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
      has_value = true;
    }
    if (name == "help" || name == "h") {
      help_requested_ = true;
      continue;
    }
    Flag* f = Find(name);
    bool negated = false;
    if (f == nullptr && name.rfind("no-", 0) == 0) {
      f = Find(name.substr(3));
      negated = f != nullptr && f->is_bool;
      if (!negated) f = nullptr;
    }
    if (f == nullptr) {
      return InvalidArgument("unknown flag " + arg + " (see `kimirt " + command_ + " --help`)");
    }
    if (f->takes_value && !has_value) {
      if (i + 1 >= argc) return InvalidArgument(arg + " needs a value");
      value = argv[++i];
    }
    if (negated) {
      if (has_value) return InvalidArgument(arg + " takes no value");
      value = "false";
    }
    KIMIRT_RETURN_IF_ERROR(f->apply(value));
    f->set = true;
  }
  return Status::Ok();
}

std::string FlagSet::Help() const {
  std::string s = "usage: kimirt " + command_ + " [flags]\n" + summary_ + "\n\nflags:\n";
  for (const Flag& f : flags_) {
    std::string names;
    for (const std::string& n : f.names) names += (names.empty() ? "" : ", ") + ("--" + n);
    if (f.takes_value) names += " VALUE";
    s += "  " + names + "\n      " + f.help;
    if (!f.default_text.empty() && !f.is_bool) s += " (default: " + f.default_text + ")";
    s += "\n";
  }
  return s;
}

}  // namespace kimirt
