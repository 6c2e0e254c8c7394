// Token sampling on the GPU: one block per logits row; only the chosen ids leave the device.
// Per row (logits [R, V] f32, modified in place like the CPU backend): penalties (repetition:
// HF over prompt + output; presence/frequency: OpenAI over output, from the counts table),
// temperature, then greedy argmax, or top-k, top-p, min-p and an inverse-CDF draw with the
// host-computed sampling_uniform(seed, step).
// Order: tokens are ranked by (probability desc, id asc), encoded as one 64-bit key
// (order-preserving float bits << 32 | ~id), so ties break exactly as on the CPU. Every filter
// keeps a prefix of that order, so each is a "find the key where a running total crosses a
// target" problem, solved by an 8-pass radix select over the key bytes (histogram of counts or
// of probability mass per byte value in shared memory), never a full sort of the vocabulary.
// Launch: grid R, 1024 threads; counts [R, V] (bit 31: token seen in prompt or output, low bits:
// times in output) is filled by token_counts_kernel (grid R, 256 threads) when a row penalises.
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/order_key.cuh"
#include "cuda/sampling_common.cuh"

namespace xserv::cuda {
namespace {

constexpr int threads = 1024;
using u64 = unsigned long long;


// Masses are summed in double (like the CPU backend): with thousands of kept tokens a float sum
// can move a draw across a boundary of the order, and then the id differs completely.
struct Shared {
  double bins[256];
  double scratch[32];
  u64 key_scratch[32];
  u64 prefix;
  double above;
};

// What a row keeps: keys >= floor whose weight exp(x - mx) is >= min_weight.
struct Keep {
  u64 floor;
  float mx;
  float min_weight;
};

__device__ __forceinline__ float weight_of(float x, float mx) { return expf(x - mx); }

// The key of the element at which the running total over kept elements in descending key order
// first reaches target (strict: exceeds it). Totals count elements (by_count) or mass.
__device__ u64 radix_select(const float* x, int vocab, const Keep& keep, bool by_count,
                            double target, bool strict, Shared& sh) {
  u64 prefix = 0, mask = 0;
  double above = 0.0;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int i = threadIdx.x; i < 256; i += blockDim.x) sh.bins[i] = 0.0;
    __syncthreads();
    for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
      const u64 key = order_key(x[i], i);
      if (key < keep.floor || (key & mask) != prefix) continue;
      const float w = weight_of(x[i], keep.mx);
      if (w < keep.min_weight) continue;
      atomicAdd(&sh.bins[(key >> shift) & 255], by_count ? 1.0 : static_cast<double>(w));
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      double run = above;
      int chosen = -1, last = -1;
      for (int d = 255; d >= 0; --d) {
        const double b = sh.bins[d];
        if (b <= 0.0) continue;
        last = d;
        const double next = run + b;
        if (strict ? next > target : next >= target) {
          chosen = d;
          break;
        }
        run = next;
      }
      if (chosen < 0) {  // rounding left the target just out of reach: take the last element
        chosen = last < 0 ? 0 : last;
        run = above;
        for (int d = 255; d > chosen; --d) run += sh.bins[d];
      }
      sh.prefix = prefix | (static_cast<u64>(chosen) << shift);
      sh.above = run;
    }
    __syncthreads();
    prefix = sh.prefix;
    above = sh.above;
    mask |= 0xFFull << shift;
    __syncthreads();
  }
  return prefix;
}

__device__ double kept_mass(const float* x, int vocab, const Keep& keep, Shared& sh) {
  double s = 0.0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    if (order_key(x[i], i) < keep.floor) continue;
    const float w = weight_of(x[i], keep.mx);
    if (w >= keep.min_weight) s += w;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.scratch[warp] = s;
  __syncthreads();
  s = lane < static_cast<int>(blockDim.x >> 5) ? sh.scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

__device__ u64 block_max_key(u64 k, Shared& sh) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 other = __shfl_xor_sync(0xffffffffu, k, o);
    k = other > k ? other : k;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) sh.key_scratch[warp] = k;
  __syncthreads();
  k = lane < static_cast<int>(blockDim.x >> 5) ? sh.key_scratch[lane] : 0ull;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 other = __shfl_xor_sync(0xffffffffu, k, o);
    k = other > k ? other : k;
  }
  return k;
}

__global__ void __launch_bounds__(threads) sample_kernel(float* logits, std::int64_t vocab64,
                                                         const SamplingRowParams* params,
                                                         const std::uint32_t* counts,
                                                         std::int32_t* out_ids) {
  __shared__ Shared sh;
  const int row = blockIdx.x;
  const int vocab = static_cast<int>(vocab64);
  const SamplingRowParams prm = params[row];
  float* x = logits + static_cast<std::int64_t>(row) * vocab64;
  const std::uint32_t* cnt = prm.use_penalties ? counts + static_cast<std::int64_t>(row) * vocab64 : nullptr;
  const bool greedy = prm.temperature <= 0.0f;

  // Penalties and temperature in place; the running maximum key gives argmax and the max logit.
  u64 best = 0;
  for (int i = threadIdx.x; i < vocab; i += blockDim.x) {
    const float v = adjusted_logit(x[i], cnt, i, prm, greedy);
    x[i] = v;
    const u64 k = order_key(v, i);
    best = k > best ? k : best;
  }
  best = block_max_key(best, sh);
  if (greedy) {
    if (threadIdx.x == 0) out_ids[row] = key_id(best);
    return;
  }
  __syncthreads();  // every thread's in-place writes are visible before the passes re-read x

  const unsigned top_bits = static_cast<unsigned>(best >> 32);
  const float mx = __uint_as_float((top_bits & 0x80000000u) ? (top_bits & 0x7fffffffu) : ~top_bits);
  Keep keep{0ull, mx, 0.0f};
  if (prm.top_k > 0 && prm.top_k < vocab)
    keep.floor = radix_select(x, vocab, keep, true, static_cast<double>(prm.top_k), false, sh);
  if (prm.top_p < 1.0f) {
    const double z = kept_mass(x, vocab, keep, sh);
    const u64 k = radix_select(x, vocab, keep, false, static_cast<double>(prm.top_p) * z, false, sh);
    keep.floor = k > keep.floor ? k : keep.floor;
  }
  if (prm.min_p > 0.0f) keep.min_weight = prm.min_p;  // p_i >= min_p * p_max, p_max has weight 1
  const double z = kept_mass(x, vocab, keep, sh);
  const u64 chosen = radix_select(x, vocab, keep, false, static_cast<double>(prm.uniform) * z, true, sh);
  if (threadIdx.x == 0) out_ids[row] = key_id(chosen);
}

__global__ void token_counts_kernel(std::uint32_t* counts, std::int64_t vocab,
                                    const std::int32_t* prompt_tokens, const std::int32_t* prompt_start,
                                    const std::int32_t* output_tokens, const std::int32_t* output_start) {
  const int row = blockIdx.x;
  std::uint32_t* c = counts + row * vocab;
  if (prompt_start) {
    for (int i = prompt_start[row] + threadIdx.x; i < prompt_start[row + 1]; i += blockDim.x)
      atomicOr(&c[prompt_tokens[i]], 0x80000000u);
  }
  if (output_start) {
    for (int i = output_start[row] + threadIdx.x; i < output_start[row + 1]; i += blockDim.x) {
      atomicOr(&c[output_tokens[i]], 0x80000000u);
      atomicAdd(&c[output_tokens[i]], 1u);
    }
  }
}

}  // namespace

void launch_token_counts(cudaStream_t stream, std::uint32_t* counts, std::int64_t vocab,
                         std::int32_t rows, const std::int32_t* prompt_tokens,
                         const std::int32_t* prompt_start, const std::int32_t* output_tokens,
                         const std::int32_t* output_start) {
  if (rows == 0) return;
  XSERV_CUDA_CHECK(cudaMemsetAsync(counts, 0, sizeof(std::uint32_t) * vocab * rows, stream));
  token_counts_kernel<<<rows, 256, 0, stream>>>(counts, vocab, prompt_tokens, prompt_start,
                                                output_tokens, output_start);
  XSERV_CUDA_LAUNCH_CHECK();
}

void launch_sample(cudaStream_t stream, float* logits, std::int32_t rows, std::int64_t vocab,
                   const SamplingRowParams* params, const std::uint32_t* counts,
                   std::int32_t* out_ids) {
  if (rows == 0) return;
  sample_kernel<<<rows, threads, 0, stream>>>(logits, vocab, params, counts, out_ids);
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
