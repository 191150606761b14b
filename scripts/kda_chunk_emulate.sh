#!/usr/bin/env bash
# Checks the chunked KDA prefill kernel (src/kimirt/backend/cuda/kda_chunk_kernels.cu) without a
# GPU: the kernel's source is turned into host C++ (its inline-PTX MMA replaced by an emulation,
# its L2 prefetch by nothing, shared memory by a buffer, the launcher dropped), its thread blocks run as 256
# fibers with barriers (scripts/kda_chunk_emulation/shim.h), and driver.cpp compares it with
# a float64 recurrence and checks batch invariance. It checks indexing, tiling, synchronization
# and the algorithm, not the GPU's rounding or speed (the CUDA tests do: CudaBackendKdaChunk*).
# About a minute on two cores. Usage: bash scripts/kda_chunk_emulate.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$repo/src/kimirt/backend/cuda/kda_chunk_kernels.cu" "$work/kernel_host.cpp" <<'PY'
import sys
src = open(sys.argv[1]).read()
def cut(s, start, end_marker, repl):
    a = s.index(start)
    b = s.index(end_marker, a) + len(end_marker)
    return s[:a] + repl + s[b:]
src = cut(src, "__device__ __forceinline__ void Mma(", "\n}\n",
          "__device__ __forceinline__ void Mma(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) "
          "{ EmuMma(c, a, b); }\n")
# cp.async as plain copies (the data is there at once: stronger than the device's ordering, so
# this checks what is copied where, not the wait_group placement).
assert '#include "kimirt/backend/cuda/cp_async.cuh"\n' in src
src = src.replace('#include "kimirt/backend/cuda/cp_async.cuh"\n', "")
# The launches (dynamic_smem.cuh's only users here) are cut below.
assert '#include "kimirt/backend/cuda/dynamic_smem.cuh"\n' in src
src = src.replace('#include "kimirt/backend/cuda/dynamic_smem.cuh"\n', "")
cp_async = ("inline void CpAsync16(void* smem, const void* gmem, bool valid = true) "
            "{ if (valid) std::memcpy(smem, gmem, 16); else std::memset(smem, 0, 16); }\n"
            "inline void CpAsyncCommit() {}\ntemplate <int N>\ninline void CpAsyncWait() {}\n")
src = cut(src, "__device__ __forceinline__ void LdMatrixX4(", "\n}\n",
          "inline void LdMatrixX4(uint32_t (&d)[4], const Bf16Bits* p) { EmuLdMatrixX4(d, p); }\n")
# The state kernel's bulk L2 prefetch (mma_bf16.cuh, whose other device code the host cannot
# compile) as nothing; ldmatrix .trans (ldmatrix_mma.cuh) and the MUFU's 2^x emulated.
assert "mma::PrefetchL2(" in src and "Ldmatrix4Trans(" in src
src = src.replace('#include "kimirt/backend/cuda/mma_bf16.cuh"\n', "")
# ldmatrix_mma.cuh inlined without its PTX (ldmatrix .trans emulated below).
header = open(sys.argv[1].replace("kda_chunk_kernels.cu", "ldmatrix_mma.cuh")).read()
for fn in ("Mma(", "Ldmatrix4(", "Ldmatrix4Trans("):
    header = cut(header, "__device__ __forceinline__ void " + fn, "\n}\n", "")
src = src.replace('#include "kimirt/backend/cuda/ldmatrix_mma.cuh"\n', header.replace("#pragma once\n", ""))
src = src.replace("mma::PrefetchL2(", "EmuPrefetchL2Bulk(")
src = src.replace("Ldmatrix4Trans(", "EmuLdMatrixX4Trans(")
src = cut(src, "__device__ __forceinline__ float ExpFtz(", "\n}\n",
          "inline float ExpFtz(float x) { return std::exp(x); }\n")
src = src[:src.index("template <int P, int VB>\nvoid Launch(")] + "}  // namespace\n}  // namespace kimirt::cuda\n"
prefetch = 'asm volatile("prefetch.global.L2 [%0];" ::"l"(p));'
assert prefetch in src and "extern __shared__ float4 smem_f4[];" in src
src = src.replace(prefetch, "(void)p;")
src = src.replace("extern __shared__ float4 smem_f4[];", "float4* smem_f4 = g_smem;")
src = src.replace('#include "kimirt/backend/cuda/kda_activations.cuh"',
                  '#include "shim.h"\ninline float4* g_smem;\n' + cp_async +
                  '#include "kimirt/backend/cuda/kda_activations.cuh"')
open(sys.argv[2], "w").write(src)
PY
g++ -std=c++20 -O2 -pthread -I"$here/kda_chunk_emulation" -I"$work" -I"$repo/src" \
  "$here/kda_chunk_emulation/driver.cpp" -o "$work/kda_chunk_emulation"
timeout 900 "$work/kda_chunk_emulation"
