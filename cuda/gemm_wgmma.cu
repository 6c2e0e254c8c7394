// Tensor-core GEMMs of batched decode at 17-128 rows on Hopper's warpgroup MMA (wgmma) fed by
// tensor memory access (TMA): out[m, :] = a[m, :] . W^T (+ beta * out), a and W [N, K] in bf16,
// out in bf16 or f32. Only the arch-specific sm_90a target has these instructions, so this file
// alone is compiled for it (cuda/CMakeLists.txt) and wgmma_gemm_supported() holds only on a
// compute-capability 9.0 device of a build that targets sm_90.
//
// Why: at these rows cuBLASLt streams the layer weights at 1.1-3.2 TB/s of the H200's ~4.4
// (docs/benchmarks.md, "cuBLASLt algorithms by measurement"): the small o_proj / q|k|v / down
// GEMMs are latency-bound kernels of 6-13 us whose tiles leave SMs idle, and no configuration of
// cuBLASLt changed that. An earlier kernel of our own (cp.async ring, each stage's wgmma waited
// before the next barrier: "Tried, not merged: a wide tensor-core GEMM") was bound by the SM's
// arithmetic from 64 rows on. Here the copies and the products run in separate warps, so the
// tensor cores never wait on a barrier that a copy could have hidden.
//
// The computation is out^T = W . a^T (as gemm_skinny.cu): W's rows are wgmma's M side (64 a
// warpgroup), the activation rows its N side (a tile of NA = 32, 64 or 128 rows, zero past m:
// the TMA box reads zeros outside the tensor). A block owns 128 weight rows (two consumer
// warpgroups of 64) and, with split-K, one of S equal parts of K; the S blocks of a tile form a
// thread-block cluster and add their f32 tiles through distributed shared memory in rank order
// (deterministic: the result does not depend on timing), each rank finishing 1/S of the rows.
// - One producer warp issues the copies: per 64-wide K step one TMA box of W (128 rows x 128
//   bytes) and one of the activations (NA rows x 128 bytes), both 128-byte swizzled (the layout
//   wgmma reads), into a ring of stages guarded by mbarriers (full: the bytes landed; empty:
//   both consumer warpgroups' products of that stage are done). The first stages' weights are
//   requested before the programmatic-dependent-launch wait (they do not depend on the kernel
//   before), the activations after it.
// - Each consumer warpgroup issues four m64nNAk16 products a stage from shared memory and keeps
//   one stage's group in flight (wgmma.wait_group 1) while the next stage's are issued, so the
//   stage is released one step later.
// - Epilogue: the accumulators go through shared memory (transposed to [row][column]) so every
//   output row is written as 128 consecutive columns; beta * out is added in f32 before the one
//   rounding, as cuBLASLt's epilogue does.
// - SwiGLU epilogue (launch_wgmma_swiglu, a Qwen3 gate|up): W holds 2n rows (gate, then up); the
//   block's first warpgroup takes gate rows 64b.., its second the matching up rows n + 64b.. (two
//   TMA boxes of 64 rows a stage), and the block writes out[:, 64b + j] = silu(y_g) * y_u with the
//   swiglu kernel's roundings (y rounded to bf16, silu rounded, product rounded).
// - Activation multicast (XSERV_CUDA_WGMMA_MCAST=2, opt-in): every block reads the activation
//   rows from L2 again (at 64 rows half as many bytes as its weights, at 128 as many), so pairs of
//   neighbouring weight tiles may share them: each block of the pair loads half of the box and
//   multicasts it to both, and releases a stage on both blocks' empty barriers.
// Two blocks an SM (~100 KB of shared memory each): one block's epilogue and ramp overlap the
// other's stream. K parts are chosen so every SM holds a block (choose_splits). Where the blocks
// fit one wave of one block an SM (XSERV_CUDA_WGMMA_DEEP, deep_ring), the second block would have
// nothing to run, so the block takes a deep ring instead (~220 KB: 7-11 stages): at 64 rows
// cuBLASLt's kernel keeps 15 stages of 64-wide K steps in flight where this one kept 4, and
// streamed the same weight at ~1.6x the rate (ncu, docs/benchmarks.md).
#include <cooperative_groups.h>
#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

namespace cg = cooperative_groups;
using bf16 = __nv_bfloat16;

constexpr int tile_w = 128;           // weight rows (output columns) a block
constexpr int k_step = 64;            // K a stage: one 128-byte swizzled row per weight / activation row
constexpr int consumer_threads = 256;  // two warpgroups
constexpr int threads = consumer_threads + 32;  // and the producer warp
constexpr int w_stage_bytes = tile_w * k_step * 2;
constexpr int acc_stride = tile_w + 4;  // floats a row of the epilogue's tile: conflict-free stores
constexpr int max_splits = 8;           // a portable cluster

// The ring: ~100 KB (two blocks an SM) or, Deep, as much of the SM's 227 KB as whole stages fill
// (one block an SM, a stream of 11, 9, 7 stages in flight instead of 5, 4, 3).
template <int NA, bool Deep>
struct Config {
  static constexpr int a_stage_bytes = NA * k_step * 2;
  static constexpr int stage_bytes = w_stage_bytes + a_stage_bytes;
  static constexpr int stages = (Deep ? 230400 : 100 * 1024) / stage_bytes;
  static constexpr int ring_bytes = stages * stage_bytes;
  static constexpr int smem_bytes = ring_bytes + 2 * stages * 8 + 1024;  // + barriers, + alignment
  static constexpr int blocks_per_sm = Deep ? 1 : 2;
  static_assert(NA * acc_stride * 4 <= ring_bytes, "the epilogue tile reuses the ring");
  static_assert(smem_bytes <= 232448, "an SM's shared memory for one block");
};

struct WgParams {
  void* out;
  long long ldo;
  float beta;
  int m, n, k;
  int splits;
};

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init_count(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
               "r"(count)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar)))
               : "memory");
}
// One 2-D TMA box (x: the K coordinate in elements, y: the row) into shared memory, completing
// its bytes on bar, read under the L2 policy pol.
__device__ __forceinline__ void tma_load_2d(void* smem, const CUtensorMap* map, std::uint64_t* bar, int x, int y,
                                            std::uint64_t pol) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
      " [%0], [%1, {%2, %3}], [%4], %5;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(smem))),
      "l"(map), "r"(x), "r"(y), "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), "l"(pol)
      : "memory");
}
// The same box delivered to the same shared-memory offset (and barrier offset) of every block of
// the cluster whose rank bit is set in mask.
__device__ __forceinline__ void tma_load_2d_multicast(void* smem, const CUtensorMap* map, std::uint64_t* bar, int x,
                                                      int y, std::uint16_t mask, std::uint64_t pol) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster"
      ".L2::cache_hint [%0], [%1, {%2, %3}], [%4], %5, %6;" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(smem))),
      "l"(map), "r"(x), "r"(y), "r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))), "h"(mask), "l"(pol)
      : "memory");
}
// An arrival on the barrier at the same offset in the cluster's block of rank `rank`.
__device__ __forceinline__ void mbar_arrive_cluster(std::uint64_t* bar, unsigned rank) {
  asm volatile(
      "{\n .reg .b32 remote;\n mapa.shared::cluster.u32 remote, %0, %1;\n"
      " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}" ::"r"(static_cast<unsigned>(__cvta_generic_to_shared(bar))),
      "r"(rank)
      : "memory");
}
// An L2 policy for the TMA loads: the weights are read once a step (evict first), the activation
// rows by every block (evict last).
template <bool EvictFirst>
__device__ __forceinline__ std::uint64_t l2_policy() {
  std::uint64_t pol;
  if constexpr (EvictFirst)
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  else
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}

// A K-major operand tile in shared memory as wgmma reads it: rows of 128 bytes, 128-byte
// swizzle (as the TMA wrote it), 8-row groups 1024 bytes apart. The tile must be 1024-byte
// aligned; the k-th 16-wide slice of a 64-wide step starts 32 bytes further (+2 in the address
// field, which counts 16-byte units).
__device__ __forceinline__ std::uint64_t smem_desc(const void* tile) {
  const auto addr = static_cast<unsigned>(__cvta_generic_to_shared(tile));
  std::uint64_t d = (addr & 0x3FFFFu) >> 4;
  d |= std::uint64_t{1} << 16;           // leading byte offset (unused with a 128-byte swizzle)
  d |= std::uint64_t{1024 >> 4} << 32;   // stride byte offset: the next 8 rows
  d |= std::uint64_t{1} << 62;           // 128-byte swizzle
  return d;
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
}
// Tells the compiler the accumulators change here, so it neither reads them early (while a
// product in flight still writes them) nor keeps stale copies across the point.
template <int R>
__device__ __forceinline__ void fence_operands(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) asm volatile("" : "+f"(d[i])::"memory");
}

// One wrapper per NA (inline assembly names every accumulator register).
// d[64 x NA] (+)= A[64 x 16] . B[NA x 16]^T, both K-major in shared memory (descriptors). Lane
// l of warp w of the warpgroup holds d[4j + 2i + e] = D[16w + l/4 + 8i][8j + 2(l%4) + e].
template <int NA>
__device__ __forceinline__ void wgmma_bf16(float (&d)[NA / 2], std::uint64_t a, std::uint64_t b, int accumulate);

template <>
__device__ __forceinline__ void wgmma_bf16<32>(float (&d)[16], std::uint64_t a, std::uint64_t b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %18, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, %16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_bf16<64>(float (&d)[32], std::uint64_t a, std::uint64_t b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %34, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(a), "l"(b), "r"(accumulate));
}

template <>
__device__ __forceinline__ void wgmma_bf16<128>(float (&d)[64], std::uint64_t a, std::uint64_t b, int accumulate) {
  asm volatile(
      "{\n .reg .pred p;\n setp.ne.b32 p, %66, 0;\n"
      " wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(a), "l"(b), "r"(accumulate));
}

#endif  // __CUDA_ARCH_FEAT_SM90_ALL

template <int NA, typename OutT, bool Swiglu, int CX, bool Deep>
__global__ void __launch_bounds__(threads, Config<NA, Deep>::blocks_per_sm)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap wmap, const __grid_constant__ CUtensorMap amap, WgParams p) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  using C = Config<NA, Deep>;
  extern __shared__ unsigned char smem_raw[];
  unsigned char* smem = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(smem_raw) + 1023) &
                                                         ~std::uintptr_t{1023});
  auto* full = reinterpret_cast<std::uint64_t*>(smem + C::ring_bytes);
  std::uint64_t* empty = full + C::stages;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  // W rows of the block: n0.. (two warpgroups of 64), or with Swiglu gate rows n0.. and up rows
  // n_up.. (64 each); output columns n0.. (128, or 64 with Swiglu).
  const int n0 = blockIdx.x * (Swiglu ? tile_w / 2 : tile_w), split = blockIdx.y;
  const int n_up = p.n / 2 + n0;
  const int k_steps = p.k / k_step;
  const int ks0 = k_steps * split / p.splits, steps = k_steps * (split + 1) / p.splits - ks0;

  // With CX > 1 the CX blocks of neighbouring weight tiles (cluster ranks xi + CX * split) share
  // the activation boxes: each loads NA / CX rows and multicasts them to all CX, and a stage is
  // free again only when every one of them has consumed it (empty counts all their warps).
  cg::cluster_group cluster = cg::this_cluster();
  const int xi = CX > 1 ? static_cast<int>(blockIdx.x % CX) : 0;
  const bool clustered = CX > 1 || p.splits > 1;
  if (threadIdx.x == 0) {
    for (int s = 0; s < C::stages; ++s) {
      mbar_init_count(&full[s], 1);
      mbar_init_count(&empty[s], CX * consumer_threads / 32);  // one arrival a consumer warp
    }
    mbar_init_fence();
  }
  if (CX > 1) cluster.sync(); else __syncthreads();  // peers arrive on (and copy under) these barriers

  float d[NA / 2];  // a consumer thread's accumulators
#pragma unroll
  for (int i = 0; i < NA / 2; ++i) d[i] = 0.0f;
  const int wg = warp / 4;
  if (warp == consumer_threads / 32) {
    // The producer warp: one lane issues every copy.
    if (lane == 0) {
      const std::uint64_t pol_w = l2_policy<true>(), pol_a = l2_policy<false>();
      const int first = steps < C::stages ? steps : C::stages;
      const auto load_w = [&](unsigned char* st, std::uint64_t* bar, int k) {
        tma_load_2d(st, &wmap, bar, k, n0, pol_w);
        if constexpr (Swiglu) tma_load_2d(st + w_stage_bytes / 2, &wmap, bar, k, n_up, pol_w);
      };
      for (int i = 0; i < first; ++i) {
        mbar_expect_tx(&full[i], C::stage_bytes);
        load_w(smem + i * C::stage_bytes, &full[i], (ks0 + i) * k_step);
      }
      const auto load_a = [&](unsigned char* st, std::uint64_t* bar, int k) {
        if constexpr (CX > 1) {
          constexpr int rows = NA / CX;
          const auto mask = static_cast<std::uint16_t>(((1u << CX) - 1) << (CX * split));
          tma_load_2d_multicast(st + w_stage_bytes + xi * rows * k_step * 2, &amap, bar, k, xi * rows, mask, pol_a);
        } else {
          tma_load_2d(st + w_stage_bytes, &amap, bar, k, 0, pol_a);
        }
      };
      grid_dependency_wait();
      for (int i = 0; i < first; ++i) load_a(smem + i * C::stage_bytes, &full[i], (ks0 + i) * k_step);
      for (int i = first; i < steps; ++i) {
        const int s = i % C::stages;
        mbar_wait(&empty[s], ((i / C::stages) - 1) & 1);
        unsigned char* st = smem + s * C::stage_bytes;
        mbar_expect_tx(&full[s], C::stage_bytes);
        load_w(st, &full[s], (ks0 + i) * k_step);
        load_a(st, &full[s], (ks0 + i) * k_step);
      }
    } else {
      grid_dependency_wait_only();
    }
  } else {
    // The consumer warpgroups: weight rows 64 wg .. 64 wg + 63 of the block's 128.
    grid_dependency_wait_only();  // out is read (beta) and written below
    for (int i = 0; i < steps; ++i) {
      const int s = i % C::stages;
      mbar_wait(&full[s], (i / C::stages) & 1);
      const unsigned char* st = smem + s * C::stage_bytes;
      const std::uint64_t da = smem_desc(st + wg * (w_stage_bytes / 2)), db = smem_desc(st + w_stage_bytes);
      fence_operands(d);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < k_step / 16; ++kk) wgmma_bf16<NA>(d, da + 2 * kk, db + 2 * kk, 1);
      wgmma_commit();
      fence_operands(d);
      wgmma_wait<1>();  // the previous stage's products are done: release its buffers
      if (i > 0 && lane == 0) {
        if constexpr (CX > 1) {
          for (int j = 0; j < CX; ++j)
            mbar_arrive_cluster(&empty[(i - 1) % C::stages], static_cast<unsigned>(j + CX * split));
        } else {
          mbar_arrive(&empty[(i - 1) % C::stages]);
        }
      }
    }
    wgmma_wait<0>();
    fence_operands(d);
  }
  __syncthreads();  // every warpgroup is done with the ring: the epilogue tile reuses it
  auto* tile = reinterpret_cast<float*>(smem);
  if (warp < consumer_threads / 32) {
    const int r = wg * 64 + (warp % 4) * 16 + lane / 4;
#pragma unroll
    for (int j = 0; j < NA / 8; ++j) {
      const int c = 8 * j + 2 * (lane % 4);
      tile[c * acc_stride + r] = d[4 * j];
      tile[(c + 1) * acc_stride + r] = d[4 * j + 1];
      tile[c * acc_stride + r + 8] = d[4 * j + 2];
      tile[(c + 1) * acc_stride + r + 8] = d[4 * j + 3];
    }
  }

  // Rows [lo, hi) of the tile are this rank's to finish: the sum of every rank's tile in rank
  // order, the residual, one rounding.
  if (p.splits > 1) cluster.sync(); else __syncthreads();
  const int rows = p.m < NA ? p.m : NA;
  const int lo = rows * split / p.splits, hi = rows * (split + 1) / p.splits;
  // 4 consecutive output columns a thread: 32 threads a row (16 with Swiglu, each also summing
  // the matching up column 64 further).
  constexpr int per_row = Swiglu ? tile_w / 8 : tile_w / 4;
  const int col = (threadIdx.x % per_row) * 4;
  for (int row = lo + threadIdx.x / per_row; row < hi; row += threads / per_row) {
    float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    if constexpr (Swiglu) {
      float4 u = v;
      for (int q = 0; q < p.splits; ++q) {
        const float* src = (p.splits > 1 ? cluster.map_shared_rank(tile, xi + CX * q) : tile) + row * acc_stride;
        const float4 tg = *reinterpret_cast<const float4*>(src + col);
        const float4 tu = *reinterpret_cast<const float4*>(src + tile_w / 2 + col);
        v.x += tg.x;
        v.y += tg.y;
        v.z += tg.z;
        v.w += tg.w;
        u.x += tu.x;
        u.y += tu.y;
        u.z += tu.z;
        u.w += tu.w;
      }
      const float gs[4] = {v.x, v.y, v.z, v.w}, us[4] = {u.x, u.y, u.z, u.w};
      float r[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float g = __bfloat162float(__float2bfloat16_rn(gs[e])), up = __bfloat162float(__float2bfloat16_rn(us[e]));
        const float silu = __bfloat162float(__float2bfloat16_rn(g / (1.0f + expf(-g))));
        r[e] = silu * up;
      }
      __nv_bfloat162 pair[2] = {__floats2bfloat162_rn(r[0], r[1]), __floats2bfloat162_rn(r[2], r[3])};
      *reinterpret_cast<uint2*>(static_cast<bf16*>(p.out) + row * p.ldo + n0 + col) =
          *reinterpret_cast<const uint2*>(pair);
    } else {
      for (int q = 0; q < p.splits; ++q) {
        const float* src = p.splits > 1 ? cluster.map_shared_rank(tile, xi + CX * q) : tile;
        const float4 t = *reinterpret_cast<const float4*>(src + row * acc_stride + col);
        v.x += t.x;
        v.y += t.y;
        v.z += t.z;
        v.w += t.w;
      }
      OutT* o = static_cast<OutT*>(p.out) + row * p.ldo + n0 + col;
      if constexpr (std::is_same_v<OutT, float>) {
        if (p.beta != 0.0f) {
          const float4 old = *reinterpret_cast<const float4*>(o);
          v.x += p.beta * old.x;
          v.y += p.beta * old.y;
          v.z += p.beta * old.z;
          v.w += p.beta * old.w;
        }
        *reinterpret_cast<float4*>(o) = v;
      } else {
        auto* o2 = reinterpret_cast<__nv_bfloat162*>(o);
        if (p.beta != 0.0f) {
          const float2 a = __bfloat1622float2(o2[0]), b = __bfloat1622float2(o2[1]);
          v.x += p.beta * a.x;
          v.y += p.beta * a.y;
          v.z += p.beta * b.x;
          v.w += p.beta * b.y;
        }
        __nv_bfloat162 pair[2] = {__floats2bfloat162_rn(v.x, v.y), __floats2bfloat162_rn(v.z, v.w)};
        *reinterpret_cast<uint2*>(o) = *reinterpret_cast<const uint2*>(pair);
      }
    }
  }
  // No block leaves while another still reads its tile or arrives on its barriers.
  if (clustered) cluster.sync();
#else
  (void)wmap;
  (void)amap;
  (void)p;
  __trap();  // never launched: wgmma_gemm_supported() is false without an sm_90a image
#endif
}

using EncodeTiled = PFN_cuTensorMapEncodeTiled_v12000;

// cuTensorMapEncodeTiled from the driver (the library links the runtime only); null when the
// driver has none.
EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      return EncodeTiled{nullptr};
    }
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// A [rows, k] bf16 matrix (rows `row_bytes` apart) read in boxes of 64 columns x box_rows rows,
// 128-byte swizzled, zeros outside it.
CUtensorMap tensor_map(const void* base, std::int64_t rows, std::int64_t k, std::int64_t row_bytes, int box_rows) {
  CUtensorMap map;
  const cuuint64_t dims[2] = {static_cast<cuuint64_t>(k), static_cast<cuuint64_t>(rows)};
  const cuuint64_t strides[1] = {static_cast<cuuint64_t>(row_bytes)};
  const cuuint32_t box[2] = {static_cast<cuuint32_t>(k_step), static_cast<cuuint32_t>(box_rows)};
  const cuuint32_t elem[2] = {1, 1};
  const CUresult r = encode_tiled()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(base), dims,
                                    strides, box, elem, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  // wgmma_gemm_supported() checked what the encoder requires (alignment, strides, sizes).
  if (r != CUDA_SUCCESS) throw_cuda_error(cudaErrorInvalidValue, "cuTensorMapEncodeTiled (wgmma gemm)");
  return map;
}

// Whether the current device runs this file's kernels: compute capability 9.0 and an sm_90a
// image in the build (XSERV_WGMMA_SM90A), and a driver with tensor maps. Per device, once.
bool device_ok() {
#if defined(XSERV_WGMMA_SM90A)
  static std::atomic<int> state[64] = {};  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  int s = state[dev].load(std::memory_order_relaxed);
  if (s == 0) {
    int major = 0, minor = 0;
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    major == 9 && minor == 0 && encode_tiled() != nullptr;
    (void)cudaGetLastError();
    s = ok ? 1 : 2;
    state[dev].store(s, std::memory_order_relaxed);
  }
  return s == 1;
#else
  return false;
#endif
}

// K parts (the blocks of a cluster) for `tiles` 128-row weight tiles of k_steps steps: the count
// whose busiest SM has the least work, blocks spread evenly over the SMs (the weight streams at
// the same rate whichever SM reads it, so what decides is how many SMs share the stream), with a
// small price a part for the cluster's sum. XSERV_CUDA_WGMMA_SPLITS=N (read at every launch,
// for comparisons) forces N (1-8).
int choose_splits(int tiles, int k_steps, int sm_count) {
  if (const char* env = std::getenv("XSERV_CUDA_WGMMA_SPLITS")) {
    const int s = std::atoi(env);
    if (s >= 1) return std::min({s, max_splits, k_steps});
  }
  int best = 1;
  double best_cost = 1e30;
  for (int s = 1; s <= max_splits && s <= k_steps; s *= 2) {
    const int per_sm = (tiles * s + sm_count - 1) / std::max(sm_count, 1);
    const double cost = static_cast<double>(per_sm) / s + 0.02 * s;
    if (cost < best_cost) {
      best_cost = cost;
      best = s;
    }
  }
  return best;
}

template <int NA, typename OutT, bool Swiglu, int CX, bool Deep>
void launch_na(cudaStream_t stream, const CUtensorMap& wmap, const CUtensorMap& amap, const WgParams& p,
               int tiles) {
  using C = Config<NA, Deep>;
  auto* kernel = wgmma_gemm_kernel<NA, OutT, Swiglu, CX, Deep>;
  static std::once_flag attr_once[64];
  int dev = 0;
  XSERV_CUDA_CHECK(cudaGetDevice(&dev));
  std::call_once(attr_once[dev & 63], [&] {
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::smem_bytes));
  });
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(tiles), static_cast<unsigned>(p.splits));
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = C::smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute[2];
  int count = 0;
  if (CX > 1 || p.splits > 1) {
    attribute[count].id = cudaLaunchAttributeClusterDimension;
    attribute[count].val.clusterDim.x = CX;
    attribute[count].val.clusterDim.y = static_cast<unsigned>(p.splits);
    attribute[count].val.clusterDim.z = 1;
    ++count;
  }
  if (pdl_enabled()) {
    attribute[count].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attribute[count].val.programmaticStreamSerializationAllowed = 1;
    ++count;
  }
  config.attrs = attribute;
  config.numAttrs = static_cast<unsigned>(count);
  XSERV_CUDA_CHECK(cudaLaunchKernelEx(&config, kernel, wmap, amap, p));
}

template <typename OutT, bool Swiglu, int CX, bool Deep>
void launch_cx(cudaStream_t stream, const CUtensorMap& wmap, const void* a, const WgParams& p, int tiles) {
  // The activation box: the tile's rows, or a CX-th of them with the multicast.
  const auto amap = [&](int na) { return tensor_map(a, p.m, p.k, std::int64_t{p.k} * 2, na / CX); };
  if (p.m <= 32)
    launch_na<32, OutT, Swiglu, CX, Deep>(stream, wmap, amap(32), p, tiles);
  else if (p.m <= 64)
    launch_na<64, OutT, Swiglu, CX, Deep>(stream, wmap, amap(64), p, tiles);
  else
    launch_na<128, OutT, Swiglu, CX, Deep>(stream, wmap, amap(128), p, tiles);
}

// Whether a launch of `blocks` takes the deep ring (one block an SM). XSERV_CUDA_WGMMA_DEEP (read
// at every launch, for comparisons): 0 never, 1 always, unset or "auto" where the blocks fit one
// wave of one block an SM, so the second block an SM that the shallow ring leaves room for would
// have nothing to run anyway.
bool deep_ring(int blocks, int sm_count) {
  const char* env = std::getenv("XSERV_CUDA_WGMMA_DEEP");
  if (env != nullptr && (env[0] == '0' || env[0] == '1') && env[1] == '\0') return env[0] == '1';
  return blocks <= sm_count;
}

// XSERV_CUDA_WGMMA_MCAST=2 (opt-in, read at every launch, for comparisons): pairs of neighbouring
// weight tiles share the activation boxes by TMA multicast (each block reads half of them from
// L2), where the tile count is even; the K parts are then at most 4 (a cluster of at most 8).
template <typename OutT, bool Swiglu>
void launch_out(cudaStream_t stream, const CUtensorMap& wmap, const void* a, WgParams p, int tiles, int sm_count) {
  const char* env = std::getenv("XSERV_CUDA_WGMMA_MCAST");
  if (env && std::atoi(env) == 2 && tiles % 2 == 0) {
    p.splits = std::min(p.splits, max_splits / 2);
    launch_cx<OutT, Swiglu, 2, false>(stream, wmap, a, p, tiles);
  } else if (deep_ring(tiles * p.splits, sm_count)) {
    launch_cx<OutT, Swiglu, 1, true>(stream, wmap, a, p, tiles);
  } else {
    launch_cx<OutT, Swiglu, 1, false>(stream, wmap, a, p, tiles);
  }
}

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

bool wgmma_gemm_supported(DType dt, DType out_dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                          const void* w, const void* out, std::int64_t ldo) noexcept {
  return dt == DType::bf16 && (out_dt == DType::bf16 || out_dt == DType::f32) && m >= 1 && m <= max_wgmma_gemm_rows &&
         n > 0 && n % tile_w == 0 && n <= (std::int64_t{1} << 30) && k > 0 && k % k_step == 0 &&
         k <= (std::int64_t{1} << 20) && ldo >= n && ldo % 4 == 0 && aligned16(a) && aligned16(w) &&
         aligned16(out) && device_ok();
}

void launch_wgmma_gemm(cudaStream_t stream, DType out_dt, void* out, std::int64_t ldo, const void* a, const void* w,
                       float beta, std::int64_t m, std::int64_t n, std::int64_t k, int sm_count) {
  const int tiles = static_cast<int>(n / tile_w);
  WgParams p{out, ldo, beta, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1};
  p.splits = choose_splits(tiles, static_cast<int>(k / k_step), sm_count);
  const CUtensorMap wmap = tensor_map(w, n, k, k * 2, tile_w);
  if (out_dt == DType::f32)
    launch_out<float, false>(stream, wmap, a, p, tiles, sm_count);
  else
    launch_out<bf16, false>(stream, wmap, a, p, tiles, sm_count);
}

void launch_wgmma_swiglu(cudaStream_t stream, void* out, const void* a, const void* w, std::int64_t m, std::int64_t n,
                         std::int64_t k, int sm_count) {
  const int tiles = static_cast<int>(n / tile_w);  // 64 gate and 64 up rows a block
  WgParams p{out, n / 2, 0.0f, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1};
  p.splits = choose_splits(tiles, static_cast<int>(k / k_step), sm_count);
  launch_out<bf16, true>(stream, tensor_map(w, n, k, k * 2, tile_w / 2), a, p, tiles, sm_count);
}

}  // namespace xserv::cuda
