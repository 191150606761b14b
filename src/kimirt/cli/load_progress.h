// A progress bar on stderr while `kimirt serve` loads a model. The loader reports nothing, so
// progress is what this process has read of the checkpoint's *.safetensors bytes so far: pread
// bytes (/proc/self/io rchar) plus mapped file pages resident (/proc/self/status RssFile).
// Either can run ahead or behind the real work (page cache, other reads), so the bar stops at
// 99% until Finish().
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>

namespace kimirt {

namespace eval {
class ProgressBar;
}

class LoadProgress {
 public:
  // Starts polling (every 200 ms) when `model_dir` holds safetensors; else does nothing.
  explicit LoadProgress(const std::string& model_dir);
  ~LoadProgress();  // Finish()
  void Finish();

 private:
  uint64_t total_bytes_ = 0;
  uint64_t start_read_ = 0;
  std::unique_ptr<eval::ProgressBar> bar_;
  std::atomic<bool> done_{false};
  std::thread thread_;
};

}  // namespace kimirt
