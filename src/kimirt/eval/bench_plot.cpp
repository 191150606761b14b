#include "kimirt/eval/bench_plot.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace kimirt::eval {
namespace {

// gnuplot string literal in single quotes: only the quote itself needs doubling.
std::string Quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) {
    if (c == '\'') out += "''";
    else if (c != '\n') out.push_back(c);
  }
  return out + "'";
}

}  // namespace

std::string GnuplotScript(const std::vector<PlotPoint>& points, const std::string& png_path, const std::string& title) {
  std::string s;
  s += "set terminal pngcairo size 1200,520 noenhanced font 'sans,10'\n";
  s += "set output " + Quote(png_path) + "\n";
  s += "$runs << EOD\n";
  char line[256];
  for (const PlotPoint& p : points) {
    std::snprintf(line, sizeof(line), "%.6g %.6g %.6g \"%s\"\n", p.output_throughput, p.median_tpot_ms,
                  p.median_ttft_ms, p.label.c_str());
    s += line;
  }
  s += "EOD\n";
  s += "set multiplot layout 1,2 title " + Quote(title) + "\n";
  // Axes from zero, so a small latency change does not look like a cliff; headroom for labels.
  s += "set grid\nset key off\nset xrange [0:*]\nset yrange [0:*]\nset offsets 0, graph 0.08, graph 0.15, 0\n";
  s += "set xlabel 'output throughput (tok/s)'\n";
  s += "set ylabel 'median TPOT (ms)'\n";
  s += "plot $runs using 1:2 with linespoints pt 7, '' using 1:2:4 with labels offset 0,1\n";
  s += "set ylabel 'median TTFT (ms)'\n";
  s += "plot $runs using 1:3 with linespoints pt 7, '' using 1:3:4 with labels offset 0,1\n";
  s += "unset multiplot\n";
  return s;
}

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  std::string p(path);
  size_t pos = 0;
  while (pos <= p.size()) {
    size_t end = p.find(':', pos);
    if (end == std::string::npos) end = p.size();
    const std::string dir = p.substr(pos, end - pos);
    const std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
    pos = end + 1;
  }
  return "";
}

Status PlotThroughputLatency(const std::vector<PlotPoint>& points, const std::string& png_path, const std::string& title) {
  const std::string gnuplot = FindOnPath("gnuplot");
  if (gnuplot.empty()) {
    return NotFound("--plot needs gnuplot, which is not on PATH: install the Debian package gnuplot-nox "
                    "(apt-get install gnuplot-nox), or drop --plot (--json keeps the numbers)");
  }
  if (points.empty()) return InvalidArgument("--plot: no successful run to plot");
  std::error_code ec;
  const std::filesystem::path script =
      std::filesystem::temp_directory_path(ec) / ("kimirt_plot_" + std::to_string(getpid()) + ".gp");
  {
    std::ofstream f(script);
    f << GnuplotScript(points, png_path, title);
    if (!f) return IoError(script.string() + ": cannot write the gnuplot script");
  }
  const std::string cmd = "'" + gnuplot + "' '" + script.string() + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  if (pipe == nullptr) return IoError("cannot run " + gnuplot);
  std::string output;
  char buf[512];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), pipe)) > 0) output.append(buf, n);
  const int status = pclose(pipe);
  std::filesystem::remove(script, ec);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return Internal("gnuplot failed drawing " + png_path + ": " + output);
  }
  if (!std::filesystem::exists(png_path, ec)) return Internal("gnuplot wrote no " + png_path + ": " + output);
  return Status::Ok();
}

}  // namespace kimirt::eval
