#!/usr/bin/env bash
# Runs several scripts/gpu_check.sh modes in one device call, each writing under $OUT/MODE, then
# packs $OUT into $OUT/all.tgz: the device tool brings back only a few files a call, so many
# small logs and JSONs would be left behind. Each mode's last lines are printed as it ends.
#
# Usage (on the GPU machine, .carry carried): bash scripts/gpu_run.sh tests gemm moeab ...
set -uo pipefail
cd "$(dirname "$0")/.."
top="${OUT:-/tmp/kimirt-out}"
status=0
start=$(date +%s)
for mode in "$@"; do
  mkdir -p "$top/$mode"
  OUT="$top/$mode" bash scripts/gpu_check.sh "$mode" >"$top/$mode/run.txt" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || status=1
  echo "=== $mode: exit $rc at $(( $(date +%s) - start )) s"
  tail -25 "$top/$mode/run.txt"
done
( cd "$top" && tar czf /tmp/kimirt-all.tgz . && find . -mindepth 1 -delete && mv /tmp/kimirt-all.tgz all.tgz )
exit $status
