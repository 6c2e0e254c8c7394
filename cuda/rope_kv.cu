// The fused attention prologue: per-head RMSNorm of q and k (Qwen3's q_norm/k_norm), neox RoPE
// at each row's position, and the write of k and v into the paged KV cache at the row's slot.
// Layout: qkv [rows, qkv_stride] holds n_q q heads, then n_kv k heads, then n_kv v heads of
// head_dim each; q is transformed in place (attention reads it there), k and v go to
// k_cache/v_cache [slots, n_kv_heads, head_dim] (slot = block * block_size + offset, so the
// [num_blocks, block_size, ...] pool is addressed linearly).
// RoPE follows HF: inv_freq computed on the host in f32, angle = f32(position) * inv_freq[i],
// cosf/sinf in f32, out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i + D/2] cos + x[i] sin.
// Launch: grid (rows, ceil(heads / 8)), 8 warps, one head per warp (a decode step spreads its
// heads over several SMs); a head's values are staged in shared memory so the rotation can pair
// any two lanes. The per-head transform is cuda/qk_transform.cuh (shared with the fused decode
// attention).
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/qk_transform.cuh"

namespace xserv::cuda {
namespace {

constexpr int warps = 8;

template <typename T>
__global__ void qk_transform_store_kernel(const QkTransformParams p) {
  __shared__ float stage[warps][max_head_dim];
  const int row = blockIdx.x;
  // The batch metadata (uploaded before the forward, written by no kernel) before the wait.
  const std::int64_t slot = p.slot_mapping[row];
  const float pos = static_cast<float>(p.positions[row]);
  grid_dependency_wait();  // launched early (launch_pdl): qkv is the previous kernel's output
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int D = p.head_dim;
  T* qkv_row = static_cast<T*>(p.qkv) + static_cast<std::int64_t>(row) * p.qkv_stride;
  const int total = p.n_q_heads + 2 * p.n_kv_heads;
  float* s = stage[warp];

  for (int head = blockIdx.y * warps + warp; head < total; head += warps * gridDim.y) {
    T* src = qkv_row + static_cast<std::int64_t>(head) * D;
    if (head >= p.n_q_heads + p.n_kv_heads) {  // v: straight to the cache
      const int kvh = head - p.n_q_heads - p.n_kv_heads;
      T* dst = static_cast<T*>(p.v_cache) + (slot * p.n_kv_heads + kvh) * D;
      for (int i = lane; i < D; i += 32) dst[i] = src[i];
      continue;
    }
    const bool is_q = head < p.n_q_heads;
    const T* norm = static_cast<const T*>(is_q ? p.q_norm : p.k_norm);
    if (is_q && !norm && !p.rope) continue;  // GPT-2: q stays as the GEMM wrote it
    T* dst = src;
    if (!is_q) {
      const int kvh = head - p.n_q_heads;
      dst = static_cast<T*>(p.k_cache) + (slot * p.n_kv_heads + kvh) * D;
    }
    transform_head<T>(p, src, dst, s, norm, pos, lane);
  }
}

}  // namespace

void launch_qk_transform_store(cudaStream_t stream, DType dt, const QkTransformParams& p) {
  if (p.rows == 0) return;
  const dim3 grid(p.rows, (p.n_q_heads + 2 * p.n_kv_heads + warps - 1) / warps);
  if (dt == DType::f32) {
    launch_pdl(qk_transform_store_kernel<float>, grid, dim3(warps * 32), 0, stream, p);
  } else {
    launch_pdl(qk_transform_store_kernel<__nv_bfloat16>, grid, dim3(warps * 32), 0, stream, p);
  }
}

}  // namespace xserv::cuda
