// `kimirt bench serve --plot out.png`: throughput against latency, one point per run (per
// concurrency in a sweep), drawn by gnuplot (Debian package gnuplot-nox). Two panels share the
// x axis (output tokens/s): median TPOT and median TTFT, each point labelled with its
// concurrency, so the knee where batching stops paying is visible at a glance.
#pragma once

#include <string>
#include <vector>

#include "kimirt/core/status.h"

namespace kimirt::eval {

struct PlotPoint {
  std::string label;             // e.g. "c=8"
  double output_throughput = 0;  // tok/s
  double median_tpot_ms = 0;
  double median_ttft_ms = 0;
};

// The gnuplot script that draws `points` into `png_path` (exposed for tests).
std::string GnuplotScript(const std::vector<PlotPoint>& points, const std::string& png_path, const std::string& title);

// Path of an executable on $PATH, or empty.
std::string FindOnPath(const std::string& name);

// Runs gnuplot; a clear error when it is not installed.
Status PlotThroughputLatency(const std::vector<PlotPoint>& points, const std::string& png_path, const std::string& title);

}  // namespace kimirt::eval
