#!/usr/bin/env bash
# Packs what a GPU machine needs to run kimirt's CUDA tests and benches into .carry/gpu/
# (git-ignored): the CUDA build's `kimirt`, `kimirt_tests` and kernel benches (bench/*_bench.cu,
# and mla_decode_bench, which uses only the Backend interface), stripped, with the Debian shared
# libraries they need that a CUDA image lacks, and the test data (tests/fixtures, configs, bench
# configs). cuBLAS and the CUDA runtime are not packed (hundreds of MB): scripts/gpu_check.sh
# finds the GPU machine's own.
#
# Usage: scripts/gpu_bundle.sh   (then scripts/gpu_run.sh MODE... on the GPU machine, carrying .carry)
# KIMIRT_BUNDLE_BENCHES="decode_gemm_bench moe_bench" packs only those benches: a device call
# carries 64 MiB with the tracked tree (~28 MB), and every bench makes the bundle ~38 MB.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build-cuda -G Ninja -DCMAKE_BUILD_TYPE=Release -DKIMIRT_CUDA=ON \
  -DCMAKE_CUDA_COMPILER="${CUDACXX:-/usr/local/cuda/bin/nvcc}" >/dev/null
# The CUDA kernel benches, and the plain programs that take --device cuda (moe_bench,
# mla_decode_bench).
benches="${KIMIRT_BUNDLE_BENCHES:-$(cd bench && ls *_bench.cu | sed 's/\.cu$//') moe_bench mla_decode_bench}"
# shellcheck disable=SC2086
ninja -C build-cuda kimirt kimirt_tests $benches
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/lib" "$stage/shared"
cp build-cuda/kimirt build-cuda/kimirt_tests "$stage/"
for b in $benches; do cp "build-cuda/bench/$b" "$stage/"; done
strip "$stage/kimirt" "$stage/kimirt_tests"
for b in $benches; do strip "$stage/$b"; done
for lib in libpcre2-8.so.0 libcpp-httplib.so.0.11 \
           libbrotlidec.so.1 libbrotlienc.so.1 libbrotlicommon.so.1; do
  cp -L "/lib/x86_64-linux-gnu/$lib" "$stage/lib/"
done
# The kernel tracer (bench/kernel_trace.cpp, gpu_check.sh trace) and the CUPTI it was built with.
ninja -C build-cuda kimirt_kernel_trace >/dev/null
cp build-cuda/bench/libkimirt_kernel_trace.so "$stage/" && strip "$stage/libkimirt_kernel_trace.so"
cp -L "$(dirname "$(readlink -f "${CUDACXX:-/usr/local/cuda/bin/nvcc}")")/../lib/libcupti.so.13" "$stage/lib/"
# The shared layout the tests read through KIMIRT_SHARED_DIR (testing/test_data.h).
cp -r tests/fixtures configs "$stage/shared/"
mkdir -p "$stage/shared/bench" && cp -r bench/configs "$stage/shared/bench/"
mkdir -p .carry/gpu
tar -C "$stage" -cJf .carry/gpu/bundle.tar.xz .
cp scripts/gpu_check.sh .carry/gpu/
ls -la .carry/gpu
