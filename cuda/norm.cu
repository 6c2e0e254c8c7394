// LayerNorm and RMSNorm over the last dim, with the fused residual add of pre-norm blocks.
// Layout: x, residual, out [rows, dim] row-major in the activation dtype; weight, bias [dim].
// With a residual: residual = residual + x (stored in the activation dtype), then the stored
// value is normalised, so the next block adds onto exactly what was normalised here.
// Launch: one block per row. Rows of up to 1024 * kPerThread elements (every model xserv
// runs) are held in registers: each thread first issues all of its loads (x, then the
// residual), so they are in flight together, and only then computes and stores. The earlier
// loop form interleaved residual stores with the next loads, which the compiler could not
// reorder (the pointers may alias), making a chain of dependent global-memory round trips
// (~14 us for one 4096-wide row at decode; now a couple of us). Longer rows fall back to the
// strided loop. Statistics in f32, two-pass for the LayerNorm variance.
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

template <typename T, bool Rms>
__global__ void norm_kernel(T* out, const T* x, T* residual, const T* weight, const T* bias,
                            float eps, std::int64_t dim) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  allow_dependents();  // a following GEMV may start loading its weights
  const T* xr = x + row * dim;
  T* rr = residual ? residual + row * dim : nullptr;
  T* o = out + row * dim;

  float sum = 0.0f;
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = to_f32(xr[i]);
    if (rr) {
      const T stored = from_f32<T>(to_f32(rr[i]) + v);
      rr[i] = stored;
      v = to_f32(stored);
    }
    sum += Rms ? v * v : v;
  }
  const T* src = rr ? rr : xr;
  float mean = 0.0f, rstd;
  if constexpr (Rms) {
    rstd = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
  } else {
    mean = block_sum(sum, scratch) / static_cast<float>(dim);
    float sq = 0.0f;
    for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
      const float d = to_f32(src[i]) - mean;
      sq += d * d;
    }
    rstd = rsqrtf(block_sum(sq, scratch) / static_cast<float>(dim) + eps);
  }
  for (std::int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = (to_f32(src[i]) - mean) * rstd;
    if constexpr (Rms) {
      // HF's Qwen3RMSNorm rounds the normalised value to the activation dtype before the weight.
      v = to_f32(from_f32<T>(v)) * to_f32(weight[i]);
    } else {
      v = v * to_f32(weight[i]) + (bias ? to_f32(bias[i]) : 0.0f);
    }
    o[i] = from_f32<T>(v);
  }
}

constexpr int kPerThread = 8;

// pdl (small_kernels_pdl, XSERV_CUDA_SMALL_PDL; on by default): launched early beside the kernel before it;
// the weight (and bias) loads go out first, then grid_dependency_wait, then x.
template <typename T, bool Rms>
__global__ void norm_registers_kernel(T* out, const T* x, T* residual, const T* weight,
                                      const T* bias, float eps, int dim, bool pdl) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const T* xr = x + row * dim;
  T* rr = residual ? residual + row * dim : nullptr;
  T* o = out + row * dim;
  float wk[kPerThread], bk[kPerThread];
  auto load_weights = [&] {
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      wk[k] = i < dim ? to_f32(weight[i]) : 0.0f;
      bk[k] = !Rms && bias && i < dim ? to_f32(bias[i]) : 0.0f;
    }
  };
  if (pdl) {
    load_weights();
    grid_dependency_wait();  // x is the previous kernel's output; lets the next kernel launch
  } else {
    allow_dependents();  // a following GEMV may start loading its weights
  }

  float v[kPerThread];
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    v[k] = i < dim ? to_f32(xr[i]) : 0.0f;
  }
  if (rr) {
    float r[kPerThread];
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      r[k] = i < dim ? to_f32(rr[i]) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      // Stored in the activation dtype; normalise exactly what is stored.
      const T stored = from_f32<T>(r[k] + v[k]);
      v[k] = i < dim ? to_f32(stored) : 0.0f;
      if (i < dim) rr[i] = stored;
    }
  }
  // The weight (and bias) loads go out before the reductions, not after: one memory round
  // trip less on the path of a latency-bound kernel (a batched decode step runs two per layer).
  if (!pdl) load_weights();
  float sum = 0.0f;
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) sum += Rms ? v[k] * v[k] : v[k];
  float mean = 0.0f, rstd;
  if constexpr (Rms) {
    rstd = rsqrtf(block_sum(sum, scratch) / static_cast<float>(dim) + eps);
  } else {
    mean = block_sum(sum, scratch) / static_cast<float>(dim);
    float sq = 0.0f;
#pragma unroll
    for (int k = 0; k < kPerThread; ++k) {
      const int i = threadIdx.x + k * blockDim.x;
      const float d = i < dim ? v[k] - mean : 0.0f;
      sq += d * d;
    }
    rstd = rsqrtf(block_sum(sq, scratch) / static_cast<float>(dim) + eps);
  }
#pragma unroll
  for (int k = 0; k < kPerThread; ++k) {
    const int i = threadIdx.x + k * blockDim.x;
    if (i >= dim) break;
    float y = (v[k] - mean) * rstd;
    if constexpr (Rms) {
      y = to_f32(from_f32<T>(y)) * wk[k];  // HF rounds before the weight
    } else {
      y = y * wk[k] + bk[k];
    }
    o[i] = from_f32<T>(y);
  }
}

template <typename T>
void launch_typed(cudaStream_t stream, bool rms, void* out, const void* x, void* residual,
                  const void* weight, const void* bias, float eps, std::int64_t rows,
                  std::int64_t dim) {
  auto* o = static_cast<T*>(out);
  auto* xi = static_cast<const T*>(x);
  auto* r = static_cast<T*>(residual);
  auto* w = static_cast<const T*>(weight);
  auto* b = static_cast<const T*>(bias);
  // Whole warps, enough threads for kPerThread elements each.
  const std::int64_t reg_threads = (dim + kPerThread * 32 - 1) / (kPerThread * 32) * 32;
  if (reg_threads <= 1024) {
    const int threads = static_cast<int>(reg_threads);
    const int d = static_cast<int>(dim);
    const bool pdl = small_kernels_pdl();
    const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(threads));
    if (rms) {
      launch_kernel(pdl, norm_registers_kernel<T, true>, grid, block, 0, stream, o, xi, r, w, b, eps, d, pdl);
    } else {
      launch_kernel(pdl, norm_registers_kernel<T, false>, grid, block, 0, stream, o, xi, r, w, b, eps, d, pdl);
    }
    return;
  }
  const int threads = 1024;
  if (rms) {
    norm_kernel<T, true><<<rows, threads, 0, stream>>>(o, xi, r, w, b, eps, dim);
  } else {
    norm_kernel<T, false><<<rows, threads, 0, stream>>>(o, xi, r, w, b, eps, dim);
  }
}

// launch_residual_rms_norm: one block a row, 8 consecutive columns a thread (dim / 8 threads, at
// most 1024): the thread's x, norm weight and partials are 16-byte loads, all issued before the
// sums. Launched with PDL after the cuBLASLt GEMM that wrote the partials: x and the weight
// (written by no kernel of this GEMM) are read before grid_dependency_wait.
template <typename T>
__global__ void residual_rms_norm_kernel(T* x, T* h, const float* partials, int splits, const T* weight,
                                         float eps, int dim, std::int64_t part_stride) {
  __shared__ float scratch[32];
  const std::int64_t row = blockIdx.x;
  const int c = threadIdx.x * 8;
  float v[8], w[8];
  load_f32<T, 8>(x + row * dim + c, v);
  load_f32<T, 8>(weight + c, w);
  grid_dependency_wait();
  const float* part = partials + row * dim + c;
  float sum[8];
  {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(part));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(part + 4));
    sum[0] = a.x, sum[1] = a.y, sum[2] = a.z, sum[3] = a.w, sum[4] = b.x, sum[5] = b.y, sum[6] = b.z, sum[7] = b.w;
  }
  for (int s = 1; s < splits; ++s) {
    const float4 a = __ldcg(reinterpret_cast<const float4*>(part + s * part_stride));
    const float4 b = __ldcg(reinterpret_cast<const float4*>(part + s * part_stride + 4));
    sum[0] += a.x, sum[1] += a.y, sum[2] += a.z, sum[3] += a.w;
    sum[4] += b.x, sum[5] += b.y, sum[6] += b.z, sum[7] += b.w;
  }
  float sq = 0.0f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    v[i] = to_f32(from_f32<T>(sum[i] + v[i]));  // the stored residual, normalised as stored
    sq += v[i] * v[i];
  }
  store_f32<T, 8>(x + row * dim + c, v);
  const float rstd = rsqrtf(block_sum(sq, scratch) / static_cast<float>(dim) + eps);
  float y[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) y[i] = to_f32(from_f32<T>(v[i] * rstd)) * w[i];  // HF rounds before the weight
  store_f32<T, 8>(h + row * dim + c, y);
}

}  // namespace

bool residual_rms_norm_supported(std::int64_t dim, const void* x, const void* h, const void* weight) noexcept {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return dim > 0 && dim % 256 == 0 && dim <= 8 * 1024 && aligned(x) && aligned(h) && aligned(weight);
}

void launch_residual_rms_norm(cudaStream_t stream, DType dt, void* x, void* h, const float* partials, int splits,
                              const void* weight, float eps, std::int64_t rows, std::int64_t dim) {
  if (rows == 0) return;
  const dim3 grid(static_cast<unsigned>(rows)), block(static_cast<unsigned>(dim / 8));
  const int d = static_cast<int>(dim);
  const std::int64_t stride = rows * dim;
  if (dt == DType::f32) {
    launch_pdl(residual_rms_norm_kernel<float>, grid, block, 0, stream, static_cast<float*>(x), static_cast<float*>(h),
               partials, splits, static_cast<const float*>(weight), eps, d, stride);
  } else {
    launch_pdl(residual_rms_norm_kernel<__nv_bfloat16>, grid, block, 0, stream, static_cast<__nv_bfloat16*>(x),
               static_cast<__nv_bfloat16*>(h), partials, splits, static_cast<const __nv_bfloat16*>(weight), eps, d,
               stride);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_norm(cudaStream_t stream, DType dt, bool rms, void* out, const void* x,
                 void* residual, const void* weight, const void* bias, float eps,
                 std::int64_t rows, std::int64_t dim) {
  if (rows == 0) return;
  if (dt == DType::f32) {
    launch_typed<float>(stream, rms, out, x, residual, weight, bias, eps, rows, dim);
  } else {
    launch_typed<__nv_bfloat16>(stream, rms, out, x, residual, weight, bias, eps, rows, dim);
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
