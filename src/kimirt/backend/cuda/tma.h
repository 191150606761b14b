// Host side of TMA (tma.cuh): tensor maps for 2-D BF16 tensors, and the copy the tests check the
// boxes' layout with. CUDA builds only.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

namespace kimirt::cuda {

// A tensor map of a row-major BF16 matrix [rows, cols] at `base` with rows `row_bytes` apart (a
// multiple of 16), read in boxes of box_rows × 64 columns into 128-byte-swizzled panels, elements
// past the matrix as zeros. The driver's cuTensorMapEncodeTiled, found at run time (the toolkit's
// runtime links no driver symbols). False with `error` set if the driver refuses (alignment,
// sizes) or has no TMA.
bool MakeTensorMapBf16Swizzled(CUtensorMap* map, const void* base, uint64_t rows, uint64_t cols, uint64_t row_bytes,
                               uint32_t box_rows, std::string* error);

// For the tests: the boxes of `map` at (column 64p, row y) for p = 0 .. panels − 1, each into its
// own 1,024-aligned panel of box_rows × 128 bytes by one thread's TMA copies on one barrier, then
// the panels' shared memory copied out as it lies into out [panels · box_rows · 64] (BF16 bits).
void TmaLoadPanelsForTest(const CUtensorMap& map, int32_t y, int panels, uint32_t box_rows, uint16_t* out, cudaStream_t s);

}  // namespace kimirt::cuda
