// Tensor-core GEMMs for a handful of rows (batched decode of 5-32 sequences): out[m, :] =
// a[m, :] . W^T (+ bias) (+ beta * out), a and W [N, K] in bf16, out in bf16 or f32.
//
// Why not cuBLASLt: at these M its kernels tile N by 64-128 columns and leave K whole, so a 32 MB
// weight like Qwen3-8B's o_proj fills ~32 of 132 SMs and streams at 1-2.4 TB/s (docs/
// benchmarks.md, "Where a 128-row Qwen3-8B decode step went"). Why not the GEMV kernels: they
// re-read the M activation vectors from L1 for every weight vector, which bounds them beyond 4
// rows. Here each weight element is loaded once into registers and used for all M rows by
// mma.sync, and the activation fragment is loaded once per 64-wide K step and reused across the
// warp's 32 weight rows.
//
// The computation is out^T = W . a^T: W's rows are the mma's M dimension (16-row tiles, two per
// warp), the activation rows its N dimension (8-row tiles, MT of them, zero past M). Fragments
// come straight from global memory: for a 64-wide K step, lane (g = lane / 4, q = lane % 4) loads
// 16 bytes from each of its weight rows at k0 + 8q and at k0 + 32 + 8q (so the 4 lanes of a row
// read 64 contiguous bytes per load), and the same 32 bytes of its activation rows. Those 8 + 8
// values fill the lane's slots of four m16n8k16 products: mma j = 2c + h takes words 2h and
// 2h + 1 of chunk c. The products then pair A column 2q + e with physical k = k0 + 32c + 8q +
// 4h + e (e = 0, 1; +2 for columns 2q + 8 + e) and B row 2q + e with the same k, because both
// are held by the lanes with that q: the K order inside a step is permuted, which a dot product
// does not mind, and every load is a full 16-byte vector.
//
// Work split: a block owns one 32-row slab of W (two 16-row mma tiles) and splits its K steps
// over its W warps (interleaved, so they read neighbouring memory at the same time and share the
// activation lines in L1); the warps add their accumulators in shared memory in warp order (the
// result does not depend on timing) and write each output row as 32 consecutive columns. W is
// chosen per shape so the whole GPU streams at once: 16 warps a slab for Qwen3-8B's o_proj (128
// slabs), 2 for its gate|up (768 slabs), and 4 for the lm_head (4748 slabs, more than one wave of
// even one-warp blocks: 4 warps make the blocks, and the last wave's tail, 4 times shorter than
// one warp's 64 K steps). No split crosses blocks: an earlier
// version split K over blocks with a last-block reduction, and that reduction (one block reading
// every split's partials at L2 latency) halved the speed.
//
// Fused decode block (launch_skinny_norm_gemm, Backend::rms_norm_gemm at 5-32 rows): the RMSNorm
// before the GEMM and the SwiGLU after it, so a Qwen3 layer's q|k|v and gate|up each run as one
// kernel instead of two or three. Measured on the H200 (docs/benchmarks.md): the SwiGLU epilogue
// pays (on by default), the norm prologue does not (opt-in): every block normalises all the rows
// again, blocks x rows x K conversions (384-768 blocks for a gate|up), which cost more than the
// norm kernel they replace (Qwen3-1.7B 16 rows 1.81 -> 2.05 ms a step, 8B 4.97 -> 5.90).
// - Norm prologue: `a` is the residual stream x. Every block needs each row's rstd before its
//   first product, but reading all of x in every block would add half the weight's bytes to the
//   L2 traffic at 16 rows; so the first blocks to arrive (an atomic ticket: a block holding ticket
//   t < chunks has started, so waiting on it cannot deadlock) each add the squares of one
//   256-wide column chunk of every row into a scratch [chunks][32], and every block waits for
//   them (a counter), then sums the chunks in chunk order (deterministic). The last block past
//   the wait resets the counters for the next launch. While it waits, the block prefetches its
//   first weight steps into L2. Activation fragments are then normalised in registers as the
//   norm kernel rounds them: h = bf16(bf16(x * rstd) * norm_w).
// - SwiGLU epilogue: W holds 2n rows (gate, then up); block b's two 16-row mma tiles are gate
//   rows 16b.. and up rows n + 16b.., so the block writes out[:, 16b + r] = silu(y_g) * y_u with
//   the swiglu kernel's roundings (y rounded to bf16, silu rounded, product rounded).
#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <type_traits>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/mma.cuh"

namespace xserv::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int max_warps = 16;
constexpr int slab_rows = 32;  // weight rows per block: two 16-row mma tiles
constexpr int k_step = 64;
constexpr int smem_stride = slab_rows + 4;  // +4 floats: the fragment stores hit 32 banks

constexpr int stat_chunk = 256;  // columns of x per statistics chunk (Norm)
constexpr int stat_rows = static_cast<int>(max_skinny_gemm_rows);  // row stride of the chunk sums

struct SkinnyParams {
  void* out;
  std::int64_t ldo;
  const bf16* a;
  const bf16* w;
  const bf16* bias;
  float beta;
  int m, n, k;  // n: W's rows (with Swiglu 2x the output columns)
  // Norm: the RMSNorm weight [k], eps, the chunk sums [chunks][stat_rows] and three counters
  // (tickets, chunks done, blocks past the wait; zero between launches).
  const bf16* norm_w = nullptr;
  float eps = 0.0f;
  float* stats = nullptr;
  unsigned* counters = nullptr;
  int chunks = 0;
  // Asked into L2 once a warp's weight loads are done, a slice a warp (launch_skinny_norm_gemm).
  const unsigned char* l2_next = nullptr;
  std::int64_t l2_next_bytes = 0;
  int trigger = 0;  // when the next kernel may launch: a Trigger (XSERV_CUDA_SKINNY_TRIGGER)
};

// When a block lets the next kernel on the stream launch (griddepcontrol.launch_dependents):
// at its start (as before 2026-12-07: the kernel predates common.cuh's rule of triggering after
// the wait), after its dependency wait (the default since 2026-12-07, the rule every other PDL
// kernel follows: at most two kernels of a chain resident; serving Qwen3-8B 16 at once +1% on an
// H100, 1.7B unchanged, docs/benchmarks.md "The skinny GEMM's trigger and the one-pass attention
// at 16 serving rows"), or after its K loop (the next kernel's blocks then take no registers
// while this one streams: +0.7%). The next kernel's results are the same either way.
enum Trigger : int { trigger_start = 0, trigger_wait = 1, trigger_end = 2 };

// h = bf16(bf16(x * rstd) * g) for the 8 values of a fragment word quad (as norm.cu rounds).
__device__ __forceinline__ uint4 normalise8(uint4 x, uint4 g, float rstd) {
  const auto* xh = reinterpret_cast<const __nv_bfloat162*>(&x);
  const auto* gh = reinterpret_cast<const __nv_bfloat162*>(&g);
  uint4 r;
  auto* rh = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 xf = __bfloat1622float2(xh[i]), gf = __bfloat1622float2(gh[i]);
    const float2 n = __bfloat1622float2(__floats2bfloat162_rn(xf.x * rstd, xf.y * rstd));
    rh[i] = __floats2bfloat162_rn(n.x * gf.x, n.y * gf.y);
  }
  return r;
}

__device__ __forceinline__ void prefetch_l2(const void* p) {
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// Sum of squares of the 8 bf16 in v, in f32 (the RMSNorm statistics of the norm prologue).
__device__ __forceinline__ float sum_squares(uint4 v) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
  float ss = 0.0f;
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const float2 f = __bfloat1622float2(h[j]);
    ss += f.x * f.x + f.y * f.y;
  }
  return ss;
}

// The Norm prologue (see the file head): returns once s_rstd[0..m) holds every row's rstd.
__device__ void row_rstd(const SkinnyParams& p, float* s_rstd, unsigned* s_ticket) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  if (!p.counters) {
    // XSERV_CUDA_SKINNY_STATS=block (for comparisons): every block reads all of x itself, a warp
    // per row, no counters (m * k * 2 bytes more L2 traffic per block).
    for (int m = warp; m < p.m; m += warps) {
      const bf16* row = p.a + static_cast<std::int64_t>(m) * p.k;
      float ss = 0.0f;
#pragma unroll 4
      for (int i = lane * 8; i < p.k; i += 256) {
        ss += sum_squares(__ldg(reinterpret_cast<const uint4*>(row + i)));
      }
      ss = warp_sum(ss);
      if (lane == 0) s_rstd[m] = rsqrtf(ss / static_cast<float>(p.k) + p.eps);
    }
    __syncthreads();
    return;
  }
  if (threadIdx.x == 0) *s_ticket = atomicAdd(&p.counters[0], 1u);
  __syncthreads();
  const unsigned ticket = *s_ticket;
  if (ticket < static_cast<unsigned>(p.chunks)) {
    const int i = static_cast<int>(ticket) * stat_chunk + lane * 8;
    for (int m = warp; m < p.m; m += warps) {
      float ss = 0.0f;
      if (i < p.k) {
        ss += sum_squares(__ldg(reinterpret_cast<const uint4*>(p.a + static_cast<std::int64_t>(m) * p.k + i)));
      }
      ss = warp_sum(ss);
      if (lane == 0) p.stats[ticket * stat_rows + m] = ss;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      __threadfence();
      atomicAdd(&p.counters[1], 1u);
    }
  }
  if (threadIdx.x == 0) {
    // Bounded, so a broken counter is a loud error rather than a hung GPU.
    long long spins = 0;
    while (*reinterpret_cast<volatile unsigned*>(&p.counters[1]) < static_cast<unsigned>(p.chunks)) {
      __nanosleep(64);
      if (++spins > (1ll << 26)) __trap();
    }
    __threadfence();
    // Every block has taken its ticket and passed the wait when the last one gets here.
    if (atomicAdd(&p.counters[2], 1u) == gridDim.x - 1) {
      atomicExch(&p.counters[0], 0u);
      atomicExch(&p.counters[1], 0u);
      atomicExch(&p.counters[2], 0u);
    }
  }
  __syncthreads();
  if (threadIdx.x < p.m) {
    float t = 0.0f;
    for (int c = 0; c < p.chunks; ++c) t += __ldcg(p.stats + c * stat_rows + threadIdx.x);
    s_rstd[threadIdx.x] = rsqrtf(t / static_cast<float>(p.k) + p.eps);
  }
  __syncthreads();
}

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Launch: grid (N / 32), warps * 32 threads, warps * MT * 8 * smem_stride floats of shared memory.
// Norm and Swiglu: the fused decode block (file head); OutT is bf16 then.
// This lane's activation fragments of K step `step` (zero past the rows).
template <int MT>
__device__ __forceinline__ void load_act(uint4 (&dst)[MT][2], const bf16* const (&ap)[MT], const bool (&a_ok)[MT],
                                         int step) {
#pragma unroll
  for (int t = 0; t < MT; ++t)
#pragma unroll
    for (int c = 0; c < 2; ++c)
      dst[t][c] = a_ok[t] ? __ldg(reinterpret_cast<const uint4*>(ap[t] + step * k_step + c * 32))
                          : make_uint4(0, 0, 0, 0);
}

// How a warp keeps weight bytes in flight (the template's Mode):
// - regs: the next step's weights in registers, loaded a step ahead (4 KB a warp in flight);
// - ahead: the same, and the activation fragments loaded a step ahead too (their L2 latency off
//   each step's path; 8 * MT registers more; XSERV_CUDA_SKINNY_ACT_AHEAD=1);
// - deep: the weights of the next two steps in registers (8 KB a warp in flight, 32 registers
//   more), in blocks of at most deep_max_warps warps so the compiler may use more than 128
//   registers a thread (XSERV_CUDA_SKINNY_DEEP). Staging the weights in shared memory instead
//   (a cp.async ring) measured slower: its 12 KB a warp took the L1 space that keeps every
//   block's activation reads out of L2 (docs/benchmarks.md).
enum class Mode { regs, ahead, deep };
constexpr int deep_max_warps = 8;

template <int MT, typename OutT, bool Norm = false, bool Swiglu = false, Mode M = Mode::regs>
__global__ void __launch_bounds__((M == Mode::deep ? deep_max_warps : max_warps) * 32)
    skinny_gemm_kernel(const SkinnyParams p) {
  constexpr bool Ahead = M == Mode::ahead, Deep = M == Mode::deep;
  extern __shared__ float s_acc[];  // [warps][MT * 8][smem_stride]
  __shared__ float s_rstd[Norm ? stat_rows : 1];
  __shared__ unsigned s_ticket;
  if (p.trigger == trigger_start) allow_dependents();
  const int warps = blockDim.x >> 5;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int col0 = blockIdx.x * slab_rows;
  const int steps = p.k / k_step;

  // This lane's weight rows g, g + 8 of each 16-row tile, at its K offset 8q: the slab's rows
  // g, g + 8, g + 16, g + 24, or with Swiglu gate rows 16b + g (+ 8) and up rows n/2 + 16b + g (+ 8).
  const std::int64_t tile0 = Swiglu ? blockIdx.x * 16 : col0;
  const std::int64_t tile1 = Swiglu ? p.n / 2 + blockIdx.x * 16 : col0 + 16;
  const std::int64_t row8 = static_cast<std::int64_t>(8) * p.k;
  const bf16* wrow[4] = {p.w + (tile0 + g) * p.k + q * 8, p.w + (tile0 + g) * p.k + q * 8 + row8,
                         p.w + (tile1 + g) * p.k + q * 8, p.w + (tile1 + g) * p.k + q * 8 + row8};
  const bf16* ap[MT];
  bool a_ok[MT];
#pragma unroll
  for (int t = 0; t < MT; ++t) {
    const int row = t * 8 + g;
    a_ok[t] = row < p.m;
    ap[t] = p.a + static_cast<std::int64_t>(a_ok[t] ? row : 0) * p.k + q * 8;
  }

  float acc[2][MT][4] = {};
  uint4 w_next[4][2];  // [row g + 8r][chunk]: the next step's weights, loaded a step ahead
  [[maybe_unused]] uint4 w_after[Deep ? 4 : 1][2];  // Deep: the step after it
  int s = warp;
  if (s < steps) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) w_next[r][c] = load_stream(wrow[r] + s * k_step + c * 32);
  }
  if constexpr (Deep) {
    if (s + warps < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) w_after[r][c] = load_stream(wrow[r] + (s + warps) * k_step + c * 32);
    }
  }
  // The activations come from the kernel before this one.
  if (p.trigger == trigger_end) grid_dependency_wait_only();
  else grid_dependency_wait();
  [[maybe_unused]] float rstd[MT];
  if constexpr (Norm) {
    // The next few steps' weights stream into L2 while the block waits for the row statistics.
    for (int j = 1; j <= 3; ++j) {
      const int st = warp + j * warps;
      if (st < steps)
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) prefetch_l2(wrow[r] + st * k_step + c * 32);
    }
    row_rstd(p, s_rstd, &s_ticket);
#pragma unroll
    for (int t = 0; t < MT; ++t) rstd[t] = a_ok[t] ? s_rstd[t * 8 + g] : 0.0f;
  }
  [[maybe_unused]] uint4 a_next[Ahead ? MT : 1][2];
  if constexpr (Ahead) {
    if (s < steps) load_act<MT>(a_next, ap, a_ok, s);
  }
  for (; s < steps; s += warps) {
    uint4 wv[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) wv[r][c] = w_next[r][c];
    if constexpr (Deep) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) w_next[r][c] = w_after[r][c];
      if (s + 2 * warps < steps) {
#pragma unroll
        for (int r = 0; r < 4; ++r)
#pragma unroll
          for (int c = 0; c < 2; ++c) w_after[r][c] = load_stream(wrow[r] + (s + 2 * warps) * k_step + c * 32);
      }
    } else if (s + warps < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) w_next[r][c] = load_stream(wrow[r] + (s + warps) * k_step + c * 32);
    }
    uint4 av[MT][2];
    if constexpr (Ahead) {
#pragma unroll
      for (int t = 0; t < MT; ++t)
#pragma unroll
        for (int c = 0; c < 2; ++c) av[t][c] = a_next[t][c];
      if (s + warps < steps) load_act<MT>(a_next, ap, a_ok, s + warps);
    } else {
      load_act<MT>(av, ap, a_ok, s);
    }
    if constexpr (Norm) {
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const uint4 gv = __ldg(reinterpret_cast<const uint4*>(p.norm_w + s * k_step + c * 32 + q * 8));
#pragma unroll
        for (int t = 0; t < MT; ++t)
          if (a_ok[t]) av[t][c] = normalise8(av[t][c], gv, rstd[t]);
      }
    }
#pragma unroll
    for (int c = 0; c < 2; ++c)
#pragma unroll
      for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int t = 0; t < MT; ++t) {
          const unsigned b0 = word(av[t][c], 2 * h), b1 = word(av[t][c], 2 * h + 1);
#pragma unroll
          for (int tile = 0; tile < 2; ++tile)
          {
            const unsigned a[4] = {word(wv[2 * tile][c], 2 * h), word(wv[2 * tile + 1][c], 2 * h),
                                   word(wv[2 * tile][c], 2 * h + 1), word(wv[2 * tile + 1][c], 2 * h + 1)};
            mma_bf16(acc[tile][t], a, b0, b1);
          }
        }
  }

  if (p.trigger == trigger_end) allow_dependents();
  if (p.l2_next_bytes > 0 && lane == 0)
    prefetch_slice_l2(p.l2_next, p.l2_next_bytes, blockIdx.x * warps + warp, gridDim.x * warps);

  // acc[tile][t][i]: weight row tile * 16 + g + 8 * (i / 2), activation row t * 8 + 2q + i % 2.
  float* mine = s_acc + warp * (MT * 8 * smem_stride);
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        mine[(t * 8 + 2 * q + (i & 1)) * smem_stride + tile * 16 + g + 8 * (i >> 1)] = acc[tile][t][i];
  __syncthreads();
  const int rows = min(p.m, MT * 8);
  if constexpr (Swiglu) {
    // Thread (m, r): gate column r and up column 16 + r of the block, summed in warp order.
    bf16* out = static_cast<bf16*>(p.out);
    for (int idx = threadIdx.x; idx < rows * 16; idx += blockDim.x) {
      const int m = idx / 16, r = idx % 16;
      float yg = 0.0f, yu = 0.0f;
      for (int w = 0; w < warps; ++w) {
        yg += s_acc[(w * MT * 8 + m) * smem_stride + r];
        yu += s_acc[(w * MT * 8 + m) * smem_stride + 16 + r];
      }
      const float gf = to_f32(from_f32<bf16>(yg)), uf = to_f32(from_f32<bf16>(yu));
      const float sf = to_f32(from_f32<bf16>(gf / (1.0f + expf(-gf))));
      out[static_cast<std::int64_t>(m) * p.ldo + blockIdx.x * 16 + r] = from_f32<bf16>(sf * uf);
    }
  } else {
    // Thread (m, r) adds the warps' values of output row m, column col0 + r in warp order.
    for (int idx = threadIdx.x; idx < rows * slab_rows; idx += blockDim.x) {
      const int m = idx / slab_rows, r = idx % slab_rows;
      float v = 0.0f;
      for (int w = 0; w < warps; ++w) v += s_acc[(w * MT * 8 + m) * smem_stride + r];
      OutT* o = static_cast<OutT*>(p.out) + static_cast<std::int64_t>(m) * p.ldo + col0 + r;
      if (p.bias) v += to_f32(p.bias[col0 + r]);
      if (p.beta != 0.0f) v += p.beta * to_f32(*o);
      *o = from_f32<OutT>(v);
    }
  }
}

template <int MT>
std::size_t smem_bytes(int warps) {
  return static_cast<std::size_t>(warps) * MT * 8 * smem_stride * sizeof(float);
}

// Warps of this kernel one SM holds (registers bound it), and the opt-in to more than 48 KB of
// dynamic shared memory for 16-warp blocks of 32 rows.
template <int MT, typename OutT, bool Norm, bool Swiglu, Mode M>
int warps_per_sm() {
  static const int warps = [] {
    const auto kernel = skinny_gemm_kernel<MT, OutT, Norm, Swiglu, M>;
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_bytes<MT>(max_warps))));
    int blocks = 0;
    XSERV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, 32, smem_bytes<MT>(1)));
    return std::max(blocks, 1);
  }();
  return warps;
}

// Warps per block: the power of two (1..limit, at most one per K step and what an SM holds)
// that brings slabs x warps closest to every SM full. one_wave: never doubles past the size at
// which every block still fits at once (blocks an SM = per_sm / w, rounded down), for the deep
// form's fewer warps an SM (Qwen3-8B's q|k|v: 192 blocks of 8 warps would be 1.45 waves at 14
// warps an SM).
int warps_for(int slabs, int steps, int per_sm, int sm_count, int limit, bool one_wave) {
  const double ideal = static_cast<double>(per_sm) * sm_count / slabs;
  const auto fits = [&](int w) { return slabs <= sm_count * (per_sm / w); };
  int w = 1;
  while (w * 2 <= std::min({limit, steps, per_sm}) && w * 1.5 < ideal && !(one_wave && fits(w) && !fits(w * 2)))
    w *= 2;
  return w;
}

// Warps a block where the slabs exceed one wave of one-warp blocks (the lm_head: 4748 slabs, ~2.2
// waves of 64-step one-warp blocks, whose last wave's tail left the GPU half idle): 4, so blocks
// are 4 times shorter and so is the tail. Measured on the H200 (docs/benchmarks.md, "The 16-row
// decode step of Qwen3-8B"): the 8B lm_head at 16 rows 353 -> 314 us, 1.7B's 178 -> 162, serving
// 8B 16 at once +0.7%. XSERV_CUDA_SKINNY_BIG_WARPS=N (read at every launch): N warps instead (at
// most the kernel's limit and K's steps), 0 the one-warp rule as before (for comparisons).
constexpr int default_big_warps = 4;
int big_warps() {
  const char* env = std::getenv("XSERV_CUDA_SKINNY_BIG_WARPS");
  return env ? std::clamp(std::atoi(env), 0, max_warps) : default_big_warps;
}

// XSERV_CUDA_SKINNY_TRIGGER=start|wait|end (read at every launch, for comparisons): a Trigger.
int trigger_mode() {
  const char* env = std::getenv("XSERV_CUDA_SKINNY_TRIGGER");
  if (!env) return trigger_wait;
  const std::string_view v(env);
  return v == "start" ? trigger_start : v == "end" ? trigger_end : trigger_wait;
}

template <int MT, typename OutT, bool Norm, bool Swiglu, Mode M>
void launch_mt_mode(cudaStream_t stream, SkinnyParams p, int sm_count) {
  p.trigger = trigger_mode();
  const int per_sm = warps_per_sm<MT, OutT, Norm, Swiglu, M>();
  const int limit = M == Mode::deep ? deep_max_warps : max_warps;
  int warps = warps_for(p.n / slab_rows, p.k / k_step, per_sm, sm_count, limit, M == Mode::deep);
  if (const int big = big_warps(); big > 0 && p.n / slab_rows > per_sm * sm_count)
    warps = std::min({big, limit, p.k / k_step});
  launch_pdl(skinny_gemm_kernel<MT, OutT, Norm, Swiglu, M>, dim3(static_cast<unsigned>(p.n / slab_rows)),
             dim3(warps * 32), smem_bytes<MT>(warps), stream, p);
}

// XSERV_CUDA_SKINNY_ACT_AHEAD=1 (read at every launch, for comparisons): the activation
// fragments loaded a step ahead too.
bool act_ahead() {
  const char* env = std::getenv("XSERV_CUDA_SKINNY_ACT_AHEAD");
  return env && std::string_view(env) == "1";
}

// XSERV_CUDA_SKINNY_DEEP=BITS (read at every launch, for comparisons): which launches keep two
// steps of weights in flight (Mode::deep): 1 bf16 outputs without SwiGLU (q|k|v, o_proj, down),
// 2 the SwiGLU epilogue (gate|up), 4 f32 outputs (the lm_head). Not with the norm prologue.
int deep_bits() {
  const char* env = std::getenv("XSERV_CUDA_SKINNY_DEEP");
  return env ? std::atoi(env) : 0;
}

template <int MT, typename OutT, bool Norm = false, bool Swiglu = false>
void launch_mt(cudaStream_t stream, const SkinnyParams& p, int sm_count) {
  const int kind = Swiglu ? 2 : std::is_same_v<OutT, float> ? 4 : 1;
  if constexpr (!Norm) {
    if ((deep_bits() & kind) != 0) {
      launch_mt_mode<MT, OutT, Norm, Swiglu, Mode::deep>(stream, p, sm_count);
      return;
    }
  }
  if (act_ahead()) launch_mt_mode<MT, OutT, Norm, Swiglu, Mode::ahead>(stream, p, sm_count);
  else launch_mt_mode<MT, OutT, Norm, Swiglu, Mode::regs>(stream, p, sm_count);
}

template <typename OutT, bool Norm = false, bool Swiglu = false>
void launch_typed(cudaStream_t stream, const SkinnyParams& p, int sm_count) {
  switch ((p.m + 7) / 8) {
    case 1: launch_mt<1, OutT, Norm, Swiglu>(stream, p, sm_count); break;
    case 2: launch_mt<2, OutT, Norm, Swiglu>(stream, p, sm_count); break;
    case 3: launch_mt<3, OutT, Norm, Swiglu>(stream, p, sm_count); break;
    default: launch_mt<4, OutT, Norm, Swiglu>(stream, p, sm_count); break;
  }
}

int stat_chunks(std::int64_t k) { return static_cast<int>((k + stat_chunk - 1) / stat_chunk); }

bool aligned16(const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; }

}  // namespace

bool skinny_gemm_supported(DType dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                           const void* w, std::int64_t max_rows) noexcept {
  return dt == DType::bf16 && m > max_gemv_rows && m <= std::min(max_rows, max_skinny_gemm_rows) &&
         n % slab_rows == 0 && k % k_step == 0 && k >= k_step && n <= (std::int64_t{1} << 30) &&
         k <= (std::int64_t{1} << 30) && aligned16(a) && aligned16(w);
}

void launch_skinny_gemm(cudaStream_t stream, DType out_dt, void* out, std::int64_t ldo, const void* a,
                        const void* w, const void* bias, float beta, std::int64_t m, std::int64_t n,
                        std::int64_t k, int sm_count) {
  const SkinnyParams p{out, ldo, static_cast<const bf16*>(a), static_cast<const bf16*>(w),
                       static_cast<const bf16*>(bias), beta, static_cast<int>(m), static_cast<int>(n),
                       static_cast<int>(k)};
  if (out_dt == DType::f32) launch_typed<float>(stream, p, sm_count);
  else launch_typed<bf16>(stream, p, sm_count);
}

bool skinny_norm_gemm_supported(DType dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
                                const void* norm_weight, const void* w, std::int64_t max_rows) noexcept {
  // Every chunk of the row statistics needs a block of its own (n / 32 blocks).
  return skinny_gemm_supported(dt, m, n, k, x, w, max_rows) && aligned16(norm_weight) &&
         stat_chunks(k) <= n / slab_rows;
}

std::size_t skinny_norm_scratch_bytes(std::int64_t k) noexcept {
  return 64 + static_cast<std::size_t>(stat_chunks(k)) * stat_rows * sizeof(float);
}

void launch_skinny_norm_gemm(cudaStream_t stream, void* out, const void* x, const void* norm_weight, float eps,
                             const void* w, bool swiglu, std::int64_t m, std::int64_t n, std::int64_t k,
                             int sm_count, void* scratch, L2Prefetch next) {
  if (m == 0 || n == 0) return;
  SkinnyParams p{out, swiglu ? n / 2 : n, static_cast<const bf16*>(x), static_cast<const bf16*>(w), nullptr,
                 0.0f, static_cast<int>(m), static_cast<int>(n), static_cast<int>(k)};
  p.l2_next = static_cast<const unsigned char*>(next.data);
  p.l2_next_bytes = next.bytes & ~std::int64_t{15};
  p.norm_w = static_cast<const bf16*>(norm_weight);
  p.eps = eps;
  if (scratch) {  // null: every block computes the statistics itself
    p.counters = static_cast<unsigned*>(scratch);
    p.stats = reinterpret_cast<float*>(static_cast<char*>(scratch) + 64);
  }
  p.chunks = stat_chunks(k);
  if (!norm_weight) launch_typed<bf16, false, true>(stream, p, sm_count);  // x already normalised
  else if (swiglu) launch_typed<bf16, true, true>(stream, p, sm_count);
  else launch_typed<bf16, true, false>(stream, p, sm_count);
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
