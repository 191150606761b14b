// Runs a shell command for the tests that drive the `kimirt` binary (or a helper such as
// python3) the way a user does, and hands back what it printed and how it exited.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <string>

namespace kimirt::testing {

struct CommandResult {
  int exit_code = -1;  // -1: killed by a signal, or the shell could not be started
  std::string output;  // what the command wrote to stdout (add " 2>&1" to the command for stderr)
};

// Runs `command` with /bin/sh (popen) and waits for it to finish.
inline CommandResult RunCommand(const std::string& command) {
  CommandResult r;
  FILE* p = ::popen(command.c_str(), "r");
  if (p == nullptr) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  const int status = ::pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

}  // namespace kimirt::testing
