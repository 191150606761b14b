#include "kimirt/dist/rank_spawner.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "kimirt/dist/tcp_socket.h"

extern char** environ;

namespace kimirt {
namespace {

struct Child {
  pid_t pid = -1;
  int local_rank = 0;
  bool done = false;
  bool failed = false;
  int wstatus = 0;
};

std::string Describe(int wstatus) {
  if (WIFEXITED(wstatus)) return "exited with status " + std::to_string(WEXITSTATUS(wstatus));
  if (WIFSIGNALED(wstatus)) {
    const int sig = WTERMSIG(wstatus);
    const char* name = strsignal(sig);
    return "was killed by signal " + std::to_string(sig) + " (" + (name ? name : "?") + ")";
  }
  return "ended with wait status " + std::to_string(wstatus);
}

// A rank's end is a failure unless it exited 0 — and, with an `exit_expected` flag still false,
// even then (SpawnOptions::exit_expected).
bool Failed(int wstatus, bool zero_fails) { return zero_fails || !(WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0); }

// Reaps children that have exited; returns the first failed one's index, or -1. Each child's
// `failed` is decided when it is reaped.
int Reap(std::vector<Child>& children, const std::atomic<bool>* exit_expected) {
  int failed = -1;
  for (size_t i = 0; i < children.size(); ++i) {
    Child& c = children[i];
    if (c.done) continue;
    const pid_t r = waitpid(c.pid, &c.wstatus, WNOHANG);
    if (r == c.pid || (r < 0 && errno == ECHILD)) {
      c.done = true;
      if (r < 0) c.wstatus = 0;  // reaped elsewhere: nothing to report
      c.failed = r == c.pid && Failed(c.wstatus, exit_expected != nullptr && !exit_expected->load());
      if (failed < 0 && c.failed) failed = static_cast<int>(i);
    }
  }
  return failed;
}

bool AllDone(const std::vector<Child>& children) {
  for (const Child& c : children) {
    if (!c.done) return false;
  }
  return true;
}

// SIGTERM to every live child, SIGKILL after `grace`, and reaps them all.
void StopAll(std::vector<Child>& children, std::chrono::milliseconds grace) {
  for (Child& c : children) {
    if (!c.done) kill(c.pid, SIGTERM);
  }
  const Deadline deadline = Clock::now() + grace;
  while (Reap(children, nullptr), !AllDone(children) && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (Child& c : children) {
    if (!c.done) {
      kill(c.pid, SIGKILL);
      waitpid(c.pid, &c.wstatus, 0);
      c.done = true;
    }
  }
}

// Forks and execs one rank. A CLOEXEC pipe carries exec's errno back, so a missing binary is an
// error here, not a mysterious exit status 127.
Result<pid_t> Start(const std::vector<std::string>& argv, const std::vector<std::string>& env) {
  std::vector<char*> cargv, cenv;
  for (const std::string& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  for (const std::string& e : env) cenv.push_back(const_cast<char*>(e.c_str()));
  cenv.push_back(nullptr);
  int pipefd[2];
  if (pipe2(pipefd, O_CLOEXEC) != 0) return IoError(std::string("pipe2: ") + std::strerror(errno));
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    close(pipefd[0]);
    close(pipefd[1]);
    return IoError(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    // Only async-signal-safe calls from here to exec.
    close(pipefd[0]);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);  // the supervisor died before prctl took effect
    execvpe(cargv[0], cargv.data(), cenv.data());
    const int err = errno;
    (void)!write(pipefd[1], &err, sizeof(err));
    _exit(127);
  }
  close(pipefd[1]);
  int err = 0;
  ssize_t n;
  do {
    n = read(pipefd[0], &err, sizeof(err));
  } while (n < 0 && errno == EINTR);
  close(pipefd[0]);
  if (n == static_cast<ssize_t>(sizeof(err))) {
    waitpid(pid, nullptr, 0);
    return IoError("exec " + argv[0] + ": " + std::strerror(err));
  }
  return pid;
}

}  // namespace

std::vector<std::string> RankEnvironment(const SpawnOptions& o, int local_rank, const std::vector<std::string>& base) {
  std::vector<std::pair<std::string, std::string>> set = {
      {"RANK", std::to_string(o.first_rank + local_rank)},
      {"WORLD_SIZE", std::to_string(o.world_size)},
      {"LOCAL_RANK", std::to_string(o.first_local_rank + local_rank)},
      {"LOCAL_WORLD_SIZE", std::to_string(o.first_local_rank + o.local_ranks)},
      {"GROUP_RANK", std::to_string(o.node_rank)},
      {"MASTER_ADDR", o.master_addr},
      {"MASTER_PORT", std::to_string(o.master_port)},
      {"NCCL_NVLS_ENABLE", "0"},
  };
  set.insert(set.end(), o.extra_env.begin(), o.extra_env.end());
  std::vector<std::string> env;
  for (const std::string& kv : base) {
    const std::string name = kv.substr(0, kv.find('='));
    bool replaced = false;
    for (const auto& [k, v] : set) replaced = replaced || k == name;
    if (!replaced) env.push_back(kv);
  }
  for (const auto& [k, v] : set) {
    // A later entry (extra_env) overrides an earlier one of the same name.
    std::erase_if(env, [&](const std::string& kv) { return kv.compare(0, k.size() + 1, k + "=") == 0; });
    env.push_back(k + "=" + v);
  }
  return env;
}

Status SpawnAndSupervise(SpawnOptions o) {
  if (o.argv.empty()) return InvalidArgument("spawn: empty command line");
  if (o.local_ranks < 1 || o.first_rank < 0 || o.first_rank + o.local_ranks > o.world_size) {
    return InvalidArgument("spawn: local ranks " + std::to_string(o.first_rank) + " .. " +
                           std::to_string(o.first_rank + o.local_ranks - 1) + " do not fit a world of " +
                           std::to_string(o.world_size));
  }
  if (o.master_port == 0) {
    KIMIRT_ASSIGN_OR_RETURN(o.master_port, PickFreePort());
  }
  std::vector<std::string> base;
  for (char** e = environ; *e != nullptr; ++e) base.emplace_back(*e);
  std::vector<Child> children;
  for (int i = 0; i < o.local_ranks; ++i) {
    Result<pid_t> pid = Start(o.argv, RankEnvironment(o, i, base));
    if (!pid.ok()) {
      StopAll(children, o.grace);
      return pid.status().WithContext("cannot start rank " + std::to_string(o.first_rank + i));
    }
    children.push_back(Child{*pid, i});
  }
  for (;;) {
    if (Reap(children, o.exit_expected) >= 0) {
      // Every rank that failed by itself (in this poll: which came first is unknowable), before
      // the others are stopped.
      std::string msg;
      for (const Child& c : children) {
        if (!c.done || !c.failed) continue;
        const bool early = WIFEXITED(c.wstatus) && WEXITSTATUS(c.wstatus) == 0;
        msg += (msg.empty() ? "" : "; ") + ("rank " + std::to_string(o.first_rank + c.local_rank) + " (local rank " +
                                            std::to_string(o.first_local_rank + c.local_rank) + ", pid " + std::to_string(c.pid) + ") " +
                                            Describe(c.wstatus) + (early ? " before the group was told to stop" : ""));
      }
      StopAll(children, o.grace);
      return Internal(msg + "; the other ranks were stopped");
    }
    if (AllDone(children)) return Status::Ok();
    if (o.stop != nullptr && o.stop->load()) {
      StopAll(children, o.grace);
      return Status::Ok();
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

}  // namespace kimirt
