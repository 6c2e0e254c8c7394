// The kernels compiled for AVX-512 F/BW/DQ/VL (see cpu_kernels.hpp); chosen at run time.
#define XSERV_CPU_NS avx512
#define XSERV_CPU_VL 16
#define XSERV_CPU_NAME "avx512"
#include "backend/cpu/cpu_kernels.inc"
