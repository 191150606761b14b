#!/usr/bin/env bash
# Builds and runs the whole test suite (what CI runs). Tests read fixtures and configs from
# ../shared beside the checkout (override with KIMIRT_SHARED_DIR=...).
set -euo pipefail
cd "$(dirname "$0")/.."
# The same configuration as scripts/setup.sh (so nothing rebuilds), unless KIMIRT_SHARED_DIR
# points elsewhere.
extra=()
[ -n "${KIMIRT_SHARED_DIR:-}" ] && extra+=("-DKIMIRT_SHARED_DIR=$KIMIRT_SHARED_DIR")
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "${extra[@]}" >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
# Where the CUDA toolkit is installed, the CUDA backend must at least compile (DESIGN.md); it runs
# on a GPU machine through scripts/gpu_bundle.sh + scripts/gpu_check.sh.
nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ -x "$nvcc" ]; then
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" \
    "${extra[@]}" >/dev/null
  cmake --build build-cuda --target kimirt_backend
  echo "CUDA backend compiled with $nvcc"
else
  echo "no nvcc: the CUDA backend was not compiled"
fi
