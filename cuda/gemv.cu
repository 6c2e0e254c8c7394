// Skinny GEMM for decode: out[m, n] = sum_k a[m, k] W[n, k] (+ bias[n]) (+ beta * out[m, n]) for
// M <= 8 rows, bf16 activations and a bf16 weight in torch.nn.Linear layout [N, K].
// With a handful of rows the product is bound by reading W once, so the kernel is built around
// that stream: each warp owns one output column n and walks W's row n with 16-byte loads that
// bypass L1 (every weight byte is read once), four loads in flight per lane; the M activation
// rows are small and re-read from L1/L2. f32 accumulation, one warp reduction per row at the end.
// Launch: 256 threads (8 warps, 8 consecutive columns) per block, grid ceil(N / 8).
// Requires K % 8 == 0 and 16-byte aligned a and W (the caller falls back to cuBLASLt otherwise).
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

using bf16 = __nv_bfloat16;
constexpr int warps = 8;

__device__ __forceinline__ uint4 load_stream(const bf16* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ void unpack(uint4 v, float (&f)[8]) {
  const auto* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(h[i]);
    f[2 * i] = x.x;
    f[2 * i + 1] = x.y;
  }
}

template <int M, typename OutT>
__global__ void __launch_bounds__(warps * 32) gemv_kernel(OutT* out, std::int64_t ldo, const bf16* a,
                                                          const bf16* w, const bf16* bias,
                                                          float beta, int n, int k) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int col = blockIdx.x * warps + warp;
  if (col >= n) return;
  const bf16* wr = w + static_cast<std::int64_t>(col) * k;
  float acc[M];
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = 0.0f;
  constexpr int step = 32 * 8;  // elements a warp covers per load
  int k0 = lane * 8;
  // Main loop: four independent 16-byte weight loads per lane before any arithmetic.
  for (; k0 + 3 * step < k; k0 += 4 * step) {
    uint4 wv[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) wv[u] = load_stream(wr + k0 + u * step);
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      float wf[8];
      unpack(wv[u], wf);
#pragma unroll
      for (int m = 0; m < M; ++m) {
        float af[8];
        unpack(*reinterpret_cast<const uint4*>(a + static_cast<std::int64_t>(m) * k + k0 + u * step), af);
#pragma unroll
        for (int i = 0; i < 8; ++i) acc[m] += wf[i] * af[i];
      }
    }
  }
  for (; k0 < k; k0 += step) {
    float wf[8];
    unpack(load_stream(wr + k0), wf);
#pragma unroll
    for (int m = 0; m < M; ++m) {
      float af[8];
      unpack(*reinterpret_cast<const uint4*>(a + static_cast<std::int64_t>(m) * k + k0), af);
#pragma unroll
      for (int i = 0; i < 8; ++i) acc[m] += wf[i] * af[i];
    }
  }
#pragma unroll
  for (int m = 0; m < M; ++m) acc[m] = warp_sum(acc[m]);
  if (lane == 0) {
    const float b = bias ? __bfloat162float(bias[col]) : 0.0f;
#pragma unroll
    for (int m = 0; m < M; ++m) {
      OutT* o = out + static_cast<std::int64_t>(m) * ldo + col;
      float v = acc[m] + b;
      if (beta != 0.0f) v += beta * to_f32(*o);
      *o = from_f32<OutT>(v);
    }
  }
}

template <typename OutT>
void launch_typed(cudaStream_t stream, OutT* out, std::int64_t ldo, const bf16* a, const bf16* w,
                  const bf16* bias, float beta, int m, int n, int k) {
  const dim3 grid((n + warps - 1) / warps);
  switch (m) {
#define XSERV_GEMV_CASE(M) \
  case M: gemv_kernel<M, OutT><<<grid, warps * 32, 0, stream>>>(out, ldo, a, w, bias, beta, n, k); break;
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

bool gemv_supported(std::int64_t m, std::int64_t k, const void* a, const void* w) noexcept {
  const auto aligned = [](const void* p) { return reinterpret_cast<std::uintptr_t>(p) % 16 == 0; };
  return m >= 1 && m <= max_gemv_rows && k % 8 == 0 && k > 0 && aligned(a) && aligned(w);
}

void launch_gemv(cudaStream_t stream, DType out_dt, void* out, std::int64_t ldo, const void* a,
                 const void* w, const void* bias, float beta, std::int64_t m, std::int64_t n,
                 std::int64_t k) {
  if (m == 0 || n == 0) return;
  const auto* ab = static_cast<const bf16*>(a);
  const auto* wb = static_cast<const bf16*>(w);
  const auto* bb = static_cast<const bf16*>(bias);
  if (out_dt == DType::f32) {
    launch_typed(stream, static_cast<float*>(out), ldo, ab, wb, bb, beta, static_cast<int>(m),
                 static_cast<int>(n), static_cast<int>(k));
  } else {
    launch_typed(stream, static_cast<bf16*>(out), ldo, ab, wb, bb, beta, static_cast<int>(m),
                 static_cast<int>(n), static_cast<int>(k));
  }
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
