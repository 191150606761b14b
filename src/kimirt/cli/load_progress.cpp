// Model-load progress from /proc (load_progress.h).
#include "kimirt/cli/load_progress.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "kimirt/eval/progress_bar.h"

namespace kimirt {
namespace {

constexpr uint64_t kMiB = 1u << 20;

// The number after `key` on its line of a /proc file, times `unit`; 0 when absent.
uint64_t ProcField(const char* path, const std::string& key, uint64_t unit) {
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(key, 0) == 0) return std::strtoull(line.c_str() + key.size(), nullptr, 10) * unit;
  }
  return 0;
}

// Bytes this process has read or mapped in so far (load_progress.h); 0 where /proc is absent.
uint64_t ProcessBytesIn() {
  return ProcField("/proc/self/io", "rchar:", 1) + ProcField("/proc/self/status", "RssFile:", 1024);
}

}  // namespace

LoadProgress::LoadProgress(const std::string& model_dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (const fs::directory_entry& e : fs::directory_iterator(model_dir, ec)) {
    if (e.path().extension() == ".safetensors") total_bytes_ += e.file_size(ec);
  }
  if (total_bytes_ == 0) return;
  start_read_ = ProcessBytesIn();
  bar_ = std::make_unique<eval::ProgressBar>("Loading weights (MiB)", (total_bytes_ + kMiB - 1) / kMiB, stderr);
  thread_ = std::thread([this] {
    const uint64_t total_mib = (total_bytes_ + kMiB - 1) / kMiB;
    while (!done_.load()) {
      const uint64_t read = ProcessBytesIn() - start_read_;
      const uint64_t mib = std::min<uint64_t>(read / kMiB, total_mib * 99 / 100);
      bar_->Update(mib, "");
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
  });
}

LoadProgress::~LoadProgress() { Finish(); }

void LoadProgress::Finish() {
  if (done_.exchange(true)) return;
  if (thread_.joinable()) thread_.join();
  if (bar_) bar_->Finish("");
}

}  // namespace kimirt
