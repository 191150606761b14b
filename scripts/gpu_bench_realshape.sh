#!/usr/bin/env bash
# Runs on a GPU machine like scripts/gpu_check.sh (carrying .carry): `kimirt bench model` on a
# 2-layer Kimi-Linear-48B (real widths: hidden 2304, 256 experts of 1024, vocab 163,840; random
# weights, 5.4 GB in BF16) on CUDA, so the decode step's fraction of HBM bandwidth is measured at
# the real model's matrix sizes. Usage: bash scripts/gpu_bench_realshape.sh
set -uo pipefail
out="${OUT:-/tmp/kimirt-out}"; mkdir -p "$out"
root=/tmp/kimirt-gpu; rm -rf "$root"; mkdir -p "$root"; tar -C "$root" -xJf .carry/gpu/bundle.tar.xz
export LD_LIBRARY_PATH="$root/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
timeout 420 "$root/kimirt" bench model --device cuda --config bench/configs/kimi-linear-48b-2layer.json \
  --random-weights --batch-sizes 1,8,32 --prompt-len 256 --decode-tokens 16 --peak-gbps 4800 \
  --json "$out/bench-model-kimi-linear-2layer-cuda-bfloat16.json" 2>&1 | tail -8
