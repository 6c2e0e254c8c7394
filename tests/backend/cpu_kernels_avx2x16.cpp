// The CPU kernels with 16 floats a vector, compiled for AVX2 (GCC lowers each vector to a pair of
// ymm registers): the AVX-512 copy's code paths (16-row lane tiles of the prefill attention, its
// 1 x 16 micro-tiles, 4 heads of a decode row at once, the 8-row GEMM micro-tile) on a CPU
// without AVX-512, so that the development and CI machines test that logic too (not its speed).
// every_backend() in cpu_backend_test.cpp adds it where AVX2 runs and AVX-512 does not.
#include "backend/cpu/cpu_kernels.hpp"

// Declared extern first, so that the table's definition in the .inc has external linkage.
namespace xserv::cpu::avx2x16 { extern const KernelTable table; }

#define XSERV_CPU_NS avx2x16
#define XSERV_CPU_VL 16
#define XSERV_CPU_NAME "avx2x16"
#include "backend/cpu/cpu_kernels.inc"
