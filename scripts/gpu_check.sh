#!/usr/bin/env bash
# Runs on a GPU machine (the device tool), from the repository root, with .carry carried:
# unpacks .carry/gpu/bundle.tar.xz (scripts/gpu_bundle.sh), then
#   1. the CUDA backend's op tests and the fixtures' goldens on CUDA (GoogleTest JSON to $OUT),
#   2. the same tests under compute-sanitizer memcheck (when the machine has it),
#   3. `kimirt bench model` on the built-in model, CUDA and CPU in the same run (--json to $OUT),
#   4. `kimirt serve --device cuda` (the GPU memory budget path) driven by `kimirt bench serve`.
# Usage: bash scripts/gpu_check.sh [tests|bench|serve|all]
set -uo pipefail
what="${1:-all}"
out="${OUT:-/tmp/kimirt-out}"
mkdir -p "$out"
root=/tmp/kimirt-gpu
rm -rf "$root" && mkdir -p "$root"
tar -C "$root" -xJf .carry/gpu/bundle.tar.xz
# The test binary reads its data from the bundle (testing/test_data.h); a missing file fails.
export KIMIRT_SHARED_DIR="$root/shared"
cublas=$(ls /usr/local/cuda/lib64/libcublas.so.13 2>/dev/null ||
         find / -xdev -name 'libcublas.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
cudart=$(ls /usr/local/cuda/lib64/libcudart.so.13 2>/dev/null ||
         find / -xdev -name 'libcudart.so.13' -not -path '*/proc/*' 2>/dev/null | head -1)
export LD_LIBRARY_PATH="$root/lib:$(dirname "$cublas"):$(dirname "$cudart"):${LD_LIBRARY_PATH:-}"
export XDG_CACHE_HOME=/tmp/kimirt-cache
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv | tee "$out/gpu.txt"
echo "cublas: $cublas  cudart: $cudart"
status=0
filter='CudaBackend*:Fixtures/GoldenTest.*cuda*:Fixtures/DecodeBatchTest.*cuda*:Devices/EngineTest.*cuda*:Devices/PrefixCachingEngineTest.*cuda*'
if [[ "$what" == tests || "$what" == all ]]; then
  # Time limits everywhere: a hung kernel must not eat the lease.
  timeout 120 "$root/kimirt_tests" --gtest_filter="$filter" --gtest_output="json:$out/gtest-cuda.json" 2>&1 |
    tee "$out/gtest-cuda.txt" | grep -E '^\[ +(OK|FAILED|SKIPPED|PASSED) +\]|Failure|error' | head -60
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  if command -v compute-sanitizer >/dev/null; then
    timeout 180 compute-sanitizer --tool memcheck --error-exitcode 9 "$root/kimirt_tests" --gtest_filter="$filter" \
      >"$out/memcheck.txt" 2>&1
    echo "memcheck exit $? ($(grep -c 'Invalid' "$out/memcheck.txt") invalid accesses)"
  fi
fi
if [[ "$what" == bench || "$what" == all ]]; then
  for run in "cuda bfloat16" "cuda float32" "cpu float32"; do
    set -- $run
    timeout 120 "$root/kimirt" bench model --device "$1" --dtype "$2" --batch-sizes 1,8 --prompt-len 256 \
      --decode-tokens 32 --peak-gbps 4800 --json "$out/bench-model-builtin-$1-$2.json" 2>&1 | tail -4
  done
fi
if [[ "$what" == serve || "$what" == all ]]; then
  log="$out/serve-cuda.log"
  "$root/kimirt" serve --device cuda --port 8123 --gpu-memory-utilization 0.5 >"$log" 2>&1 &
  server=$!
  for _ in $(seq 1 300); do grep -q "listening on" "$log" && break; sleep 0.1; done
  grep -E "loaded in|listening" "$log"
  timeout 120 "$root/kimirt" bench serve --url http://127.0.0.1:8123 --input-len 256 --output-len 64 \
    --num-prompts 64 --sweep-concurrency 1,8 --ignore-eos --json "$out/bench-serve-builtin-cuda.json" 2>&1 | tail -12
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  kill -TERM $server; wait $server
  echo "serve exit $?"
fi
exit $status
