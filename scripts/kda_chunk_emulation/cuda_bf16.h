// Stand-in for cuda_bf16.h in the host emulation of kda_chunk_kernels.cu (see
// ../kda_chunk_emulate.sh): BF16 round-to-nearest-even and widening, as the device does them.
#pragma once
#include <cstdint>
#include <cstring>
struct __nv_bfloat162 { uint16_t x, y; };
inline uint16_t BfRn(float f) { uint32_t u; std::memcpy(&u, &f, 4); u = u + 0x7fffu + ((u >> 16) & 1u); return static_cast<uint16_t>(u >> 16); }
inline float BfToF(uint16_t b) { uint32_t u = static_cast<uint32_t>(b) << 16; float f; std::memcpy(&f, &u, 4); return f; }
inline __nv_bfloat162 __floats2bfloat162_rn(float a, float b) { return {BfRn(a), BfRn(b)}; }
inline float __low2float(__nv_bfloat162 h) { return BfToF(h.x); }
inline float __high2float(__nv_bfloat162 h) { return BfToF(h.y); }
