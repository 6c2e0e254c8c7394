// The kernels compiled for AVX2 + FMA + F16C (see cpu_kernels.hpp); chosen at run time.
#define XSERV_CPU_NS avx2
#define XSERV_CPU_VL 8
#define XSERV_CPU_NAME "avx2"
#include "backend/cpu/cpu_kernels.inc"
