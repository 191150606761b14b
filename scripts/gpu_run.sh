#!/usr/bin/env bash
# Runs several scripts/gpu_check.sh modes in one device call, each writing under $OUT/MODE, then
# packs $OUT into $OUT/all.tgz: the device tool brings back only a few files a call, so many
# small logs and JSONs would be left behind. Each mode's last lines are printed as it ends.
#
# Usage (on the GPU machine, .carry carried): bash scripts/gpu_run.sh tests gemm moeab ...
# KIMIRT_RUN_BUDGET_S (default 570): each mode runs under `timeout` of what is left of it and a mode
# not started by then is skipped, so the packing below always happens inside the device call's
# limit (a call cut off brings nothing back).
set -uo pipefail
cd "$(dirname "$0")/.."
top="${OUT:-/tmp/kimirt-out}"
status=0
start=$(date +%s)
budget=${KIMIRT_RUN_BUDGET_S:-570}
for mode in "$@"; do
  left=$(( budget - ($(date +%s) - start) ))
  if (( left < 20 )); then echo "=== $mode: skipped (${left} s of the budget left)"; status=1; continue; fi
  mkdir -p "$top/$mode"
  OUT="$top/$mode" timeout -k 5 "$left" bash scripts/gpu_check.sh "$mode" >"$top/$mode/run.txt" 2>&1
  rc=$?
  [[ $rc -eq 0 ]] || status=1
  echo "=== $mode: exit $rc at $(( $(date +%s) - start )) s"
  tail -25 "$top/$mode/run.txt"
done
( cd "$top" && tar czf /tmp/kimirt-all.tgz . && find . -mindepth 1 -delete && mv /tmp/kimirt-all.tgz all.tgz )
exit $status
