// Tensor-core building blocks of the bf16 attention kernels (attention_prefill.cu,
// attention_decode.cu): ldmatrix, mma.sync m16n8k16, the XOR-swizzled [rows][D] bf16 shared tile
// layout both feed ldmatrix from, and the base-2 softmax helpers.
//
// Fragments (PTX ISA, mma.m16n8k16 .bf16): lane l holds of a 16x16 A tile the elements
// (l/4, 2(l%4)+{0,1}) in a0, row + 8 in a1, column + 8 in a2, both in a3; of a 16x8 B tile
// (k 2(l%4)+{0,1}, n l/4) in b0 and k + 8 in b1; of the 16x8 f32 C tile (l/4, 2(l%4)+{0,1}) in
// c0, c1 and row + 8 in c2, c3.
#pragma once

#include <cuda_bf16.h>

namespace xserv::cuda {

// Element offset of 16-byte piece `c` of row `r` in a swizzled [rows][D] bf16 tile: piece c of
// row r is stored at piece c ^ (r % 8), so the 8 row addresses of every ldmatrix phase fall in 8
// different bank groups.
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
  return r * D + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(unsigned addr, unsigned (&r)[4]) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a . b (16x16 by 16x8, bf16 in, f32 accumulate).
__device__ __forceinline__ void mma_bf16(float (&c)[4], const unsigned (&a)[4], unsigned b0,
                                         unsigned b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// 2^x with the hardware approximation (2 ulp; exp2(-inf) = 0).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const unsigned*>(&v);
}
// The two halves of pack_bf16's result back in f32 (exact).
__device__ __forceinline__ float bf16_lo(unsigned v) { return __uint_as_float(v << 16); }
__device__ __forceinline__ float bf16_hi(unsigned v) { return __uint_as_float(v & 0xffff0000u); }

}  // namespace xserv::cuda
