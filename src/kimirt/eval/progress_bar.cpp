#include "kimirt/eval/progress_bar.h"

#include <unistd.h>

#include <cmath>

#include "kimirt/eval/clock.h"

namespace kimirt::eval {
namespace {

std::string Clock(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const long s = static_cast<long>(seconds + 0.5);
  char buf[32];
  if (s >= 3600) {
    std::snprintf(buf, sizeof(buf), "%ld:%02ld:%02ld", s / 3600, (s / 60) % 60, s % 60);
  } else {
    std::snprintf(buf, sizeof(buf), "%02ld:%02ld", s / 60, s % 60);
  }
  return buf;
}

}  // namespace

ProgressBar::ProgressBar(std::string label, size_t total, FILE* out)
    : label_(std::move(label)), total_(total), out_(out), tty_(out != nullptr && isatty(fileno(out))),
      start_s_(SteadyNowSeconds()) {}

ProgressBar::~ProgressBar() = default;

void ProgressBar::Update(size_t done, const std::string& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (out_ == nullptr || finished_) return;
  const double now = SteadyNowSeconds();
  if (tty_) {
    if (now - last_draw_s_ < 0.1 && done < total_) return;
    last_draw_s_ = now;
    Draw(done, status, false);
    return;
  }
  const size_t decile = total_ == 0 ? 10 : done * 10 / total_;
  if (decile > last_decile_ && done < total_) {
    last_decile_ = decile;
    Draw(done, status, false);
  }
}

void ProgressBar::Finish(const std::string& status) {
  std::lock_guard<std::mutex> lock(mu_);
  if (out_ == nullptr || finished_) return;
  finished_ = true;
  Draw(total_, status, true);
}

void ProgressBar::Draw(size_t done, const std::string& status, bool final) {
  const double elapsed = SteadyNowSeconds() - start_s_;
  const double frac = total_ == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total_);
  constexpr int kWidth = 24;
  std::string bar(kWidth, ' ');
  const int filled = static_cast<int>(frac * kWidth);
  for (int i = 0; i < filled && i < kWidth; ++i) bar[static_cast<size_t>(i)] = '=';
  if (filled < kWidth && done > 0) bar[static_cast<size_t>(filled)] = '>';
  const double eta = done == 0 ? NAN : elapsed / static_cast<double>(done) * static_cast<double>(total_ - done);
  std::string line = label_ + " [" + bar + "] " + std::to_string(done) + "/" + std::to_string(total_);
  if (!status.empty()) line += "  " + status;
  line += "  " + Clock(elapsed) + (final ? "" : " eta " + Clock(eta));
  if (tty_) {
    std::fprintf(out_, "\r\033[K%s%s", line.c_str(), final ? "\n" : "");
  } else {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  std::fflush(out_);
}

}  // namespace kimirt::eval
