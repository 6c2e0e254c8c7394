// Token sampling when every row has a small top-k (or is greedy): the vocabulary is split over
// many blocks per row instead of one block scanning it 25 times, and everything after the top-k
// cut runs on at most a few thousand candidates.
//
// Same result as sample_kernel (sampling.cu) and the CPU backend: tokens are ranked by the same
// 64-bit key (order-preserving value bits << 32 | ~id), the top-k set is exact (each block keeps
// its chunk's k best keys; the row's k best are among the union), and top-p, min-p and the
// inverse-CDF draw walk the k best in descending key order with double sums.
//
// Phase 1, grid (blocks_per_row, R), 256 threads: penalties and temperature in place on the
//   block's chunk of the row (as sample_kernel does), then an 8-pass radix select by count over
//   the chunk (integer histograms in shared memory, the digit found by a block scan) finds the
//   chunk's k-th key; the keys at or above it go to cand[row][block * k_max ...] (unused slots
//   stay 0, below every real key). Rows with k = 1 (greedy) take one pass and a block max.
//   Before 2026-12-01 every row ran the 8 passes and thread 0 walked the 256 bins of each pass
//   alone: a greedy 128-row step over Qwen3's 151936 logits took ~320 us (ncu), ~10% of a
//   Qwen3-1.7B decode step (docs/benchmarks.md, "Batched decode steps").
// Phase 2, grid R, 1024 threads: the row's candidates (blocks_per_row * k_max <= 4096 keys) are
//   sorted descending in shared memory (bitonic), and one thread applies top-k, top-p, min-p and
//   the draw over at most k keys.
// One kernel when every row is greedy (k_max = 1, `tickets` given: XSERV_CUDA_SAMPLE_ONE_PASS):
//   phase 2 of a greedy row is the largest of its blocks' best keys, so the last block of a row
//   to finish phase 1 (an atomic ticket it resets) takes that maximum and writes the id, and the
//   1024-thread sort kernel and its launch between two decode steps go away. Same id: the
//   largest key is the sort's first.
// Greedy batches (k_max = 1) split a row over sample_greedy_blocks(rows) blocks. Batches of up to
//   greedy_wide_rows rows (batch-1 decode) take 256 (2-3 logits a thread over Qwen3's vocabulary,
//   one batch of loads), and the last block reads the blocks' keys with all its threads
//   (greedy_finish_block); measured (docs/benchmarks.md, "Every goal row on an H200 again"): H200
//   batch-1 decode Qwen3-0.6B +0.3%, 1.7B +0.2%; H100 GPT-2 +0.7%. Larger batches keep 64, where
//   each thread loads ~9 logits in three dependent batches and the last block's thread 0 reads
//   the 64 best keys alone (256 a row at 128 rows would be 32768 blocks; not measured).
//   XSERV_CUDA_SAMPLE_GREEDY_BLOCKS=N sets N at every batch size (64: the form before 2026-12-06).
//   Same id: the largest key of the row either way.
#include <cstdlib>
#include <string_view>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/order_key.cuh"
#include "cuda/sampling_common.cuh"

namespace xserv::cuda {
namespace {

using u64 = unsigned long long;
constexpr int phase1_threads = 256;
constexpr int phase2_threads = 1024;


// The row's k: greedy rows need only their best key.
__device__ __forceinline__ int row_k(const SamplingRowParams& p) {
  return p.temperature <= 0.0f ? 1 : p.top_k;
}

// The digit d (0..255) of a radix-select pass: the largest d whose keys, together with the
// `above` keys already known to be larger, reach k (bins[d] counts the keys of the current prefix
// with digit d); writes d and the count of keys above it (above + keys of digits > d). Thread t
// holds digit 255 - t, so an inclusive scan in thread order sums the digits from the top; exactly
// one thread sees above + (digits > d) < k <= above + (digits >= d), or d = 0 when no digit
// above 0 reaches k, as a top-down walk would. Needs blockDim.x == 256.
__device__ __forceinline__ void select_digit(const unsigned* bins, unsigned above, unsigned k,
                                             unsigned* warp_totals, int* digit_out,
                                             unsigned* above_out) {
  const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
  const int d = 255 - t;
  const unsigned mine = bins[d];
  unsigned incl = warp_inclusive_sum(mine, lane);
  if (lane == 31) warp_totals[warp] = incl;
  __syncthreads();
  unsigned before = 0;
  for (int w = 0; w < warp; ++w) before += warp_totals[w];
  incl += before;
  const unsigned excl = incl - mine;
  if (above + excl < k && (d == 0 || above + incl >= k)) {
    *digit_out = d;
    *above_out = above + excl;
  }
}

// The one-kernel greedy path: called by every thread of a block after its candidate is stored
// (and a block barrier). Thread 0 makes the store visible and takes the row's ticket; the last
// block of the row reads every block's best key from L2, writes the largest one's id and resets
// the ticket for the next launch.
__device__ __forceinline__ void greedy_finish(const u64* cand, unsigned* tickets, std::int32_t* out_ids,
                                              int row, int nblk) {
  if (threadIdx.x != 0) return;
  __threadfence();
  if (atomicAdd(&tickets[row], 1u) != static_cast<unsigned>(nblk - 1)) return;
  __threadfence();
  const u64* c = cand + static_cast<std::int64_t>(row) * nblk;
  u64 best = 0;
  for (int b = 0; b < nblk; ++b) best = max(best, __ldcg(c + b));
  out_ids[row] = key_id(best);
  tickets[row] = 0;
}

// greedy_finish with the whole block (called by every thread, after the block's candidate is
// stored by thread 0): thread 0 makes the store visible and takes the ticket; in the last block
// of the row every thread reads a share of the row's best keys from L2 and the block takes their
// maximum, so nblk keys cost one round trip instead of thread 0's chain of loads.
__device__ __forceinline__ void greedy_finish_block(const u64* cand, unsigned* tickets, std::int32_t* out_ids,
                                                    int row, int nblk) {
  __shared__ int last_sh;
  __shared__ u64 best_w[phase1_threads / 32];
  if (threadIdx.x == 0) {
    __threadfence();
    last_sh = atomicAdd(&tickets[row], 1u) == static_cast<unsigned>(nblk - 1);
  }
  __syncthreads();
  if (!last_sh) return;
  __threadfence();
  const u64* c = cand + static_cast<std::int64_t>(row) * nblk;
  u64 best = 0;
  for (int b = threadIdx.x; b < nblk; b += blockDim.x) best = max(best, __ldcg(c + b));
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
  if ((threadIdx.x & 31) == 0) best_w[threadIdx.x >> 5] = best;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < phase1_threads / 32; ++w) best = max(best, best_w[w]);
    out_ids[row] = key_id(best);
    tickets[row] = 0;
  }
}

// Phase 1. Rows with k = 1 (greedy, or top-k 1) need only the chunk's best key: one pass, a
// block max, and no store back unless penalties or a temperature changed the logit. Other rows
// run the radix select by count over the adjusted logits.
__global__ void __launch_bounds__(phase1_threads)
    topk_candidates_kernel(float* logits, std::int64_t vocab64, const SamplingRowParams* params,
                           const std::uint32_t* counts, int k_max, u64* cand,
                           unsigned* tickets, std::int32_t* out_ids, bool block_finish) {
  static_assert(phase1_threads == 256, "select_digit: one thread per digit");
  __shared__ unsigned bins[256];
  __shared__ unsigned warp_totals[phase1_threads / 32];
  __shared__ u64 best_sh[phase1_threads / 32];
  __shared__ int digit_sh;
  __shared__ unsigned above_sh, n_out;
  const int row = blockIdx.y, blk = blockIdx.x, nblk = gridDim.x;
  const int vocab = static_cast<int>(vocab64);
  const SamplingRowParams prm = params[row];
  const int chunk = (vocab + nblk - 1) / nblk;
  const int begin = blk * chunk, end = min(vocab, begin + chunk);
  float* x = logits + static_cast<std::int64_t>(row) * vocab64;
  const std::uint32_t* cnt = prm.use_penalties ? counts + static_cast<std::int64_t>(row) * vocab64 : nullptr;
  const bool greedy = prm.temperature <= 0.0f;
  const bool changes = cnt != nullptr || !greedy;  // adjusted_logit is the identity otherwise
  u64* out = cand + (static_cast<std::int64_t>(row) * nblk + blk) * k_max;
  for (int i = threadIdx.x; i < k_max; i += blockDim.x) out[i] = 0ull;
  const int k = min(row_k(prm), max(end - begin, 0));

  if (k == 1) {
    u64 best = 0;
#pragma unroll 4
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const float v = adjusted_logit(x[i], cnt, i, prm, greedy);
      if (changes) x[i] = v;
      best = max(best, order_key(v, i));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) best = max(best, __shfl_xor_sync(0xffffffffu, best, o));
    if ((threadIdx.x & 31) == 0) best_sh[threadIdx.x >> 5] = best;
    __syncthreads();  // also orders the zero fill above before the store below
    if (threadIdx.x == 0) {
      for (int w = 1; w < phase1_threads / 32; ++w) best = max(best, best_sh[w]);
      out[0] = best;
    }
    if (tickets != nullptr && block_finish) greedy_finish_block(cand, tickets, out_ids, row, nblk);
    else if (tickets != nullptr) greedy_finish(cand, tickets, out_ids, row, nblk);
    return;
  }

  for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
    x[i] = adjusted_logit(x[i], cnt, i, prm, greedy);
  }
  __syncthreads();

  u64 floor = 0;
  if (k > 0 && k < end - begin) {
    // The chunk's k-th largest key, one byte at a time from the top.
    u64 prefix = 0, mask = 0;
    unsigned above = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
      bins[threadIdx.x] = 0;
      __syncthreads();
      for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
        const u64 key = order_key(x[i], i);
        if ((key & mask) == prefix) atomicAdd(&bins[(key >> shift) & 255], 1u);
      }
      __syncthreads();
      select_digit(bins, above, static_cast<unsigned>(k), warp_totals, &digit_sh, &above_sh);
      __syncthreads();
      prefix |= static_cast<u64>(digit_sh) << shift;
      above = above_sh;
      mask |= 0xFFull << shift;
      __syncthreads();  // digit_sh / warp_totals are rewritten by the next pass
    }
    floor = prefix;  // keys are unique: exactly k keys are >= it
  }
  if (threadIdx.x == 0) n_out = 0;
  __syncthreads();
  if (k > 0) {
    for (int i = begin + threadIdx.x; i < end; i += blockDim.x) {
      const u64 key = order_key(x[i], i);
      if (key >= floor) out[atomicAdd(&n_out, 1u)] = key;
    }
  }
  // With tickets every row is greedy: only a block whose chunk is empty (k = 0) comes here.
  if (tickets != nullptr) {
    __syncthreads();
    if (block_finish) greedy_finish_block(cand, tickets, out_ids, row, nblk);
    else greedy_finish(cand, tickets, out_ids, row, nblk);
  }
}

__global__ void __launch_bounds__(phase2_threads)
    topk_draw_kernel(const SamplingRowParams* params, int n_cand, int n_pow2, const u64* cand,
                     std::int32_t* out_ids) {
  extern __shared__ u64 keys[];
  const int row = blockIdx.x;
  const SamplingRowParams prm = params[row];
  const u64* c = cand + static_cast<std::int64_t>(row) * n_cand;
  for (int i = threadIdx.x; i < n_pow2; i += blockDim.x) keys[i] = i < n_cand ? c[i] : 0ull;
  __syncthreads();
  // Bitonic sort, descending.
  for (int size = 2; size <= n_pow2; size <<= 1) {
    for (int stride = size >> 1; stride > 0; stride >>= 1) {
      for (int i = threadIdx.x; i < n_pow2; i += blockDim.x) {
        const int j = i ^ stride;
        if (j > i) {
          const bool desc = (i & size) == 0;
          const u64 a = keys[i], b = keys[j];
          if (desc ? a < b : a > b) keys[i] = b, keys[j] = a;
        }
      }
      __syncthreads();
    }
  }
  if (threadIdx.x != 0) return;
  if (prm.temperature <= 0.0f) {
    out_ids[row] = key_id(keys[0]);
    return;
  }
  int k = 0;
  while (k < prm.top_k && k < n_pow2 && keys[k] != 0ull) ++k;
  const float mx = key_value(keys[0]);
  if (prm.top_p < 1.0f) {
    double z = 0.0;
    for (int i = 0; i < k; ++i) z += static_cast<double>(expf(key_value(keys[i]) - mx));
    const double target = static_cast<double>(prm.top_p) * z;
    double run = 0.0;
    int i = 0;
    for (; i < k - 1; ++i) {
      run += static_cast<double>(expf(key_value(keys[i]) - mx));
      if (run >= target) break;
    }
    k = i + 1;
  }
  if (prm.min_p > 0.0f) {  // weights fall along the order: the kept ones are a prefix
    int i = 0;
    while (i < k && expf(key_value(keys[i]) - mx) >= prm.min_p) ++i;
    k = max(i, 1);
  }
  double z = 0.0;
  for (int i = 0; i < k; ++i) z += static_cast<double>(expf(key_value(keys[i]) - mx));
  const double target = static_cast<double>(prm.uniform) * z;
  double run = 0.0;
  int chosen = k - 1;
  for (int i = 0; i < k; ++i) {
    run += static_cast<double>(expf(key_value(keys[i]) - mx));
    if (run > target) {
      chosen = i;
      break;
    }
  }
  out_ids[row] = key_id(keys[chosen]);
}

}  // namespace

int sample_greedy_blocks(std::int32_t rows) noexcept {
  static const int forced = [] {
    const char* v = std::getenv("XSERV_CUDA_SAMPLE_GREEDY_BLOCKS");
    const int n = v ? std::atoi(v) : 0;
    return n > 0 ? std::min(n, sample_topk_max_candidates) : 0;
  }();
  if (forced > 0) return forced;
  return rows <= greedy_wide_rows ? 256 : 64;
}

int sample_topk_candidates(std::int64_t vocab, int k_max, std::int32_t rows) {
  const int blocks = k_max <= 1 ? sample_greedy_blocks(rows)
                                : std::max(1, std::min<int>(64, sample_topk_max_candidates / std::max(k_max, 1)));
  return static_cast<int>(std::min<std::int64_t>(blocks, vocab)) * k_max;
}

void launch_sample_topk(cudaStream_t stream, float* logits, std::int32_t rows, std::int64_t vocab,
                        const SamplingRowParams* params, const std::uint32_t* counts, int k_max,
                        void* candidates, unsigned* tickets, std::int32_t* out_ids) {
  if (rows == 0) return;
  const int n_cand = sample_topk_candidates(vocab, k_max, rows);
  const int blocks = n_cand / k_max;
  int n_pow2 = 1;
  while (n_pow2 < n_cand) n_pow2 <<= 1;
  auto* cand = static_cast<u64*>(candidates);
  unsigned* one_pass = k_max == 1 ? tickets : nullptr;
  topk_candidates_kernel<<<dim3(static_cast<unsigned>(blocks), static_cast<unsigned>(rows)), phase1_threads, 0,
                           stream>>>(logits, vocab, params, counts, k_max, cand, one_pass, out_ids,
                                                     sample_greedy_blocks(rows) != 64);
  XSERV_CUDA_LAUNCH_CHECK();
  if (one_pass != nullptr) return;
  const std::size_t smem = static_cast<std::size_t>(n_pow2) * sizeof(u64);
  static_assert(sample_topk_max_candidates * sizeof(u64) <= 48 * 1024, "phase 2 fits default smem");
  topk_draw_kernel<<<rows, phase2_threads, smem, stream>>>(params, n_cand, n_pow2, cand, out_ids);
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
