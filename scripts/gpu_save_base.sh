#!/usr/bin/env bash
# Saves the CUDA build's current binaries as the base of an A/B run (scripts/gpu_check.sh abbin):
# run it before building a change; the device call then carries .carry (bundle + base) and times
# both in one run. Stripped and xz-packed (~5 MB for kimirt, ~0.5 MB for a kernel bench), so the
# carry stays under its 64 MiB with the tracked tree and the bundle.
# Usage: scripts/gpu_save_base.sh [bench ...]   (kimirt always; e.g. decode_gemm_bench, moe_bench)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .carry/base
rm -f .carry/base/*.xz
for b in kimirt "$@"; do
  src=build-cuda/$b
  [[ -f $src ]] || src=build-cuda/bench/$b
  [[ -f $src ]] || { echo "gpu_save_base: no build-cuda/$b or build-cuda/bench/$b (build it first)"; exit 1; }
  tmp=$(mktemp)
  strip -o "$tmp" "$src"
  xz -T2 -c "$tmp" > ".carry/base/$b.xz"
  rm -f "$tmp"
done
echo "saved $(ls .carry/base | tr "\n" " ")from $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (with uncommitted changes)')"
