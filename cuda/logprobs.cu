// Log-probabilities for the engine's logprobs option: per row of raw logits [R, V] f32 (read
// only), log_softmax at the chosen id and the row's top_n (<= 20) most likely tokens.
// Launch: grid R, 512 threads. Pass 1: block max; pass 2: sum of exp(x - max) in float per
// thread, then double across the block, lse = max + log(sum) (the CPU reference sums in double).
// Then top_n rounds of a block arg-max over 64-bit order keys (value desc, id asc — the order
// sampling.cu and the CPU use), each round taking the best key below the previous round's: top_n
// reads of the row, fine for N <= 20 and one row per sampled sequence.
// Outputs: out_chosen [R], out_top_ids / out_top_lp [R, top_n], device memory.
#include <cfloat>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/order_key.cuh"

namespace xserv::cuda {
namespace {

constexpr int threads = 512;
using u64 = unsigned long long;


__device__ __forceinline__ u64 warp_max_key(u64 k) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 other = __shfl_xor_sync(0xffffffffu, k, o);
    k = other > k ? other : k;
  }
  return k;
}

__device__ u64 block_max_key(u64 k, u64* scratch) {
  k = warp_max_key(k);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = k;
  __syncthreads();
  k = lane < (blockDim.x >> 5) ? scratch[lane] : 0ull;
  return warp_max_key(k);
}

__device__ double block_sum_double(double x, double* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __syncthreads();
  if (lane == 0) scratch[warp] = x;
  __syncthreads();
  x = lane < (blockDim.x >> 5) ? scratch[lane] : 0.0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

__global__ void __launch_bounds__(threads)
    logprobs_kernel(const float* __restrict__ logits, std::int64_t vocab,
                    const std::int32_t* __restrict__ ids, int top_n, float* __restrict__ out_chosen,
                    std::int32_t* __restrict__ out_top_ids, float* __restrict__ out_top_lp) {
  __shared__ float fscratch[32];
  __shared__ double dscratch[32];
  __shared__ u64 kscratch[32];
  const int row = blockIdx.x;
  const float* x = logits + static_cast<std::int64_t>(row) * vocab;

  float mx = -FLT_MAX;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx, fscratch);
  double sum = 0.0;
  for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x)
    sum += static_cast<double>(expf(x[i] - mx));
  sum = block_sum_double(sum, dscratch);
  const float lse = mx + static_cast<float>(log(sum));
  if (threadIdx.x == 0) out_chosen[row] = x[ids[row]] - lse;

  u64 below = ~0ull;  // keys strictly below this one are still candidates
  for (int k = 0; k < top_n; ++k) {
    u64 best = 0ull;
    for (std::int64_t i = threadIdx.x; i < vocab; i += blockDim.x) {
      const u64 key = order_key(x[i], static_cast<int>(i));
      if (key < below && key > best) best = key;
    }
    best = block_max_key(best, kscratch);
    if (threadIdx.x == 0) {
      const std::int64_t at = static_cast<std::int64_t>(row) * top_n + k;
      if (best == 0ull) {  // fewer tokens than top_n
        out_top_ids[at] = -1;
        out_top_lp[at] = -INFINITY;
      } else {
        const int id = key_id(best);
        out_top_ids[at] = id;
        out_top_lp[at] = x[id] - lse;
      }
    }
    below = best;
  }
}

}  // namespace

void launch_logprobs(cudaStream_t stream, const float* logits, std::int32_t rows,
                     std::int64_t vocab, const std::int32_t* ids, std::int32_t top_n,
                     float* out_chosen, std::int32_t* out_top_ids, float* out_top_lp) {
  if (rows <= 0) return;
  logprobs_kernel<<<rows, threads, 0, stream>>>(logits, vocab, ids, top_n, out_chosen,
                                                out_top_ids, out_top_lp);
  XSERV_CUDA_CHECK(cudaGetLastError());
}

}  // namespace xserv::cuda
