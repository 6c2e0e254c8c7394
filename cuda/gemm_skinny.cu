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
// Work split: a block of 4 warps owns 128 weight rows (32 a warp, a "slab") and a range of K
// steps that all its warps walk together, so the activation lines one warp brings into L1 serve
// the other three. When the row blocks alone do not fill the GPU, K is split over blockIdx.y:
// each block writes an f32 partial and the last block of a row block to finish (atomic ticket,
// reset for the next launch or graph replay) adds the partials in split order, so results do not
// depend on timing. Outputs leave through shared memory as whole 32-column rows (coalesced).
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int warps = 4;
constexpr int threads = warps * 32;
constexpr int slab_rows = 32;  // weight rows per warp: two 16-row mma tiles
constexpr int block_rows = warps * slab_rows;
constexpr int k_step = 64;
constexpr int smem_stride = slab_rows + 4;  // +4 floats: the fragment stores hit 32 banks

struct SkinnyParams {
  void* out;
  std::int64_t ldo;
  const bf16* a;
  const bf16* w;
  const bf16* bias;
  float beta;
  int m, n, k, splits;
  float* partial;     // [splits, m, n] when splits > 1
  unsigned* tickets;  // [ceil(n / block_rows)], zero between launches
};

// Weight bytes are read once: keep them out of L1 so the activations stay there.
__device__ __forceinline__ uint4 load_weight(const bf16* p) {
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}

__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// c += A (16 x 16, row-major fragment a0..a3) . B (16 x 8, column fragment b0, b1), f32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&c)[4], unsigned a0, unsigned a1, unsigned a2,
                                         unsigned a3, unsigned b0, unsigned b1) {
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

template <typename OutT>
__device__ __forceinline__ void finish(const SkinnyParams& p, int m, int col, float v) {
  OutT* o = static_cast<OutT*>(p.out) + static_cast<std::int64_t>(m) * p.ldo + col;
  if (p.bias) v += to_f32(p.bias[col]);
  if (p.beta != 0.0f) v += p.beta * to_f32(*o);
  *o = from_f32<OutT>(v);
}

template <int MT, typename OutT>
__global__ void __launch_bounds__(threads) skinny_gemm_kernel(const SkinnyParams p) {
  __shared__ float s_out[warps][MT * 8][smem_stride];
  __shared__ bool s_last;
  allow_dependents();
  const int split = blockIdx.y;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int g = lane >> 2, q = lane & 3;
  const int col0 = blockIdx.x * block_rows + warp * slab_rows;  // this warp's first weight row
  const bool has_slab = col0 < p.n;                              // N % 32 == 0: whole slabs
  const int steps = p.k / k_step;
  const int s_begin = static_cast<int>(static_cast<long long>(split) * steps / p.splits);
  const int s_end = has_slab ? static_cast<int>(static_cast<long long>(split + 1) * steps / p.splits) : s_begin;

  // This lane's weight rows g, g + 8, g + 16, g + 24 of the slab, at its K offset 8q.
  const bf16* wp = p.w + static_cast<std::int64_t>(has_slab ? col0 + g : 0) * p.k + q * 8;
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
  if (s_begin < s_end) {
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) w_next[r][c] = load_weight(wp + r * row8 + s_begin * k_step + c * 32);
  }
  grid_dependency_wait();  // the activations come from the kernel before this one
  for (int s = s_begin; s < s_end; ++s) {
    uint4 wv[4][2];
#pragma unroll
    for (int r = 0; r < 4; ++r)
#pragma unroll
      for (int c = 0; c < 2; ++c) wv[r][c] = w_next[r][c];
    if (s + 1 < s_end) {
#pragma unroll
      for (int r = 0; r < 4; ++r)
#pragma unroll
        for (int c = 0; c < 2; ++c) w_next[r][c] = load_weight(wp + r * row8 + (s + 1) * k_step + c * 32);
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
            mma_bf16(acc[tile][t], word(wv[2 * tile][c], 2 * h), word(wv[2 * tile + 1][c], 2 * h),
                     word(wv[2 * tile][c], 2 * h + 1), word(wv[2 * tile + 1][c], 2 * h + 1), b0, b1);
        }
  }

  // acc[tile][t][i]: weight row tile * 16 + g + 8 * (i / 2), activation row t * 8 + 2q + i % 2.
  // Through shared memory so that each output row leaves as 32 consecutive columns.
#pragma unroll
  for (int tile = 0; tile < 2; ++tile)
#pragma unroll
    for (int t = 0; t < MT; ++t)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        s_out[warp][t * 8 + 2 * q + (i & 1)][tile * 16 + g + 8 * (i >> 1)] = acc[tile][t][i];
  __syncwarp();
  const int rows = min(p.m, MT * 8);
  if (p.splits == 1) {
    if (has_slab)
      for (int m = 0; m < rows; ++m) finish<OutT>(p, m, col0 + lane, s_out[warp][m][lane]);
    return;
  }
  if (has_slab)
    for (int m = 0; m < rows; ++m)
      p.partial[(static_cast<std::int64_t>(split) * p.m + m) * p.n + col0 + lane] = s_out[warp][m][lane];
  __threadfence();  // partials visible device-wide before the ticket says so
  __syncthreads();
  if (threadIdx.x == 0) s_last = atomicAdd(&p.tickets[blockIdx.x], 1u) == static_cast<unsigned>(p.splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  if (has_slab)
    for (int m = 0; m < rows; ++m) {
      float v = 0.0f;
      for (int sp = 0; sp < p.splits; ++sp)
        v += __ldcg(&p.partial[(static_cast<std::int64_t>(sp) * p.m + m) * p.n + col0 + lane]);
      finish<OutT>(p, m, col0 + lane, v);
    }
  if (threadIdx.x == 0) p.tickets[blockIdx.x] = 0;
}

template <int MT, typename OutT>
int resident_blocks() {
  static const int blocks = [] {
    int b = 0;
    XSERV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&b, skinny_gemm_kernel<MT, OutT>, threads, 0));
    return std::max(b, 1);
  }();
  return blocks;
}

// Blocks that fit on the GPU at once for this M (the f32-out kernel is the same size).
int wave_blocks(std::int64_t m, int sm_count) {
  switch ((m + 7) / 8) {
    case 1: return sm_count * resident_blocks<1, bf16>();
    case 2: return sm_count * resident_blocks<2, bf16>();
    case 3: return sm_count * resident_blocks<3, bf16>();
    default: return sm_count * resident_blocks<4, bf16>();
  }
}

// K splits: enough blocks for about one full wave, at least two K steps a block (each warp's
// loads run one step ahead of its products).
int splits_for(std::int64_t m, std::int64_t n, std::int64_t k, int sm_count) {
  const std::int64_t blocks = (n + block_rows - 1) / block_rows, steps = k / k_step;
  const std::int64_t want = std::max<std::int64_t>(1, (wave_blocks(m, sm_count) + blocks / 2) / blocks);
  return static_cast<int>(std::clamp<std::int64_t>(std::min(want, steps / 2), 1, 64));
}

template <typename OutT>
void launch_typed(cudaStream_t stream, const SkinnyParams& p) {
  const dim3 grid(static_cast<unsigned>((p.n + block_rows - 1) / block_rows), static_cast<unsigned>(p.splits));
  switch ((p.m + 7) / 8) {
    case 1: launch_pdl(skinny_gemm_kernel<1, OutT>, grid, dim3(threads), 0, stream, p); break;
    case 2: launch_pdl(skinny_gemm_kernel<2, OutT>, grid, dim3(threads), 0, stream, p); break;
    case 3: launch_pdl(skinny_gemm_kernel<3, OutT>, grid, dim3(threads), 0, stream, p); break;
    default: launch_pdl(skinny_gemm_kernel<4, OutT>, grid, dim3(threads), 0, stream, p); break;
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

std::size_t skinny_gemm_scratch_floats(std::int64_t m, std::int64_t n, std::int64_t k, int sm_count) {
  const int splits = splits_for(m, n, k, sm_count);
  return splits > 1 ? static_cast<std::size_t>(splits * m * n) : 0;
}

std::size_t skinny_gemm_tickets(std::int64_t n) noexcept {
  return static_cast<std::size_t>((n + block_rows - 1) / block_rows);
}

void launch_skinny_gemm(cudaStream_t stream, DType out_dt, void* out, std::int64_t ldo, const void* a,
                        const void* w, const void* bias, float beta, std::int64_t m, std::int64_t n,
                        std::int64_t k, int sm_count, float* partial, unsigned* tickets) {
  SkinnyParams p{out, ldo, static_cast<const bf16*>(a), static_cast<const bf16*>(w),
                 static_cast<const bf16*>(bias), beta, static_cast<int>(m), static_cast<int>(n),
                 static_cast<int>(k), splits_for(m, n, k, sm_count), partial, tickets};
  if (out_dt == DType::f32) launch_typed<float>(stream, p);
  else launch_typed<bf16>(stream, p);
}

}  // namespace xserv::cuda
