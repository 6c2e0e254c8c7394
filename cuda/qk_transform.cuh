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
// Lane l owns elements l, l + 32, ...; the sums run in that order, as before. The fused
// multiply-adds are written out (__fmaf_rn / __fmul_rn) so transform_lane below rounds exactly
// as this does whatever the compiler would contract in either context.
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
      if (lane + 32 * j < D) sq = __fmaf_rn(x[j], x[j], sq);
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
        dst[i] = from_f32<T>(__fmaf_rn(x1, c, -__fmul_rn(x2, sn)));
        dst[i + half] = from_f32<T>(__fmaf_rn(x2, c, __fmul_rn(x1, sn)));
      }
    }
  } else {
#pragma unroll
    for (int j = 0; j < per_lane; ++j)
      if (lane + 32 * j < D) dst[lane + 32 * j] = from_f32<T>(x[j]);
  }
  __syncwarp();  // the warp's next head reuses the stage
}

// The same transform for a compile-time head_dim D of 64 or 128 with its per-lane inputs given
// (the fused short-context decode attention loads the norm weights and computes the RoPE
// cos/sin before its grid_dependency_wait, so only x arrives after it). Lane l owns elements
// l + 32 j, j < D / 32, as transform_head; with D / 2 a multiple of 32 the rotation partner of
// element l + 32 j (j < D / 64) is l + 32 (j + D / 64), held by the same lane, so no staging in
// shared memory is needed. Same sums in the same order, same roundings: the results equal
// transform_head's. w: the norm weights (unused when !norm); c, s: cos and sin of
// pos * inv_freq[l + 32 j] (unused when !rope). x in, the rounded outputs (in f32) out.
template <typename T, int D>
__device__ __forceinline__ void transform_lane(float (&x)[D / 32], const float (&w)[D / 32],
                                               const float (&c)[D / 64], const float (&s)[D / 64],
                                               bool norm, bool rope, float eps) {
  constexpr int per_lane = D / 32, pairs = D / 64;
  static_assert(D == 64 || D == 128, "rotation pairs within a lane");
  if (norm) {
    float sq = 0.0f;
#pragma unroll
    for (int j = 0; j < per_lane; ++j) sq = __fmaf_rn(x[j], x[j], sq);
    const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(D) + eps);
#pragma unroll
    for (int j = 0; j < per_lane; ++j) x[j] = to_f32(from_f32<T>(to_f32(from_f32<T>(x[j] * rstd)) * w[j]));
  }
  if (rope) {
#pragma unroll
    for (int j = 0; j < pairs; ++j) {
      const float x1 = x[j], x2 = x[j + pairs];
      x[j] = to_f32(from_f32<T>(__fmaf_rn(x1, c[j], -__fmul_rn(x2, s[j]))));
      x[j + pairs] = to_f32(from_f32<T>(__fmaf_rn(x2, c[j], __fmul_rn(x1, s[j]))));
    }
  } else {
#pragma unroll
    for (int j = 0; j < per_lane; ++j) x[j] = to_f32(from_f32<T>(x[j]));
  }
}

}  // namespace xserv::cuda
