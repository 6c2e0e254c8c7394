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
// Many rows (prompt chunks, head_dim 64 or 128): qk_transform_store_rows_kernel, one warp a row's
// 4 consecutive heads, grid (rows, ceil(heads / 16)) of 4 warps. One head a warp paid a whole
// dependent chain (metadata, the head's loads, the norm's reduction, the RoPE angles from the
// parameter bank at 32 addresses, the stores) for 256 bytes: a 16384-token Qwen3-1.7B chunk took
// 429 us a layer for 134 MB (0.3 TB/s; 14% of the chunk, docs/benchmarks.md, issue 10). Here the
// norm weights and the row's cos/sin are computed before the dependency wait and once for 4
// heads, the 4 heads' loads are in flight together, and each lane owns elements l + 32 j as
// transform_head does (transform_lane: the same sums in the same order, the same roundings), so
// both kernels write the same bits. Measured (H200, docs/benchmarks.md, issue 10, 2026-12-04):
// 429 -> 178 us a layer on that chunk; serving 1.7B 128 at once +1.4% with 16384-token steps,
// +4% with 2048-token ones. XSERV_CUDA_QK_ROWS=N: launches of N rows or more take it (default
// 257: above batched decode's 256, where taking it too measured -1.5% at 64 rows and +0.1-0.9%
// at 128; 0: never).
#include <cstdlib>

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

constexpr int rows_warps = 4, rows_heads = 4;  // qk_transform_store_rows_kernel: warps, heads a warp

template <typename T, int D>
__global__ void __launch_bounds__(rows_warps * 32) qk_transform_store_rows_kernel(const QkTransformParams p) {
  constexpr int per_lane = D / 32, pairs = D / 64;
  const int row = blockIdx.x, lane = threadIdx.x & 31;
  const int first = (blockIdx.y * rows_warps + static_cast<int>(threadIdx.x >> 5)) * rows_heads;
  // Everything that no kernel of this forward writes, before the wait: the batch metadata, the
  // norm weights, the row's rotation.
  const std::int64_t slot = p.slot_mapping[row];
  const float pos = static_cast<float>(p.positions[row]);
  const T* q_norm = static_cast<const T*>(p.q_norm);
  const T* k_norm = static_cast<const T*>(p.k_norm);
  float wq[per_lane], wk[per_lane], c[pairs], s[pairs];
#pragma unroll
  for (int j = 0; j < per_lane; ++j) {
    wq[j] = q_norm != nullptr ? to_f32(q_norm[lane + 32 * j]) : 0.0f;
    wk[j] = k_norm != nullptr ? to_f32(k_norm[lane + 32 * j]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < pairs; ++j) {
    const float angle = p.rope ? pos * p.inv_freq[lane + 32 * j] : 0.0f;  // as transform_head
    c[j] = cosf(angle);
    s[j] = sinf(angle);
  }
  grid_dependency_wait();  // qkv is the previous kernel's output
  const int total = p.n_q_heads + 2 * p.n_kv_heads;
  const int heads = min(rows_heads, total - first);
  if (heads <= 0) return;
  T* qkv_row = static_cast<T*>(p.qkv) + static_cast<std::int64_t>(row) * p.qkv_stride;
  float x[rows_heads][per_lane];
#pragma unroll
  for (int h = 0; h < rows_heads; ++h)
#pragma unroll
    for (int j = 0; j < per_lane; ++j)
      x[h][j] = h < heads ? to_f32(qkv_row[static_cast<std::int64_t>(first + h) * D + lane + 32 * j]) : 0.0f;
#pragma unroll
  for (int h = 0; h < rows_heads; ++h) {
    if (h >= heads) break;
    const int head = first + h;
    T* dst = qkv_row + static_cast<std::int64_t>(head) * D;
    if (head >= p.n_q_heads + p.n_kv_heads) {  // v: straight to the cache
      dst = static_cast<T*>(p.v_cache) + (slot * p.n_kv_heads + head - p.n_q_heads - p.n_kv_heads) * D;
    } else {
      const bool is_q = head < p.n_q_heads;
      const bool norm = (is_q ? q_norm : k_norm) != nullptr;
      if (is_q && !norm && !p.rope) continue;  // GPT-2: q stays as the GEMM wrote it
      if (!is_q) dst = static_cast<T*>(p.k_cache) + (slot * p.n_kv_heads + head - p.n_q_heads) * D;
      transform_lane<T, D>(x[h], is_q ? wq : wk, c, s, norm, p.rope, p.norm_eps);
    }
#pragma unroll
    for (int j = 0; j < per_lane; ++j) dst[lane + 32 * j] = from_f32<T>(x[h][j]);
  }
}

// Launches of this many rows or more take the rows kernel (XSERV_CUDA_QK_ROWS; 0: never).
std::int64_t qk_rows_from() {
  static const std::int64_t from = [] {
    const char* env = std::getenv("XSERV_CUDA_QK_ROWS");
    return env != nullptr ? std::atoll(env) : std::int64_t{257};
  }();
  return from;
}

template <typename T>
void launch_typed(cudaStream_t stream, const QkTransformParams& p, bool rows_kernel) {
  const int total = p.n_q_heads + 2 * p.n_kv_heads;
  if (rows_kernel) {
    const dim3 grid(p.rows, (total + rows_warps * rows_heads - 1) / (rows_warps * rows_heads));
    if (p.head_dim == 128) launch_pdl(qk_transform_store_rows_kernel<T, 128>, grid, dim3(rows_warps * 32), 0, stream, p);
    else launch_pdl(qk_transform_store_rows_kernel<T, 64>, grid, dim3(rows_warps * 32), 0, stream, p);
    return;
  }
  const dim3 grid(p.rows, (total + warps - 1) / warps);
  launch_pdl(qk_transform_store_kernel<T>, grid, dim3(warps * 32), 0, stream, p);
}

}  // namespace

void launch_qk_transform_store(cudaStream_t stream, DType dt, const QkTransformParams& p, bool rows_kernel) {
  if (p.rows == 0) return;
  rows_kernel = rows_kernel && (p.head_dim == 64 || p.head_dim == 128);
  if (dt == DType::f32) launch_typed<float>(stream, p, rows_kernel);
  else launch_typed<__nv_bfloat16>(stream, p, rows_kernel);
}

void launch_qk_transform_store(cudaStream_t stream, DType dt, const QkTransformParams& p) {
  const std::int64_t from = qk_rows_from();
  launch_qk_transform_store(stream, dt, p, from > 0 && p.rows >= from);
}

}  // namespace xserv::cuda
