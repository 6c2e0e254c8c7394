// Skinny GEMMs for decode: out[m, :] = a[m, :] . W (+ bias) (+ beta * out) for M <= 8 rows, the
// weight in f32 or bf16 (activations in the same dtype), out in that dtype or f32.
// With a handful of rows the product is bound by reading W once, so both kernels are built
// around that stream: 16-byte weight loads that bypass L1 (each byte is read once), several in
// flight per lane, f32 accumulation; the M activation rows are small and re-read from L1/L2.
// - W [N, K] (torch Linear, "out_in"): one warp per output column walks W's row; a warp
//   reduction per row at the end. Launch: 256 threads (8 columns) per block, grid ceil(N / 8).
// - W [K, N] (GPT-2 Conv1D, "in_out"): a warp reads 32 x 16 bytes of a W row (a tile of 128 f32
//   or 256 bf16 columns), the 8 warps of a block take interleaved rows of one K chunk, and K is
//   split over blockIdx.y so that about two blocks per SM stream at once. Each block reduces its
//   warps in shared memory and writes an f32 partial; the last block of a tile to finish (atomic
//   ticket) adds the partials in chunk order (deterministic) and applies bias and beta.
//   Launch: 256 threads, grid (column tiles, K chunks).
// Requires K (out_in) or N (in_out) to be a multiple of the 16-byte vector and 16-byte aligned
// W (and a for out_in); the caller falls back to cuBLASLt otherwise.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int warps = 8;

__device__ __forceinline__ uint4 load_stream(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

template <typename T>
constexpr int vec_of = 16 / static_cast<int>(sizeof(T));

template <typename T>
__device__ __forceinline__ void unpack(uint4 v, float (&f)[vec_of<T>]) {
  if constexpr (sizeof(T) == 4) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  } else {
    const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 x = __bfloat1622float2(h[i]);
      f[2 * i] = x.x;
      f[2 * i + 1] = x.y;
    }
  }
}

template <typename OutT>
__device__ __forceinline__ void finish(OutT* o, float v, const float b, float beta) {
  v += b;
  if (beta != 0.0f) v += beta * to_f32(*o);
  *o = from_f32<OutT>(v);
}

template <typename T, int M, typename OutT>
__global__ void __launch_bounds__(warps * 32) gemv_out_in_kernel(OutT* out, std::int64_t ldo, const T* a,
                                                                 const T* w, const T* bias,
                                                                 float beta, int n, int k, int wpr) {
  constexpr int V = vec_of<T>;
  __shared__ float red[warps][M];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  // wpr warps share a column (small N: more warps in flight), each taking every wpr-th vector.
  const int col = blockIdx.x * (warps / wpr) + warp / wpr, part = warp % wpr;
  const bool active = col < n;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  if (active) {
    const T* wr = w + static_cast<std::int64_t>(col) * k;
    const int step = wpr * 32 * V;  // elements the column's warps cover per load
    auto fma_rows = [&](uint4 wv, int k0) {
      float wf[V];
      unpack<T>(wv, wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float af[V];
        unpack<T>(*reinterpret_cast<const uint4*>(a + static_cast<std::int64_t>(m) * k + k0), af);
#pragma unroll
        for (int i = 0; i < V; ++i) acc[m] += wf[i] * af[i];
      }
    };
    int k0 = (part * 32 + lane) * V;
    // Four independent 16-byte weight loads per lane before any arithmetic.
    for (; k0 + 3 * step < k; k0 += 4 * step) {
      uint4 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[u] = load_stream(wr + k0 + u * step);
#pragma unroll
      for (int u = 0; u < 4; ++u) fma_rows(wv[u], k0 + u * step);
    }
    for (; k0 < k; k0 += step) fma_rows(load_stream(wr + k0), k0);
  }
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (wpr > 1) {
    if (lane == 0)
#pragma unroll
      for (int m = 0; m < M; ++m) red[warp][m] = acc[m];
    __syncthreads();
    if (part != 0) return;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = 0.0f;
      for (int p = 0; p < wpr; ++p) s += red[warp + p][m];  // fixed order: deterministic
      acc[m] = s;
    }
  }
  if (lane == 0 && active) {
    const float b = bias ? to_f32(bias[col]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) finish(out + static_cast<std::int64_t>(m) * ldo + col, acc[m], b, beta);
  }
}

template <typename T, int M, typename OutT>
__global__ void __launch_bounds__(warps * 32) gemv_in_out_kernel(OutT* out, std::int64_t ldo, const T* a,
                                                                 const T* w, const T* bias,
                                                                 float beta, int n, int k, int chunk,
                                                                 float* partial, unsigned* tickets) {
  constexpr int V = vec_of<T>;
  constexpr int tile_cols = 32 * V;
  __shared__ float red[warps][tile_cols];
  __shared__ bool last;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int tile = blockIdx.x, part = blockIdx.y, parts = gridDim.y;
  const int col0 = tile * tile_cols + lane * V;
  const bool col_ok = col0 < n;  // n % V == 0: a lane's V columns are all in or all out
  const int kb = part * chunk, ke = min(k, kb + chunk);

  float acc[M][V];
#pragma unroll
  for (int m = 0; m < M; ++m)
#pragma unroll
    for (int v = 0; v < V; ++v) acc[m][v] = 0.0f;
  auto fma_row = [&](uint4 wv, int kk) {
    float wf[V];
    unpack<T>(wv, wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      const float av = to_f32(a[static_cast<std::int64_t>(m) * k + kk]);
#pragma unroll
      for (int v = 0; v < V; ++v) acc[m][v] += av * wf[v];
    }
  };
  if (col_ok) {
    int kk = kb + warp;
    for (; kk + 3 * warps < ke; kk += 4 * warps) {
      uint4 wv[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) wv[u] = load_stream(w + static_cast<std::int64_t>(kk + u * warps) * n + col0);
#pragma unroll
      for (int u = 0; u < 4; ++u) fma_row(wv[u], kk + u * warps);
    }
    for (; kk < ke; kk += warps) fma_row(load_stream(w + static_cast<std::int64_t>(kk) * n + col0), kk);
  }

  // Warps -> block partial, one output row at a time (keeps shared memory at 8 x tile floats).
  float mine[M];  // thread t ends up owning column tile * tile_cols + t (t < tile_cols)
#pragma unroll
  for (int m = 0; m < M; ++m) {
#pragma unroll
    for (int v = 0; v < V; ++v) red[warp][lane * V + v] = acc[m][v];
    __syncthreads();
    float s = 0.0f;
    if (threadIdx.x < tile_cols) {
#pragma unroll
      for (int w8 = 0; w8 < warps; ++w8) s += red[w8][threadIdx.x];
    }
    mine[m] = s;
    __syncthreads();
  }
  const int col = tile * tile_cols + static_cast<int>(threadIdx.x);
  const bool owns = threadIdx.x < tile_cols && col < n;
  if (parts == 1) {
    if (owns) {
      const float b = bias ? to_f32(bias[col]) : 0.0f;
#pragma unroll
      for (int m = 0; m < M; ++m) finish(out + static_cast<std::int64_t>(m) * ldo + col, mine[m], b, beta);
    }
    return;
  }
  if (owns) {
#pragma unroll
    for (int m = 0; m < M; ++m) partial[(static_cast<std::int64_t>(part) * M + m) * n + col] = mine[m];
  }
  __threadfence();  // partials visible device-wide before the ticket says so
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&tickets[tile], 1u) == static_cast<unsigned>(parts - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  if (owns) {
    const float b = bias ? to_f32(bias[col]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float s = 0.0f;
      for (int p = 0; p < parts; ++p) s += __ldcg(&partial[(static_cast<std::int64_t>(p) * M + m) * n + col]);
      finish(out + static_cast<std::int64_t>(m) * ldo + col, s, b, beta);
    }
  }
  if (threadIdx.x == 0) tickets[tile] = 0;  // ready for the next launch (graph replays too)
}

struct InOutShape {
  int tiles, parts, chunk;
};

InOutShape in_out_shape(DType dt, std::int64_t n, std::int64_t k, int sm_count) {
  const int tile_cols = dt == DType::f32 ? 128 : 256;
  InOutShape s;
  s.tiles = static_cast<int>((n + tile_cols - 1) / tile_cols);
  const int want = std::max(1, (2 * sm_count + s.tiles - 1) / s.tiles);
  const int most = static_cast<int>(std::max<std::int64_t>(1, k / 32));
  s.parts = std::min(want, most);
  s.chunk = static_cast<int>((k + s.parts - 1) / s.parts);
  s.parts = static_cast<int>((k + s.chunk - 1) / s.chunk);
  return s;
}

template <typename T, typename OutT, int M>
void launch_m(cudaStream_t stream, bool in_out, OutT* out, std::int64_t ldo, const T* a, const T* w,
              const T* bias, float beta, int n, int k, const InOutShape& sh, float* partial,
              unsigned* tickets, int sm_count) {
  if (in_out) {
    gemv_in_out_kernel<T, M, OutT><<<dim3(sh.tiles, sh.parts), warps * 32, 0, stream>>>(
        out, ldo, a, w, bias, beta, n, k, sh.chunk, partial, tickets);
  } else {
    // Warps per column: enough warps to fill the GPU (about 32 per SM) while each still streams
    // at least two vectors of its column.
    int wpr = 1;
    while (wpr < warps && n * wpr < 32 * sm_count && k >= 2 * 32 * vec_of<T> * wpr * 2) wpr *= 2;
    const int cols_per_block = warps / wpr;
    gemv_out_in_kernel<T, M, OutT><<<(n + cols_per_block - 1) / cols_per_block, warps * 32, 0, stream>>>(
        out, ldo, a, w, bias, beta, n, k, wpr);
  }
}

template <typename T, typename OutT>
void launch_typed(cudaStream_t stream, bool in_out, void* out, std::int64_t ldo, const void* a,
                  const void* w, const void* bias, float beta, int m, int n, int k,
                  const InOutShape& sh, float* partial, unsigned* tickets, int sm_count) {
  auto* o = static_cast<OutT*>(out);
  auto* at = static_cast<const T*>(a);
  auto* wt = static_cast<const T*>(w);
  auto* bt = static_cast<const T*>(bias);
  switch (m) {
#define XSERV_GEMV_CASE(M) \
  case M: launch_m<T, OutT, M>(stream, in_out, o, ldo, at, wt, bt, beta, n, k, sh, partial, tickets, sm_count); break;
    XSERV_GEMV_CASE(1)
    XSERV_GEMV_CASE(2)
    XSERV_GEMV_CASE(3)
    XSERV_GEMV_CASE(4)
    XSERV_GEMV_CASE(5)
    XSERV_GEMV_CASE(6)
    XSERV_GEMV_CASE(7)
    XSERV_GEMV_CASE(8)
#undef XSERV_GEMV_CASE
    default: break;
  }
}

}  // namespace

bool gemv_supported(DType dt, bool in_out, std::int64_t m, std::int64_t n, std::int64_t k,
                    const void* a, const void* w) noexcept {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (dt != DType::f32 && dt != DType::bf16) return false;
  const std::int64_t v = dt == DType::f32 ? 4 : 8;
  if (m < 1 || m > max_gemv_rows || n < 1 || k < 1 || n >= (std::int64_t{1} << 31) ||
      k >= (std::int64_t{1} << 31) || !aligned(w))
    return false;
  return in_out ? n % v == 0 : (k % v == 0 && aligned(a));
}

std::size_t gemv_scratch_floats(DType dt, bool in_out, std::int64_t m, std::int64_t n,
                                std::int64_t k, int sm_count) noexcept {
  if (!in_out) return 0;
  const InOutShape s = in_out_shape(dt, n, k, sm_count);
  return s.parts > 1 ? static_cast<std::size_t>(s.parts) * static_cast<std::size_t>(m) * static_cast<std::size_t>(n) : 0;
}

std::size_t gemv_tickets(DType dt, std::int64_t n) noexcept {
  const std::int64_t tile_cols = dt == DType::f32 ? 128 : 256;
  return static_cast<std::size_t>((n + tile_cols - 1) / tile_cols);
}

void launch_gemv(cudaStream_t stream, DType dt, DType out_dt, bool in_out, void* out,
                 std::int64_t ldo, const void* a, const void* w, const void* bias, float beta,
                 std::int64_t m, std::int64_t n, std::int64_t k, int sm_count, float* partial,
                 unsigned* tickets) {
  if (m == 0 || n == 0) return;
  const InOutShape sh = in_out ? in_out_shape(dt, n, k, sm_count) : InOutShape{0, 1, 0};
  const int mi = static_cast<int>(m), ni = static_cast<int>(n), ki = static_cast<int>(k);
  if (dt == DType::f32) {
    launch_typed<float, float>(stream, in_out, out, ldo, a, w, bias, beta, mi, ni, ki, sh, partial, tickets, sm_count);
  } else if (out_dt == DType::f32) {
    launch_typed<bf16, float>(stream, in_out, out, ldo, a, w, bias, beta, mi, ni, ki, sh, partial, tickets, sm_count);
  } else {
    launch_typed<bf16, bf16>(stream, in_out, out, ldo, a, w, bias, beta, mi, ni, ki, sh, partial, tickets, sm_count);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
