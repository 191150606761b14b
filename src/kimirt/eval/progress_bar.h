// A progress line on stderr for long client runs (evaluation, benchmarks). On a terminal it
// redraws in place (at most 10 times a second); into a file or CI log it prints one line per
// tenth of the work, so logs stay short. Thread-safe.
#pragma once

#include <cstddef>
#include <cstdio>
#include <mutex>
#include <string>

namespace kimirt::eval {

class ProgressBar {
 public:
  // `out` null: silent.
  ProgressBar(std::string label, size_t total, FILE* out);
  ~ProgressBar();
  // `done` items finished; `status` is shown after the counts (e.g. live accuracy).
  void Update(size_t done, const std::string& status);
  // Draws the final state and ends the line.
  void Finish(const std::string& status);

 private:
  void Draw(size_t done, const std::string& status, bool final);

  std::string label_;
  size_t total_;
  FILE* out_;
  bool tty_;
  double start_s_;
  double last_draw_s_ = -1;
  size_t last_decile_ = 0;
  bool finished_ = false;
  std::mutex mu_;
};

}  // namespace kimirt::eval
