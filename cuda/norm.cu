// LayerNorm and RMSNorm over the last dim, with the fused residual add of pre-norm blocks.
// Layout: x, residual, out [rows, dim] row-major in the activation dtype; weight, bias [dim].
// With a residual: residual = residual + x (stored in the activation dtype), then the stored
// value is normalised, so the next block adds onto exactly what was normalised here.
// Launch: one block of 256 threads per row; the row is read three times, from L1/L2 after the
// first (a row is at most tens of KB), statistics in f32, two-pass for the LayerNorm variance.
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

template <typename T>
void launch_typed(cudaStream_t stream, bool rms, void* out, const void* x, void* residual,
                  const void* weight, const void* bias, float eps, std::int64_t rows,
                  std::int64_t dim) {
  const int threads = dim >= 1024 ? 256 : 128;
  auto* o = static_cast<T*>(out);
  auto* xi = static_cast<const T*>(x);
  auto* r = static_cast<T*>(residual);
  auto* w = static_cast<const T*>(weight);
  auto* b = static_cast<const T*>(bias);
  if (rms) {
    norm_kernel<T, true><<<rows, threads, 0, stream>>>(o, xi, r, w, b, eps, dim);
  } else {
    norm_kernel<T, false><<<rows, threads, 0, stream>>>(o, xi, r, w, b, eps, dim);
  }
}

}  // namespace

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
