// Stand-in for the CUDA runtime header in the host emulation of kda_chunk_kernels.cu (see
// ../kda_chunk_emulate.sh): only the stream type kernels.h names.
#pragma once
#include <cstdint>
typedef void* cudaStream_t;
