// What both sampling kernels (sampling.cu, sampling_topk.cu) share, written once so the two paths
// cannot drift apart: what they do to a logit before ranking it (penalties from the counts table,
// repetition: HF semantics over prompt + output; presence/frequency: OpenAI over output; then
// temperature as a division, as the CPU backend does: same rounding), and the warp scan their
// radix passes use to find a digit's bin.
#pragma once

#include <cstdint>

#include "cuda/kernels.hpp"

namespace xserv::cuda {

// cnt: the row's counts (bit 31: seen in prompt or output; low bits: times in output), or null
// when the row has no penalty.
__device__ __forceinline__ float adjusted_logit(float v, const std::uint32_t* cnt, int i,
                                                const SamplingRowParams& prm, bool greedy) {
  if (cnt) {
    const std::uint32_t c = cnt[i];
    if ((c >> 31) && prm.repetition_penalty != 1.0f)
      v = v < 0.0f ? v * prm.repetition_penalty : v / prm.repetition_penalty;
    const float n = static_cast<float>(c & 0x7fffffffu);
    if (n > 0.0f) v -= prm.frequency_penalty * n + prm.presence_penalty;
  }
  if (!greedy) v /= prm.temperature;
  return v;
}

// The inclusive sum of v over lanes 0..lane of the warp (all 32 lanes call it).
template <typename T>
__device__ __forceinline__ T warp_inclusive_sum(T v, int lane) {
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const T up = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += up;
  }
  return v;
}

}  // namespace xserv::cuda
