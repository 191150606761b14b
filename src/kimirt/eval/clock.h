// Time for the client tools: a steady clock for latencies (never steps with NTP) and the UTC
// wall time stamped into reports.
#pragma once

#include <string>

namespace kimirt::eval {

// Steady-clock seconds (an arbitrary epoch shared by every caller in the process).
double SteadyNowSeconds();
// "2026-01-31T12:00:00Z"
std::string UtcNowIso8601();

}  // namespace kimirt::eval
