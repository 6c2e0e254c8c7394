// Element-wise kernels: GELU (tanh form, GPT-2's gelu_new), SwiGLU, row gather, dtype
// conversion and the seeded random fill behind dummy weights.
// Layout: contiguous row-major; swiglu reads gate_up [rows, 2 * inner] (gate half first) and
// writes out [rows, inner]; gather_rows copies rows of x [*, dim] to out [num_rows, dim].
// Launch: grid-stride loops of 256-thread blocks, one element per thread per step (these are
// memory bound and small next to the GEMMs around them); swiglu with 16-byte accesses when the
// shapes allow (batched decode runs it at every layer).
#include <cuda_fp16.h>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

constexpr int threads = 256;
int blocks_for(std::int64_t n) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 65536 ? b : 65536);
}

template <typename T>
__global__ void gelu_kernel(T* x, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float v = to_f32(x[i]);
    const float inner = 0.7978845608028654f * (v + 0.044715f * v * v * v);
    x[i] = from_f32<T>(0.5f * v * (1.0f + tanhf(inner)));
  }
}

template <typename T>
__global__ void swiglu_kernel(T* out, const T* gate_up, std::int64_t rows, std::int64_t inner) {
  const std::int64_t n = rows * inner;
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const std::int64_t r = i / inner, c = i - r * inner;
    const float g = to_f32(gate_up[r * 2 * inner + c]);
    const float u = to_f32(gate_up[r * 2 * inner + inner + c]);
    // HF computes silu(gate) in the activation dtype, then multiplies: round in between.
    const float s = to_f32(from_f32<T>(g / (1.0f + expf(-g))));
    out[i] = from_f32<T>(s * u);
  }
}

// The same with 16-byte accesses: one thread per N = 16 / sizeof(T) columns of a row, the row
// from blockIdx.y (no 64-bit division per element, a quarter or an eighth of the accesses; at
// 128 decode rows of Qwen3-8B the scalar kernel took 8 us a layer). inner % N == 0 and 16-byte
// aligned buffers (launch_swiglu checks).
// pdl (small_kernels_pdl, XSERV_CUDA_SMALL_PDL; on by default): launched early beside the GEMM before it; waits for it first.
template <typename T>
__global__ void swiglu_vec_kernel(T* out, const T* gate_up, std::int64_t inner, bool pdl) {
  constexpr int N = 16 / sizeof(T);
  if (pdl) grid_dependency_wait();
  const std::int64_t c = (blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x) * N;
  if (c >= inner) return;
  const std::int64_t r = blockIdx.y;
  float g[N], u[N], y[N];
  load_f32<T, N>(gate_up + r * 2 * inner + c, g);
  load_f32<T, N>(gate_up + r * 2 * inner + inner + c, u);
#pragma unroll
  for (int i = 0; i < N; ++i) y[i] = to_f32(from_f32<T>(g[i] / (1.0f + expf(-g[i])))) * u[i];
  store_f32<T, N>(out + r * inner + c, y);
}

template <typename T>
void launch_swiglu_typed(cudaStream_t stream, T* out, const T* gate_up, std::int64_t rows,
                         std::int64_t inner) {
  constexpr int N = 16 / sizeof(T);
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  if (inner % N == 0 && aligned(out) && aligned(gate_up) && rows < 65536) {
    const dim3 grid(static_cast<unsigned>((inner / N + threads - 1) / threads),
                    static_cast<unsigned>(rows));
    const bool pdl = small_kernels_pdl();
    launch_kernel(pdl, swiglu_vec_kernel<T>, grid, dim3(threads), 0, stream, out, gate_up, inner, pdl);
  } else {
    swiglu_kernel<<<blocks_for(rows * inner), threads, 0, stream>>>(out, gate_up, rows, inner);
  }
}

template <typename T>
__global__ void gather_rows_kernel(T* out, const T* x, const std::int32_t* rows, std::int64_t dim) {
  const std::int64_t r = blockIdx.x;
  const std::int64_t src = rows[r];
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) out[r * dim + i] = x[src * dim + i];
}

template <typename From>
__device__ __forceinline__ float load_any(const From* p, std::int64_t i) {
  if constexpr (sizeof(From) == 4) {
    return p[i];
  } else if constexpr (std::is_same_v<From, __half>) {
    return __half2float(p[i]);
  } else {
    return __bfloat162float(p[i]);
  }
}

template <typename From, typename To>
__global__ void convert_kernel(const From* src, To* dst, std::int64_t n) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const float v = load_any(src, i);
    if constexpr (std::is_same_v<To, float>) {
      dst[i] = v;
    } else if constexpr (std::is_same_v<To, __half>) {
      dst[i] = __float2half_rn(v);
    } else {
      dst[i] = __float2bfloat16_rn(v);
    }
  }
}

template <typename T>
__global__ void fill_random_kernel(T* dst, std::int64_t n, std::uint64_t seed, float scale,
                                   float offset) {
  for (std::int64_t i = blockIdx.x * std::int64_t{blockDim.x} + threadIdx.x; i < n;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    // splitmix64 of (seed, i): counter based, so any element is computed on its own.
    std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * static_cast<std::uint64_t>(i + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    const float u = static_cast<float>(z >> 40) * (1.0f / 16777216.0f);
    dst[i] = from_f32<T>(offset + scale * (2.0f * u - 1.0f));
  }
}

template <typename From>
void convert_from(cudaStream_t stream, DType to, const From* src, void* dst, std::int64_t n) {
  switch (to) {
    case DType::f32:
      convert_kernel<<<blocks_for(n), threads, 0, stream>>>(src, static_cast<float*>(dst), n);
      break;
    case DType::f16:
      convert_kernel<<<blocks_for(n), threads, 0, stream>>>(src, static_cast<__half*>(dst), n);
      break;
    default:
      convert_kernel<<<blocks_for(n), threads, 0, stream>>>(src, static_cast<__nv_bfloat16*>(dst), n);
      break;
  }
}

}  // namespace

void launch_gelu(cudaStream_t stream, DType dt, void* x, std::int64_t n) {
  if (n == 0) return;
  if (dt == DType::f32) {
    gelu_kernel<<<blocks_for(n), threads, 0, stream>>>(static_cast<float*>(x), n);
  } else {
    gelu_kernel<<<blocks_for(n), threads, 0, stream>>>(static_cast<__nv_bfloat16*>(x), n);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_swiglu(cudaStream_t stream, DType dt, void* out, const void* gate_up,
                   std::int64_t rows, std::int64_t inner) {
  const std::int64_t n = rows * inner;
  if (n == 0) return;
  if (dt == DType::f32) {
    launch_swiglu_typed(stream, static_cast<float*>(out), static_cast<const float*>(gate_up), rows,
                        inner);
  } else {
    launch_swiglu_typed(stream, static_cast<__nv_bfloat16*>(out),
                        static_cast<const __nv_bfloat16*>(gate_up), rows, inner);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_gather_rows(cudaStream_t stream, DType dt, void* out, const void* x,
                        const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim) {
  if (num_rows == 0) return;
  if (dt == DType::f32) {
    gather_rows_kernel<<<num_rows, threads, 0, stream>>>(static_cast<float*>(out),
                                                         static_cast<const float*>(x), rows, dim);
  } else {
    gather_rows_kernel<<<num_rows, threads, 0, stream>>>(
        static_cast<__nv_bfloat16*>(out), static_cast<const __nv_bfloat16*>(x), rows, dim);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_convert(cudaStream_t stream, DType from, DType to, const void* src, void* dst,
                    std::int64_t n) {
  if (n == 0) return;
  switch (from) {
    case DType::f32: convert_from(stream, to, static_cast<const float*>(src), dst, n); break;
    case DType::f16: convert_from(stream, to, static_cast<const __half*>(src), dst, n); break;
    default: convert_from(stream, to, static_cast<const __nv_bfloat16*>(src), dst, n); break;
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

namespace {
// 32 x 32 tiles through shared memory (one column of padding against bank conflicts), so both
// the reads of src rows and the writes of dst rows are coalesced.
template <typename T>
__global__ void transpose_kernel(const T* __restrict__ src, T* __restrict__ dst, std::int64_t k,
                                 std::int64_t n) {
  __shared__ T tile[32][33];
  const std::int64_t n0 = static_cast<std::int64_t>(blockIdx.x) * 32, k0 = static_cast<std::int64_t>(blockIdx.y) * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const std::int64_t i = k0 + r, j = n0 + threadIdx.x;
    if (i < k && j < n) tile[r][threadIdx.x] = src[i * n + j];
  }
  __syncthreads();
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const std::int64_t j = n0 + r, i = k0 + threadIdx.x;
    if (i < k && j < n) dst[j * k + i] = tile[threadIdx.x][r];
  }
}
}  // namespace

void launch_transpose(cudaStream_t stream, std::size_t elem_bytes, const void* src, void* dst,
                      std::int64_t k, std::int64_t n) {
  if (k == 0 || n == 0) return;
  const dim3 grid(static_cast<unsigned>((n + 31) / 32), static_cast<unsigned>((k + 31) / 32)), block(32, 8);
  if (elem_bytes == 4)
    transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint32_t*>(src), static_cast<std::uint32_t*>(dst), k, n);
  else
    transpose_kernel<<<grid, block, 0, stream>>>(static_cast<const std::uint16_t*>(src), static_cast<std::uint16_t*>(dst), k, n);
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_fill_random(cudaStream_t stream, DType dt, void* dst, std::int64_t n,
                        std::uint64_t seed, float scale, float offset) {
  if (n == 0) return;
  if (dt == DType::f32) {
    fill_random_kernel<<<blocks_for(n), threads, 0, stream>>>(static_cast<float*>(dst), n, seed,
                                                              scale, offset);
  } else {
    fill_random_kernel<<<blocks_for(n), threads, 0, stream>>>(static_cast<__nv_bfloat16*>(dst), n,
                                                              seed, scale, offset);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
