#!/usr/bin/env bash
# Checks the prefill GEMMs' tensor-core tile (src/kimirt/backend/cuda/tc_tile.cuh: tc::TileMma, the
# mma.sync tile of the MoE prefill kernels and PrefillGemm's fallback) without a GPU, as
# scripts/mla_decode_emulate.sh does the MLA decode split: the header is turned into host C++
# (ldmatrix and the MMA emulated by scripts/kda_chunk_emulation/shim.h, shared memory as one
# buffer addressed by 32-bit offsets, cp.async queued per thread until its wait:
# tc_tile_emulation/tc_tile_host.h), a block's 256 threads run as fibers, and driver.cpp
# checks that MXFP4 codes row-major, MXFP4 codes tiled (mxfp4_tiled.cuh) and their values held as
# BF16 give every accumulator the same bits, for plain and GLU column maps, a tile with rows past
# the weight and both scale ranges; and the BF16 tile against a float64 reference. It checks
# indexing, the stages, the waits and barriers and the decode, not the tensor cores' rounding or
# speed (CudaBackendMoe.*, PrefillGemm tests do). About half a minute on two cores.
# Usage: bash scripts/tc_tile_emulate.sh
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
python3 - "$repo/src/kimirt/backend/cuda" "$work/tc_tile_host.cpp" "$here/decode_gemm_group_emulation" <<'PY'
import sys
cuda_dir, out = sys.argv[1], sys.argv[2]
sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, sys.argv[3])
from mma_host import cut, host_ldmatrix_mma
# ldmatrix_mma.cuh without its PTX: the shim's emulated MMA (the tile has its own ldmatrix).
header = host_ldmatrix_mma(cuda_dir)
src = open(cuda_dir + "/tc_tile.cuh").read().replace("#pragma once\n", "")
for inc in ('#include <cuda_runtime.h>\n', '#include "kimirt/backend/cuda/cp_async.cuh"\n',
            '#include "kimirt/backend/cuda/ldmatrix_mma.cuh"\n'):
    assert inc in src, inc
src = src.replace('#include <cuda_runtime.h>\n', "")
src = src.replace('#include "kimirt/backend/cuda/cp_async.cuh"\n', '#include "tc_tile_host.h"\n')
src = src.replace('#include "kimirt/backend/cuda/ldmatrix_mma.cuh"\n', header)
# The runtime call and the device-only address and ldmatrix: host versions on g_smem offsets.
src = cut(src, "inline void AllowSharedMemory(", "")
src = cut(src, "__device__ __forceinline__ uint32_t SharedAddr(",
          "inline uint32_t SharedAddr(const void* p) { return static_cast<uint32_t>(static_cast<const unsigned char*>(p) - g_smem); }\n")
src = cut(src, "__device__ __forceinline__ void LdMatrixX4(",
          "inline void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) { EmuLdMatrixX4(r, g_smem + addr); }\n")
assert "asm" not in src and "TileMma" in src
open(out, "w").write(src)
PY
g++ -std=c++20 -O2 -pthread -fno-strict-aliasing -Wall -Wextra -Wno-unknown-pragmas -Wno-unused-function \
  -Wno-unused-parameter -I"$here/tc_tile_emulation" -I"$here/kda_chunk_emulation" -I"$work" -I"$repo/src" \
  "$here/tc_tile_emulation/driver.cpp" -o "$work/tc_tile_emulation"
timeout 600 "$work/tc_tile_emulation" "$@"
