"""mma_bf16.cuh and ldmatrix_mma.cuh as host C++, for the emulations of the kernels that include
them (../decode_gemm_group_emulate.sh, ../moe_decode_emulate.sh; ../mla_decode_emulate.sh,
../tc_tile_emulate.sh): their inline PTX MMA and ldmatrix replaced by
../kda_chunk_emulation/shim.h's EmuMma and EmuLdMatrixX4(Trans), mma_bf16.cuh's streaming load
and L2 prefetch by the caller's."""


def cut(s, start, repl):
    """s with the function that starts at `start` (to its closing line "}") replaced by repl."""
    a = s.index(start)
    b = s.index("\n}\n", a) + len("\n}\n")
    return s[:a] + repl + s[b:]


def host_mma(cuda_dir, load_streaming, prefetch_l2):
    """The header's text; load_streaming and prefetch_l2 are the host bodies of
    LoadStreaming(const void* p) and PrefetchL2(const void* p, uint32_t bytes)."""
    mma = open(cuda_dir + "/mma_bf16.cuh").read().replace("#pragma once\n", "")
    mma = cut(mma, "__device__ __forceinline__ uint4 LoadStreaming(",
              "inline uint4 LoadStreaming(const void* p) { " + load_streaming + " }\n")
    mma = cut(mma, "__device__ __forceinline__ void PrefetchL2(",
              "inline void PrefetchL2([[maybe_unused]] const void* p, [[maybe_unused]] uint32_t bytes) { " +
              prefetch_l2 + " }\n")
    mma = cut(mma, "__device__ __forceinline__ void Mma(",
              "inline void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0, "
              "uint32_t b1) { const uint32_t a[4] = {a0, a1, a2, a3}; const uint32_t b[2] = {b0, b1}; "
              "EmuMma(d, a, b); }\n")
    assert "asm" not in mma
    return mma


def host_ldmatrix_mma(cuda_dir):
    """ldmatrix_mma.cuh's text without its PTX: the shim's emulated ldmatrix (.trans) and MMA."""
    header = open(cuda_dir + "/ldmatrix_mma.cuh").read().replace("#pragma once\n", "")
    for fn in ("unsigned SmemAddr(", "void Ldmatrix4(", "void Ldmatrix4Trans(", "void Mma("):
        header = cut(header, "__device__ __forceinline__ " + fn, "")
    header = header.replace("}  // namespace kimirt::cuda", """\
inline void Ldmatrix4(unsigned (&r)[4], const void* p) { EmuLdMatrixX4(r, p); }
inline void Ldmatrix4Trans(unsigned (&r)[4], const void* p) { EmuLdMatrixX4Trans(r, p); }
inline void Mma(float (&d)[4], const unsigned (&a)[4], unsigned b0, unsigned b1) {
  const uint32_t b[2] = {b0, b1};
  EmuMma(d, a, b);
}
}  // namespace kimirt::cuda""")
    assert "asm" not in header
    return header


def host_wgmma(cuda_dir):
    """wgmma.cuh as host C++ for the decode GEMM's emulation: the descriptor and swizzle helpers as
    they are, the fences, commit and wait as nothing (an emulated wgmma is done when it returns),
    WgmmaRS_m64n64k16 and _m64n32k16 as wgmma_host.h's EmuWgmmaRS, the kernels' other shapes gone."""
    header = open(cuda_dir + "/wgmma.cuh").read().replace("#pragma once\n", "")
    for fn in ("void Fence(", "void Commit(", "void FenceProxyAsync("):  # one-line functions
        header = "".join(line for line in header.splitlines(keepends=True)
                         if not line.startswith("__device__ __forceinline__ " + fn))
    for tmpl, fn in (("template <int kPending>\n", "void Wait("), ("template <int N>\n", "void FenceRegs(")):
        header = cut(header, tmpl + "__device__ __forceinline__ " + fn, "")
    for fn in ("WgmmaSS_m64n64k16", "WgmmaRS_m64n128k16", "WgmmaRS_m64n64k16", "WgmmaRS_m64n32k16",
               "WgmmaSS_m64n128k16", "WgmmaSS_m64n32k16"):
        header = cut(header, "template <int kTransB>\n__device__ __forceinline__ void " + fn + "(", "")
    header = header.replace("}  // namespace kimirt::cuda::wgmma", """\
inline void Fence() {}
inline void Commit() {}
inline void FenceProxyAsync() {}
template <int kPending>
inline void Wait() {}
template <int N>
inline void FenceRegs(float (&)[N]) {}
template <int kTransB>
inline void WgmmaRS_m64n64k16(float (&d)[32], const unsigned (&a)[4], uint64_t desc_b, int scale_d = 1) {
  static_assert(kTransB == 0, "the decode GEMM's B is K-major");
  EmuWgmmaRS(d, a, desc_b, scale_d);
}
template <int kTransB>
inline void WgmmaRS_m64n32k16(float (&d)[16], const unsigned (&a)[4], uint64_t desc_b, int scale_d = 1) {
  static_assert(kTransB == 0, "the decode GEMM's B is K-major");
  EmuWgmmaRS(d, a, desc_b, scale_d);
}
}  // namespace kimirt::cuda::wgmma""")
    assert "asm volatile" not in header and "asm(" not in header
    return header
