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
// slabs), 2 for its gate|up (768 slabs), 1 for the lm_head. No split crosses blocks: an earlier
// version split K over blocks with a last-block reduction, and that reduction (one block reading
// every split's partials at L2 latency) halved the speed.
#include <algorithm>

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

struct SkinnyParams {
  void* out;
  std::int64_t ldo;
  const bf16* a;
  const bf16* w;
  const bf16* bias;
  float beta;
  int m, n, k;
};

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Launch: grid (N / 32), warps * 32 threads, warps * MT * 8 * smem_stride floats of shared memory.
template <int MT, typename OutT>
__global__ void __launch_bounds__(max_warps * 32) skinny_gemm_kernel(const SkinnyParams p) {
  extern __shared__ float s_acc[];  // [warps][MT * 8][smem_stride]
  allow_dependents();
  const int warps = blockDim.x >> 5;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int col0 = blockIdx.x * slab_rows;
  const int steps = p.k / k_step;

  // This lane's weight rows g, g + 8, g + 16, g + 24 of the slab, at its K offset 8q.
  const bf16* wp = p.w + static_cast<std::int64_t>(col0 + g) * p.k + q * 8;
  const std::int64_t row8 = static_cast<std::int64_t>(8) * p.k;
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
  int s = warp;
  if (s < steps) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) w_next[r][c] = load_stream(wp + r * row8 + s * k_step + c * 32);
  }
  grid_dependency_wait();  // the activations come from the kernel before this one
  for (; s < steps; s += warps) {
    uint4 wv[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) wv[r][c] = w_next[r][c];
    if (s + warps < steps) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) w_next[r][c] = load_stream(wp + r * row8 + (s + warps) * k_step + c * 32);
    }
    uint4 av[MT][2];
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int c = 0; c < 2; ++c)
        av[t][c] = a_ok[t] ? __ldg(reinterpret_cast<const uint4*>(ap[t] + s * k_step + c * 32))
                           : make_uint4(0, 0, 0, 0);
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
  // Thread (m, r) adds the warps' values of output row m, column col0 + r in warp order.
  const int rows = min(p.m, MT * 8);
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

template <int MT>
std::size_t smem_bytes(int warps) {
  return static_cast<std::size_t>(warps) * MT * 8 * smem_stride * sizeof(float);
}

// Warps of this kernel one SM holds (registers bound it), and the opt-in to more than 48 KB of
// dynamic shared memory for 16-warp blocks of 32 rows.
template <int MT, typename OutT>
int warps_per_sm() {
  static const int warps = [] {
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(skinny_gemm_kernel<MT, OutT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(smem_bytes<MT>(max_warps))));
    int blocks = 0;
    XSERV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, skinny_gemm_kernel<MT, OutT>, 32,
                                                                   smem_bytes<MT>(1)));
    return std::max(blocks, 1);
  }();
  return warps;
}

// Warps per block: the power of two (1..16, at most one per K step and what an SM holds) that
// brings slabs x warps closest to every SM full.
int warps_for(int slabs, int steps, int per_sm, int sm_count) {
  const double ideal = static_cast<double>(per_sm) * sm_count / slabs;
  int w = 1;
  while (w * 2 <= std::min({max_warps, steps, per_sm}) && w * 1.5 < ideal) w *= 2;
  return w;
}

template <int MT, typename OutT>
void launch_mt(cudaStream_t stream, const SkinnyParams& p, int sm_count) {
  const int per_sm = warps_per_sm<MT, OutT>();
  const int warps = warps_for(p.n / slab_rows, p.k / k_step, per_sm, sm_count);
  launch_pdl(skinny_gemm_kernel<MT, OutT>, dim3(static_cast<unsigned>(p.n / slab_rows)), dim3(warps * 32),
             smem_bytes<MT>(warps), stream, p);
}

template <typename OutT>
void launch_typed(cudaStream_t stream, const SkinnyParams& p, int sm_count) {
  switch ((p.m + 7) / 8) {
    case 1: launch_mt<1, OutT>(stream, p, sm_count); break;
    case 2: launch_mt<2, OutT>(stream, p, sm_count); break;
    case 3: launch_mt<3, OutT>(stream, p, sm_count); break;
    default: launch_mt<4, OutT>(stream, p, sm_count); break;
  }
}

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

}  // namespace xserv::cuda
