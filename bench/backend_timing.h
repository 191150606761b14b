// Times a call on a Backend (bench programs that drive the engine's ops through Backend, *_bench.cpp):
// eagerly, back to back, and captured once as a CUDA graph and replayed back to back, as a decode
// step runs it. At batch 1 an eager call can measure the host's launches as much as the device.
#pragma once

#include <chrono>
#include <string>

#include "kimirt/backend/backend.h"

namespace kimirt {

// Seconds a call of `call`, `iters` calls after three to warm up; `sync` is a tensor the call
// writes (downloaded to wait for the stream).
template <typename F>
double SecondsPerCall(Backend& be, const Tensor& sync, int iters, F call) {
  for (int i = 0; i < 3; ++i) call();
  be.Download(sync);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) call();
  be.Download(sync);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

// The same, with `call` captured once under `key` (Backend::CaptureBegin) and the graph replayed
// `iters` times after `warmup` replays; `out` is what the call writes (the graph's output). 0 where
// the backend has no graphs or the capture failed.
template <typename F>
double GraphSecondsPerCall(Backend& be, const std::string& key, const Tensor& out, int iters, F call, int warmup = 3) {
  if (!be.SupportsGraphs()) return 0.0;
  be.CaptureBegin(key);
  call();
  if (!be.CaptureEnd(out)) return 0.0;
  Tensor last;
  for (int i = 0; i < warmup; ++i) last = be.Replay(key);
  be.Download(last);
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < iters; ++i) last = be.Replay(key);
  be.Download(last);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() / iters;
}

}  // namespace kimirt
