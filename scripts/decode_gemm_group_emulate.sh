#!/usr/bin/env bash
# Checks the grouped decode GEMM (src/kimirt/backend/cuda/decode_gemm.cu: DecodeGemmGroup) without
# a GPU, as scripts/kda_chunk_emulate.sh does the chunked KDA kernel: the kernel file is turned into
# host C++ (mma_bf16.cuh's inline PTX replaced by the emulated MMA of
# scripts/kda_chunk_emulation/shim.h, wgmma.cuh's by wgmma_host.h's, its L2 prefetch by nothing, cp.async by copies that land at
# their wait (cp_async_host.h), dynamic shared memory and pdl.cuh's launch by host versions that run
# the blocks as threads: scripts/decode_gemm_group_emulation/decode_gemm_host.h), and driver.cpp
# checks every output bit-identical to a host computation of the kernel's MMA order and every group
# output to its DecodeGemm alone, for every row bucket. It checks the block map, the x staging through shared
# memory (4 and 8 tiles), scratch layout and sums, not the GPU's rounding or speed
# (CudaBackendLinearGroup.* does). A few minutes on two cores.
# Usage: bash scripts/decode_gemm_group_emulate.sh [case name]
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
from mma_host import host_mma, host_wgmma
mma = host_mma(cuda_dir, "uint4 v; std::memcpy(&v, p, 16); return v;", "")
src = open(cuda_dir + "/decode_gemm.cu").read()
# wgmma (the 8-tile kernels): wgmma_host.h's emulation; shared addresses as offsets into the block's
# dynamic shared memory, which is what the descriptors encode.
assert '#include "kimirt/backend/cuda/wgmma.cuh"\n' in src
src = src.replace('#include "kimirt/backend/cuda/wgmma.cuh"\n', '#include "wgmma_host.h"\n' + host_wgmma(cuda_dir))
assert "__cvta_generic_to_shared(" in src
src = src.replace("__cvta_generic_to_shared(", "EmuSmemOffset(")
for inc in ('#include "kimirt/backend/cuda/mma_bf16.cuh"\n', '#include "kimirt/backend/cuda/pdl.cuh"\n',
            '#include "kimirt/backend/cuda/cp_async.cuh"\n'):
    assert inc in src
src = src.replace('#include "kimirt/backend/cuda/pdl.cuh"\n', "")
src = src.replace('#include "kimirt/backend/cuda/cp_async.cuh"\n', '#include "cp_async_host.h"\n')
smem = "extern __shared__ __align__(16) uint4 x_smem[];"
assert src.count(smem) == 1
src = src.replace(smem, "uint4* const x_smem = g_dyn_smem;")
# dynamic_smem.cuh's AllowDynamicSmem over the host header's attribute calls (they check the sizes).
dyn = open(cuda_dir + "/dynamic_smem.cuh").read().replace("#pragma once\n", "").replace("#include <cuda_runtime.h>\n", "")
assert '#include "kimirt/backend/cuda/dynamic_smem.cuh"\n' in src
src = src.replace('#include "kimirt/backend/cuda/dynamic_smem.cuh"\n', "")
src = src.replace('#include "kimirt/backend/cuda/mma_bf16.cuh"\n', '#include "decode_gemm_host.h"\n' + mma + dyn)
assert "asm volatile" not in src and "asm(" not in src
open(out, "w").write(src)
PY
g++ -std=c++20 -O2 -pthread -Wno-unknown-pragmas -I"$here/decode_gemm_group_emulation" -I"$here/kda_chunk_emulation" \
  -I"$work" -I"$repo/src" "$here/decode_gemm_group_emulation/driver.cpp" -o "$work/decode_gemm_group_emulation"
timeout 1200 "$work/decode_gemm_group_emulation" "$@"
