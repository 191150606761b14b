#!/usr/bin/env bash
# Checks cuda::Gemv (src/kimirt/backend/cuda/weight_kernels.cu: the staged kernel for aligned F32
# or BF16 weights, the general one for the rest) without a GPU, as scripts/kda_chunk_emulate.sh does the
# chunked KDA kernel: the kernel file is turned into host C++ (scripts/gemv_emulation/gemv_host.h:
# blocks as 256 fibers, cp.async landing only at its wait, the L2 prefetch as a range
# check), and driver.cpp checks every (row, column) bit for bit against the order the kernel
# promises (lane sums k = j, j + 32, ... with fmaf, then the xor butterfly), each row alone
# against the batch. It checks the kernels' indexing, pipeline and sum order, not the GPU's
# speed (CudaBackendGemv.* runs them). About a minute on two cores.
# Usage: bash scripts/gemv_emulate.sh [case name]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$repo/src/kimirt/backend/cuda/weight_kernels.cu" "$work/kernel_host.cpp" <<'PY'
import sys
src = open(sys.argv[1]).read()
def cut(s, start):
    a = s.index(start)
    b = s.index("\n}\n", a) + len("\n}\n")
    return s[:a] + s[b:]
def swap(s, old, new):
    assert old in s, old
    return s.replace(old, new)
# dynamic_smem.cuh's AllowDynamicSmem over the host header's attribute stubs.
dyn = open(sys.argv[1].replace("weight_kernels.cu", "dynamic_smem.cuh")).read()
dyn = dyn.replace("#pragma once\n", "").replace("#include <cuda_runtime.h>\n", "")
src = swap(src, '#include "kimirt/backend/cuda/dynamic_smem.cuh"\n', "")
src = swap(src, '#include "kimirt/backend/cuda/kernels.h"\n', '#include "gemv_host.h"\n' + dyn)
for inc in ("<cuda_bf16.h>", '"kimirt/backend/cuda/cp_async.cuh"', '"kimirt/backend/cuda/mma_bf16.cuh"',
            '"kimirt/backend/cuda/pdl.cuh"'):
    src = swap(src, "#include " + inc + "\n", "")
# BF16 → F32 widening is not Gemv's.
src = cut(src, "__global__ void Bf16ToF32Kernel(")
src = cut(src, "void Bf16ToF32(const void* src")
# Shared memory: the launch's per-block buffer; static arrays shared by the block's threads.
src = swap(src, "extern __shared__ __align__(16) uint8_t staged_smem[];",
           "uint8_t* staged_smem = reinterpret_cast<uint8_t*>(g_smem);")
src = swap(src, "__shared__ __align__(16)", "alignas(16) static")
src = swap(src, "GemvKernel<<<static_cast<unsigned>(blocks), kWarps * 32, 0, s>>>(",
           'LaunchPdl("GemvKernel", GemvKernel, dim3(static_cast<unsigned>(blocks)), dim3(kWarps * 32), 0, s, ')
# nvcc contracts the general kernel's acc += xv · w to one FFMA (its SASS has no FMUL); the host
# compiler does not, so say it.
src = swap(src, "acc[g][c] += xv * ws[c][i];", "acc[g][c] = std::fmaf(xv, ws[c][i], acc[g][c]);")
assert "asm" not in src and "<<<" not in src and "__shared__" not in src
open(sys.argv[2], "w").write(src)
PY
g++ -std=c++20 -O2 -pthread -fno-strict-aliasing -Wno-unknown-pragmas -I"$here/gemv_emulation" \
  -I"$here/kda_chunk_emulation" -I"$work" -I"$repo/src" "$here/gemv_emulation/driver.cpp" -o "$work/gemv_emulation"
timeout 1200 "$work/gemv_emulation" "$@"
