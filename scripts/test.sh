#!/usr/bin/env bash
# Builds and runs the whole test suite (what CI runs). Tests read their data from the repository
# (tests/fixtures, configs, data); KIMIRT_SHARED_DIR=DIR reads it from DIR's fixtures/, configs/
# and data/ instead, at run time.
set -euo pipefail
cd "$(dirname "$0")/.."
# The same configuration as scripts/setup.sh, so nothing rebuilds.
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
# Where the CUDA toolkit is installed, the CUDA backend must at least compile (DESIGN.md); it runs
# on a GPU machine through scripts/gpu_bundle.sh + scripts/gpu_check.sh.
nvcc="${CUDACXX:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}"
if [ -x "$nvcc" ]; then
  SECONDS=0
  cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc" >/dev/null
  cmake --build build-cuda --target kimirt_backend
  echo "CUDA backend compiled with $nvcc in ${SECONDS} s"
else
  echo "no nvcc: the CUDA backend was not compiled"
fi
