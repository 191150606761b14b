#!/usr/bin/env bash
# Checks the decode MoE on tensor cores (src/kimirt/backend/cuda/moe_kernels.cu: ExpertMmaKernel,
# BF16- and MXFP4-held, gate/up and down, 1, 2 and 4 token tiles, with SplitRowsKernel,
# GluSplitKernel and MoeCombineSplitsKernel around it through MoeDecodeExperts) without a GPU, as
# scripts/decode_gemm_group_emulate.sh does the decode GEMM: the kernel file is turned into host
# C++ (mma_bf16.cuh's inline PTX replaced by the emulated MMA of scripts/kda_chunk_emulation/shim.h,
# mul.rn.bf16x2 by a host BF16 multiply, `__shared__` arrays by statics (one block runs at a time),
# __syncwarp by the warp's barrier, the weight loads and L2 prefetches by range-checked host
# versions, pdl.cuh's launch and `<<<>>>` by host launches that run a 128-thread block as
# fibers: scripts/moe_decode_emulation/moe_decode_host.h), and driver.cpp checks every
# output bit-identical to a host computation of the kernel's MMA order, MXFP4 experts against the
# same experts held as BF16, BF16 experts decode-tiled (decode_tiled.cuh, where the widths allow)
# against the row-major ones, each token against itself alone, and that nothing outside the
# expert's group rows and weight rows is written. It checks indexing, the MXFP4 exchange and
# decode (both scale paths), k slices and partial rounds, not the GPU's rounding or speed
# (CudaBackend MoE tests do); the MMA and decode checks run twice, 8 tokens a tile and part
# columns (a light routed load). `route`: the router's top-k (MoeRouteWarpKernel, its warp shuffles
# and ballot through the warp's barrier; MoeRouteSerial) against a sort here, ties included.
# About two minutes on two cores.
# Usage: bash scripts/moe_decode_emulate.sh [mma|decode|route]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$repo/src/kimirt/backend/cuda" "$work/kernel_host.cpp" "$here/decode_gemm_group_emulation" <<'PY'
import re
import sys
cuda_dir, out = sys.argv[1], sys.argv[2]
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[3])
from mma_host import cut, host_mma
# mma_bf16.cuh: the shim's MMA, and moe_decode_host.h's range-checked load and prefetch.
mma = host_mma(cuda_dir, "return HostLoadStreaming(p);", "HostPrefetchL2(p, bytes);")
src = open(cuda_dir + "/moe_kernels.cu").read()
for inc in ('#include "kimirt/backend/cuda/mma_bf16.cuh"\n', '#include "kimirt/backend/cuda/pdl.cuh"\n'):
    assert inc in src, inc
src = src.replace('#include "kimirt/backend/cuda/pdl.cuh"\n', "")
src = src.replace('#include "kimirt/backend/cuda/mma_bf16.cuh"\n', '#include "moe_decode_host.h"\n' + mma)
# block_reduce.cuh (WarpSum) after the host header that defines __device__ and the shuffles.
block_reduce = '#include "kimirt/backend/cuda/block_reduce.cuh"\n'
assert block_reduce in src
src = src.replace(block_reduce, "").replace('#include "moe_decode_host.h"\n', '#include "moe_decode_host.h"\n' + block_reduce, 1)
src = cut(src, "__device__ __forceinline__ uint32_t MulBf16x2(",
          "inline uint32_t MulBf16x2(uint32_t a, uint32_t b) { return HostMulBf16x2(a, b); }\n")
# Shared memory: dynamic as the launch's buffer, static arrays as statics (the host launch runs
# one block at a time, so a block's threads share them and no other block's do).
src = re.sub(r"extern __shared__ (?:__align__\(\d+\) )?(\w+) (\w+)\[\];",
              r"\1* const \2 = reinterpret_cast<\1*>(g_dyn_smem);", src)
src = re.sub(r"__shared__ __align__\((\d+)\)", r"alignas(\1) static", src)
src = src.replace("__shared__ ", "static ")
# kernel<<<grid, block, smem, stream>>>(args) → HostLaunch(kernel, grid, block, smem, stream)(args).
src = re.sub(r"(\w+(?:<\w+>)?)<<<(.*?)>>>\(", r"HostLaunch(\1, \2)(", src)
assert "asm" not in src and "__shared__" not in src and "<<<" not in src
assert "ExpertMmaKernel" in src and "__syncwarp()" in src
open(out, "w").write(src)
PY
g++ -std=c++20 -O2 -pthread -fno-strict-aliasing -Wall -Wextra -Wno-unknown-pragmas -Wno-unused-function \
  -Wno-unused-parameter -I"$here/moe_decode_emulation" -I"$here/decode_gemm_group_emulation" \
  -I"$here/kda_chunk_emulation" -I"$work" -I"$repo/src" "$here/moe_decode_emulation/driver.cpp" \
  -o "$work/moe_decode_emulation"
timeout 1200 "$work/moe_decode_emulation" "$@"
