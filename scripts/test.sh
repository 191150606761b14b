#!/usr/bin/env bash
# Builds and runs the whole test suite (what CI runs). Tests read fixtures and configs from
# ../shared beside the checkout (override with KIMIRT_SHARED_DIR=...).
set -euo pipefail
cd "$(dirname "$0")/.."
shared="${KIMIRT_SHARED_DIR:-$(cd .. && pwd)/shared}"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_SHARED_DIR="$shared" >/dev/null
cmake --build build
ctest --test-dir build --output-on-failure -j "$(nproc)"
