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

// src -> dst (global or shared, D = p.head_dim elements); `stage` is the warp's D floats of
// shared memory; norm null: no RMSNorm. Every lane of the warp calls it.
template <typename T>
__device__ __forceinline__ void transform_head(const QkTransformParams& p, const T* src, T* dst,
                                               float* stage, const T* norm, float pos, int lane) {
  const int D = p.head_dim;
  float sq = 0.0f;
  for (int i = lane; i < D; i += 32) {
    const float v = to_f32(src[i]);
    stage[i] = v;
    sq += v * v;
  }
  if (norm) {
    const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(D) + p.norm_eps);
    for (int i = lane; i < D; i += 32)
      stage[i] = to_f32(from_f32<T>(to_f32(from_f32<T>(stage[i] * rstd)) * to_f32(norm[i])));
  }
  __syncwarp();
  if (p.rope) {
    const int half = D / 2;
    for (int i = lane; i < half; i += 32) {
      const float angle = pos * p.inv_freq[i];
      const float c = cosf(angle), sn = sinf(angle);
      const float x1 = stage[i], x2 = stage[i + half];
      dst[i] = from_f32<T>(x1 * c - x2 * sn);
      dst[i + half] = from_f32<T>(x2 * c + x1 * sn);
    }
  } else {
    for (int i = lane; i < D; i += 32) dst[i] = from_f32<T>(stage[i]);
  }
  __syncwarp();  // the warp's next head reuses the stage
}

}  // namespace xserv::cuda
