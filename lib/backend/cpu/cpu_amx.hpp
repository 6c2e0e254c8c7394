// Prefill GEMMs of bf16 out_in weights on Intel AMX tiles (TDPBF16PS), the CPU backend's default
// where amx_bf16_usable() (XSERV_CPU_AMX=0 turns it off): the activations are rounded to bf16 for
// the product, as transformers' and llama.cpp's bf16 matmuls do, so results differ from the
// f32-activation kernels by bf16 rounding (relative 2^-9 per activation); the sums accumulate in
// f32. Qwen3-0.6B prefill 2.3-2.6x on the GPU machine's Xeon (docs/cpu.md, docs/benchmarks.md).
#pragma once

#include <cstdint>

#include "backend/cpu/cpu_kernels.hpp"

namespace xserv::cpu {

// True when this CPU has AMX-TILE and AMX-BF16 and the kernel lets this process use the tile
// data (asked for once, arch_prctl ARCH_REQ_XCOMP_PERM). False on other CPUs and builds.
bool amx_bf16_usable() noexcept;

// Rows of AMX tile steps: A is given to the kernel as bf16 rows padded to whole steps.
inline constexpr std::int64_t amx_rows = 32;
// K of one tile (32 bf16 = 64 bytes per tile row): A rows and packed W are padded to it.
inline constexpr std::int64_t amx_k = 32;
inline std::int64_t amx_padded(std::int64_t x, std::int64_t step) noexcept {
  return (x + step - 1) / step * step;
}

// A's row stride in bf16 for K: K padded to whole tiles plus one tile row (64 bytes), so the 16
// rows of an A tile fall in 16 different L1 sets (a stride of a multiple of 2 KB, as 1024- and
// 3072-wide rows give, puts all 16 in 2 of the 64 sets). skew false: K padded only.
inline std::int64_t amx_lda(std::int64_t k, bool skew = true) noexcept {
  return amx_padded(k, amx_k) + (skew ? amx_k : 0);
}

// a_bf16 [amx_padded(m, amx_rows)][lda] (lda >= amx_padded(k, amx_k)): row r of a rounded to
// bf16 (round to nearest even), zero past k and in the padding rows. Rows [r0, r1) of it.
void amx_round_rows(const float* a, std::int64_t m, std::int64_t k, std::uint16_t* a_bf16,
                    std::int64_t lda, std::int64_t r0, std::int64_t r1) noexcept;

// Columns [n0, n1) of p (every row; p.w bf16 out_in, p.a_bf16 as amx_round_rows writes it,
// the epilogue and GELU as the other kernels apply them) through AMX tiles. Only where
// amx_bf16_usable().
// scratch: amx_scratch_bytes(p.k) bytes, 64-byte aligned, the calling thread's own.
void amx_gemm_columns(const GemmProblem& p, std::int64_t n0, std::int64_t n1, void* scratch);
// The same loops with the tile instructions emulated in scalar code: the packing, padding and
// epilogue checked on any CPU (tests).
void amx_gemm_columns_emulated(const GemmProblem& p, std::int64_t n0, std::int64_t n1,
                               void* scratch);
// 32 columns of W packed for the tiles (K padded to whole tiles, bf16) and a 32 x 32 f32 block of
// results.
inline std::int64_t amx_scratch_bytes(std::int64_t k) noexcept {
  return amx_padded(k, amx_k) * 32 * 2 + 32 * 32 * 4;
}

}  // namespace xserv::cpu
