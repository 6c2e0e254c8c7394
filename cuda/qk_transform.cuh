// One head of the attention prologue (Qwen3's per-head q/k RMSNorm and neox RoPE), by one warp:
// shared by qk_transform_store (rope_kv.cu) and the fused decode attention (attention_decode.cu)
// so both round the same way: the normalised value rounded to the dtype before and after the
// weight (HF's RMSNorm), the rotated value rounded once. RoPE as in rope_kv.cu: angle =
// f32(position) * inv_freq[i], out[i] = x[i] cos - x[i + D/2] sin, out[i + D/2] = x[i + D/2] cos
// + x[i] sin.
#pragma once

#include "cuda/common.cuh"
#include "cuda/kernels.hpp"

namespace xserv::cuda {

// src -> dst (global or shared, D = p.head_dim <= max_head_dim elements); `stage` is the warp's
// D floats of shared memory; norm null: no RMSNorm. Every lane of the warp calls it.
// Every global load of the head (its values, the norm weights, the RoPE frequencies) is issued
// first, into registers, so the transform waits for one round trip instead of three in a row: it
// sits on the critical path of a decode layer (qk_transform_store, or the fused decode attention).
// Lane l owns elements l, l + 32, ...; the sums run in that order, as before.
template <typename T>
__device__ __forceinline__ void transform_head(const QkTransformParams& p, const T* src, T* dst,
                                               float* stage, const T* norm, float pos, int lane) {
  constexpr int per_lane = max_head_dim / 32;
  const int D = p.head_dim, half = D / 2;
  float x[per_lane], w[per_lane], freq[per_lane / 2];
#pragma unroll
  for (int j = 0; j < per_lane; ++j) {
    const int i = lane + 32 * j;
    x[j] = i < D ? to_f32(src[i]) : 0.0f;
    w[j] = norm != nullptr && i < D ? to_f32(norm[i]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < per_lane / 2; ++j) {
    const int i = lane + 32 * j;
    freq[j] = p.rope && i < half ? p.inv_freq[i] : 0.0f;
  }
  if (norm) {
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < per_lane; ++j)
      if (lane + 32 * j < D) sq += x[j] * x[j];
    const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(D) + p.norm_eps);
#pragma unroll
    for (int j = 0; j < per_lane; ++j) x[j] = to_f32(from_f32<T>(to_f32(from_f32<T>(x[j] * rstd)) * w[j]));
  }
  if (p.rope) {
#pragma unroll
    for (int j = 0; j < per_lane; ++j)
      if (lane + 32 * j < D) stage[lane + 32 * j] = x[j];
    __syncwarp();  // the rotation pairs element i with i + D/2, held by another lane or iteration
#pragma unroll
    for (int j = 0; j < per_lane / 2; ++j) {
      const int i = lane + 32 * j;
      if (i < half) {
        const float angle = pos * freq[j];
        const float c = cosf(angle), sn = sinf(angle);
        const float x1 = stage[i], x2 = stage[i + half];
        dst[i] = from_f32<T>(x1 * c - x2 * sn);
        dst[i + half] = from_f32<T>(x2 * c + x1 * sn);
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < per_lane; ++j)
      if (lane + 32 * j < D) dst[lane + 32 * j] = from_f32<T>(x[j]);
  }
  __syncwarp();  // the warp's next head reuses the stage
}

}  // namespace xserv::cuda
