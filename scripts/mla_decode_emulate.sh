#!/usr/bin/env bash
# Checks the paged MLA decode split on tensor cores (src/kimirt/backend/cuda/mla_decode_kernels.cu,
# both variants: ring4 and ring2) without a GPU, as scripts/kda_chunk_emulate.sh does the chunked
# KDA kernel: the kernel file is turned into host C++ (ldmatrix_mma.cuh's inline PTX replaced by the
# emulated ldmatrix / ldmatrix.trans / MMA of scripts/kda_chunk_emulation/shim.h, cp.async by
# memcpy, the FP8 widening by a host E4M3 decode, shared memory by a buffer, the launcher dropped),
# a block's 256 threads run as fibers with barriers, and driver.cpp runs chosen (sequence,
# split) blocks over random paged latents (BF16, and FP8 with per-row scales; a non-contiguous
# block table, an odd context, splits that start mid-block and wrap the rings) against a float64
# reference, and checks ring2's outputs bit-identical to ring4's. It checks indexing, which stage
# of a ring each tile goes to, the barriers between phases (real ones between the threads) and
# the order of the sums (the emulated MMA rounds once, so two kernels with the same sums in the
# same order agree); not cp.async's wait counts (the copies land at once), the tensor cores'
# rounding or speed (CudaBackendTest.PagedDecode* do). About 15 seconds on two cores.
# Usage: bash scripts/mla_decode_emulate.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$repo/src/kimirt/backend/cuda" "$work/kernel_host.cpp" "$here/decode_gemm_group_emulation" <<'PY'
import sys
cuda_dir, out = sys.argv[1], sys.argv[2]
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[3])
from mma_host import host_ldmatrix_mma
def cut(s, start, end_marker, repl):
    a = s.index(start)
    b = s.index(end_marker, a) + len(end_marker)
    return s[:a] + repl + s[b:]
# ldmatrix_mma.cuh without its PTX: the shim's emulated ldmatrix (.trans) and MMA instead.
header = host_ldmatrix_mma(cuda_dir)
# cp.async as plain copies (the data is there at once: stronger than the device's ordering, so
# this checks what is copied where, not the wait_group placement).
cp_async = """namespace kimirt::cuda {
inline void CpAsync16(void* d, const void* s, bool valid = true) { if (valid) std::memcpy(d, s, 16); else std::memset(d, 0, 16); }
inline void CpAsync8(void* d, const void* s, bool valid = true) { if (valid) std::memcpy(d, s, 8); else std::memset(d, 0, 8); }
inline void CpAsyncCommit() {}
template <int N>
inline void CpAsyncWait() {}
}  // namespace kimirt::cuda
"""
src = open(cuda_dir + "/mla_decode_kernels.cu").read()
for inc in ("cp_async.cuh", "ldmatrix_mma.cuh", "pdl.cuh"):
    assert f'#include "kimirt/backend/cuda/{inc}"\n' in src, inc
src = src.replace('#include "kimirt/backend/cuda/pdl.cuh"\n', "")
# The launch (dynamic_smem.cuh's only user here) is cut below.
assert '#include "kimirt/backend/cuda/dynamic_smem.cuh"\n' in src
src = src.replace('#include "kimirt/backend/cuda/dynamic_smem.cuh"\n', "")
src = src.replace('#include "kimirt/backend/cuda/cp_async.cuh"\n', '#include "mla_decode_host.h"\n' + cp_async)
src = src.replace('#include "kimirt/backend/cuda/ldmatrix_mma.cuh"\n', header)
src = src.replace("#include <cuda_fp8.h>\n", "")
src = cut(src, "__device__ __forceinline__ unsigned Fp8x2ToBf16x2(", "\n}\n",
          "inline unsigned Fp8x2ToBf16x2(unsigned short c) { return PackBf16(E4m3ToFloat(c & 0xff), E4m3ToFloat(c >> 8)); }\n")
smem = "extern __shared__ __align__(128) unsigned char smem_raw[];"
assert smem in src
src = src.replace("__launch_bounds__(kThreads)", "")  # the shim's macro takes two arguments
src = src.replace(smem, "unsigned char* const smem_raw = g_smem;")
# The launcher and the entry points (CUDA runtime calls) go; the driver runs the kernels' blocks.
src = cut(src, "template <int kKind, class V, class Kernel>\nvoid Launch(", "\n}\n", "")
src = src[:src.index("void MlaPagedDecodeSplitTc(")] + "}  // namespace kimirt::cuda\n"
assert "asm" not in src and "cuda_runtime" not in src.replace("#include <cuda_runtime.h>", "")
open(out, "w").write(src)
PY
g++ -std=c++20 -O2 -fno-strict-aliasing -pthread -Wall -Wextra -Wno-unknown-pragmas -Wno-unused-function -Wno-unused-parameter \
  -I"$here/mla_decode_emulation" -I"$here/decode_gemm_group_emulation" -I"$here/kda_chunk_emulation" -I"$work" \
  -I"$repo/src" "$here/mla_decode_emulation/driver.cpp" -o "$work/mla_decode_emulation"
timeout 1200 "$work/mla_decode_emulation" "$@"
