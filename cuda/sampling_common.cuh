// What both sampling kernels (sampling.cu, sampling_topk.cu) do to a logit before ranking it,
// written once so the two paths cannot drift apart: penalties from the counts table (repetition:
// HF semantics over prompt + output; presence/frequency: OpenAI over output), then temperature as
// a division, as the CPU backend does (same rounding).
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

}  // namespace xserv::cuda
