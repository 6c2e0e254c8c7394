// Token sampling on the GPU when some row has no small top-k (sampling_topk.cu takes the batches
// whose rows all do): each row is split over up to 64 blocks, so a row of 152k logits is read by
// 38 SMs at once, not by one. Only the chosen ids leave the device.
// Per row (logits [R, V] f32, modified in place like the CPU backend): penalties (repetition:
// HF over prompt + output; presence/frequency: OpenAI over output, from the counts table),
// temperature, then greedy argmax, or top-k, top-p, min-p and an inverse-CDF draw with the
// host-computed sampling_uniform(seed, step).
// Order: tokens are ranked by (probability desc, id asc), encoded as one 64-bit key
// (order-preserving float bits << 32 | ~id), so ties break exactly as on the CPU. Every filter
// keeps a prefix of that order, so each is a "find the key where a running total crosses a
// target" problem, solved by a radix select over the key bytes, never a full sort:
//   select_prepare_kernel: penalties and temperature in place, the row's best key (atomicMax);
//     the last block to finish decides the row's first phase (greedy rows end here).
//   select_pass_kernel, launched up to 8 times per phase (phases: top-k by count, top-p by mass,
//     the draw by mass): every block histograms one key byte of its chunk (count, mass in double
//     like the CPU backend, the largest key per bin) into the row's global bins; the last block
//     to arrive picks the bin where the running total crosses the target (a block scan over the
//     bins), narrows the prefix or, when that bin holds one key, ends the phase early. Later launches for a finished row
//     return at once. The first pass of a mass phase sums the bins: that is the kept mass Z.
// Masses are summed in double: with thousands of kept tokens a float sum can move a draw across
// a boundary of the order, and then the id differs completely.
#include <algorithm>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/order_key.cuh"
#include "cuda/sampling_common.cuh"

namespace xserv::cuda {
namespace {

using u64 = unsigned long long;
constexpr int threads = 256;
constexpr int min_chunk = 4096;   // logits per block: enough work to hide a pass's fixed costs
constexpr int max_blocks = 64;

enum Phase : int { top_k_phase, top_p_phase, draw_phase, done_phase };

// One row's select, in global memory (zeroed before select_prepare_kernel).
struct RowSelect {
  double mass[256];
  unsigned count[256];
  u64 max_key[256];
  u64 best;       // the largest key after penalties and temperature
  u64 floor;      // keys below are out (the top-k and top-p results so far)
  u64 prefix, mask;
  double above;   // kept total in the bins above the prefix
  double target;
  int phase, shift;
  unsigned arrived;  // blocks done with the current kernel
};

__device__ __forceinline__ int chunk_begin(int vocab, int blk, int nblk) {
  return static_cast<int>(static_cast<long long>(vocab) * blk / nblk);
}

__device__ __forceinline__ float row_max(const RowSelect& st) { return key_value(st.best); }

// The phase after `done` for this row's filters.
__device__ int next_phase(int done, const SamplingRowParams& p, int vocab) {
  if (done < top_k_phase && p.top_k > 0 && p.top_k < vocab) return top_k_phase;
  if (done < top_p_phase && p.top_p < 1.0f) return top_p_phase;
  return draw_phase;
}

// True in every thread of the row's last block to finish this kernel, after every other block's
// global writes are visible to it.
__device__ bool last_block_of_row(RowSelect& st, int nblk) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&st.arrived, 1u) == static_cast<unsigned>(nblk - 1);
  __syncthreads();
  if (!last) return false;
  __threadfence();
  return true;
}

__global__ void __launch_bounds__(threads)
    select_prepare_kernel(float* logits, std::int64_t vocab64, const SamplingRowParams* params,
                          const std::uint32_t* counts, RowSelect* sel, std::int32_t* out_ids) {
  __shared__ u64 warp_best[threads / 32];
  const int row = blockIdx.y, blk = blockIdx.x, nblk = gridDim.x;
  const int vocab = static_cast<int>(vocab64);
  const SamplingRowParams prm = params[row];
  float* x = logits + static_cast<std::int64_t>(row) * vocab64;
  const std::uint32_t* cnt = prm.use_penalties ? counts + static_cast<std::int64_t>(row) * vocab64 : nullptr;
  const bool greedy = prm.temperature <= 0.0f;
  RowSelect& st = sel[row];

  u64 best = 0;
  for (int i = chunk_begin(vocab, blk, nblk) + threadIdx.x; i < chunk_begin(vocab, blk + 1, nblk); i += threads) {
    const float v = adjusted_logit(x[i], cnt, i, prm, greedy);
    x[i] = v;
    const u64 k = order_key(v, i);
    best = k > best ? k : best;
  }
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const u64 other = __shfl_xor_sync(0xffffffffu, best, o);
    best = other > best ? other : best;
  }
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < threads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    atomicMax(&st.best, best);
  }
  if (!last_block_of_row(st, nblk) || threadIdx.x != 0) return;
  st.arrived = 0;
  st.shift = 56;
  if (greedy) {
    out_ids[row] = key_id(st.best);
    st.phase = done_phase;
  } else {
    st.phase = next_phase(-1, prm, vocab);
  }
}

// The row's state after the pass chose `chosen` (its keys' count `in_bin`, their largest key,
// and `run`, the kept total above the bin): narrow the prefix to it, or end the phase.
__device__ void take_bin(RowSelect& st, const SamplingRowParams& prm, int vocab, int chosen,
                         unsigned in_bin, u64 key, double run, std::int32_t* out) {
  if (in_bin <= 1 || st.shift == 0) {  // the crossing key is known
    if (st.phase == draw_phase) {
      out[blockIdx.y] = key_id(key);
      st.phase = done_phase;
    } else {
      st.floor = key > st.floor ? key : st.floor;
      st.phase = next_phase(st.phase, prm, vocab);
    }
    st.prefix = st.mask = 0;
    st.above = 0.0;
    st.shift = 56;
  } else {
    st.prefix |= static_cast<u64>(chosen) << st.shift;
    st.mask |= 0xFFull << st.shift;
    st.above = run;
    st.shift -= 8;
  }
}

// A phase's target: top-k's count, or a share of the kept mass z (the first pass's bins).
__device__ __forceinline__ double phase_target(int phase, const SamplingRowParams& prm, double z) {
  return phase == top_k_phase   ? static_cast<double>(prm.top_k)
         : phase == top_p_phase ? static_cast<double>(prm.top_p) * z
                                : static_cast<double>(prm.uniform) * z;
}

// The last block's half of a pass, by all its threads: the bin where the running total from the
// top crosses the target. Thread t holds bin 255 - t, so an inclusive scan in thread order is that
// running total; the first thread whose non-empty bin reaches the target (the draw: passes it)
// holds the chosen bin, or, when rounding leaves the target just out of reach, the last non-empty
// one. Then every thread clears its bin for the next pass. Two block barriers instead of ~256
// dependent reads from L2 by one thread walking the bins, which took most of a pass (~13 us at
// batch 1; docs/benchmarks.md, "Sampling without top-k").
__device__ void select_bin_block(RowSelect& st, const SamplingRowParams& prm, int vocab, std::int32_t* out) {
  static_assert(threads == 256, "one bin a thread");
  __shared__ double warp_total[threads / 32];
  __shared__ int chosen_t, last_t;
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5, d = 255 - t;
  const int phase = st.phase, shift = st.shift;
  const bool by_count = phase == top_k_phase, strict = phase == draw_phase;
  // Written by other blocks' atomics in L2 during this kernel: read past L1.
  const unsigned count = __ldcg(&st.count[d]);
  const double mine = by_count ? static_cast<double>(count) : __ldcg(&st.mass[d]);
  const u64 key = __ldcg(&st.max_key[d]);
  const double above = st.above;
  double incl = warp_inclusive_sum(mine, lane);
  if (lane == 31) warp_total[warp] = incl;
  if (t == 0) chosen_t = threads, last_t = -1;
  __syncthreads();
  double before = 0.0, z = 0.0;
  for (int w = 0; w < threads / 32; ++w) {
    if (w < warp) before += warp_total[w];
    z += warp_total[w];
  }
  incl += before;
  const double target = shift == 56 ? phase_target(phase, prm, z) : st.target;
  const double next = above + incl;
  if (count != 0) {
    if (strict ? next > target : next >= target) atomicMin(&chosen_t, t);
    atomicMax(&last_t, t);
  }
  __syncthreads();
  const int c = chosen_t < threads ? chosen_t : (last_t < 0 ? threads - 1 : last_t);
  if (t == c) {
    if (shift == 56) st.target = target;
    take_bin(st, prm, vocab, d, count, key, above + incl - mine, out);
  }
  st.mass[d] = 0.0, st.count[d] = 0, st.max_key[d] = 0;
  if (t == 0) st.arrived = 0;
}

__global__ void __launch_bounds__(threads)
    select_pass_kernel(const float* logits, std::int64_t vocab64, const SamplingRowParams* params,
                       RowSelect* sel, std::int32_t* out_ids) {
  __shared__ double mass[256];
  __shared__ unsigned count[256];
  __shared__ u64 max_key[256];
  const int row = blockIdx.y, blk = blockIdx.x, nblk = gridDim.x;
  RowSelect& st = sel[row];
  const int phase = st.phase;  // written by the previous kernel: the same for every block
  if (phase == done_phase) return;
  const int vocab = static_cast<int>(vocab64);
  const SamplingRowParams prm = params[row];
  const float* x = logits + static_cast<std::int64_t>(row) * vocab64;
  const u64 floor = st.floor, prefix = st.prefix, mask = st.mask;
  const int shift = st.shift;
  const float mx = row_max(st);
  // min-p keeps p_i >= min_p * p_max (the best token has weight 1); it cuts only the draw.
  const float min_weight = phase == draw_phase ? fminf(prm.min_p, 1.0f) : 0.0f;
  const bool by_count = phase == top_k_phase;

  for (int d = threadIdx.x; d < 256; d += threads) mass[d] = 0.0, count[d] = 0, max_key[d] = 0;
  __syncthreads();
  const int begin = chunk_begin(vocab, blk, nblk), end = chunk_begin(vocab, blk + 1, nblk);
  for (int base = begin; base < end; base += threads) {  // warp-uniform trip count
    const int i = base + static_cast<int>(threadIdx.x);
    int d = -1;  // the key's bin, -1 when filtered out
    double w = 0.0;
    u64 key = 0;
    if (i < end) {
      key = order_key(x[i], i);
      if (key >= floor && (key & mask) == prefix) {
        const float wf = by_count ? 1.0f : expf(x[i] - mx);
        if (wf >= min_weight) d = static_cast<int>((key >> shift) & 255), w = wf;
      }
    }
    // The first passes over a flat row put nearly every key in one or two bins: a warp whose
    // lanes agree adds once instead of 32 times to the same shared word.
    if (__match_any_sync(0xffffffffu, d) == 0xffffffffu) {
      if (d < 0) continue;
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        w += __shfl_xor_sync(0xffffffffu, w, o);
        const u64 other = __shfl_xor_sync(0xffffffffu, key, o);
        key = other > key ? other : key;
      }
      if ((threadIdx.x & 31) == 0) {
        atomicAdd(&mass[d], w);
        atomicAdd(&count[d], 32u);
        atomicMax(&max_key[d], key);
      }
    } else if (d >= 0) {
      atomicAdd(&mass[d], w);
      atomicAdd(&count[d], 1u);
      atomicMax(&max_key[d], key);
    }
  }
  __syncthreads();
  for (int d = threadIdx.x; d < 256; d += threads) {
    if (count[d] == 0) continue;
    atomicAdd(&st.mass[d], mass[d]);
    atomicAdd(&st.count[d], count[d]);
    atomicMax(&st.max_key[d], max_key[d]);
  }
  if (!last_block_of_row(st, nblk)) return;
  select_bin_block(st, prm, vocab, out_ids);
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

std::size_t sample_select_bytes(std::int32_t rows) {
  return static_cast<std::size_t>(rows) * sizeof(RowSelect);
}

void launch_sample(cudaStream_t stream, float* logits, std::int32_t rows, std::int64_t vocab,
                   const SamplingRowParams* params, int passes, const std::uint32_t* counts,
                   void* select, std::int32_t* out_ids) {
  if (rows == 0) return;
  auto* sel = static_cast<RowSelect*>(select);
  XSERV_CUDA_CHECK(cudaMemsetAsync(sel, 0, sample_select_bytes(rows), stream));
  const auto blocks = static_cast<unsigned>(std::clamp<std::int64_t>((vocab + min_chunk - 1) / min_chunk, 1, max_blocks));
  const dim3 grid(blocks, static_cast<unsigned>(rows));
  select_prepare_kernel<<<grid, threads, 0, stream>>>(logits, vocab, params, counts, sel, out_ids);
  XSERV_CUDA_LAUNCH_CHECK();
  for (int p = 0; p < passes; ++p) {
    select_pass_kernel<<<grid, threads, 0, stream>>>(logits, vocab, params, sel, out_ids);
    XSERV_CUDA_LAUNCH_CHECK();
  }
}

}  // namespace xserv::cuda
