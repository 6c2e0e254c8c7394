// Paged attention, one query row per block: decode steps, and prefill of f32 models.
// Computes out[t, h, :] = softmax(scale * q[t, h] . K[0..pos_t]) V for every q head h of one kv
// head (grouped-query: the G q heads of a kv head share each K/V load), reading K/V straight
// from the paged cache [num_blocks, block_size, n_kv_heads, head_dim] through the sequence's
// block table. pos_t = context_len - query_len + (t - query_start): causal within the step.
// Split-KV: blockIdx.z takes keys [z * split_size, (z + 1) * split_size); with several splits
// each block writes an unnormalised partial (max, sum, acc) and attention_merge combines them,
// so long contexts spread over many SMs even at batch 1.
// Launch: grid (T, n_kv_heads, num_splits), 128 threads. A key is read by L lanes (8, or 16
// when G * head_dim is large, to bound registers), each owning D / L contiguous elements
// loaded with 16-byte loads (D: the head_dim rounded up to 32, 64 or 128; a smaller head_dim
// masks the tail with scalar loads); a warp reads 32 / L keys at once and keeps an online softmax per
// lane group; groups then combine through shuffles, warps through shared memory.
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

constexpr int threads = 128;
constexpr int num_warps = threads / 32;

__device__ __forceinline__ int find_sequence(const std::int32_t* query_start, int num_seqs, int row) {
  int lo = 0, hi = num_seqs - 1;
  while (lo < hi) {  // the last sequence whose first row is <= row (skips empty sequences)
    const int mid = (lo + hi + 1) / 2;
    if (query_start[mid] <= row) lo = mid; else hi = mid - 1;
  }
  return lo;
}

// Combines the online-softmax state (m, l, acc) of two partial sums over disjoint key sets.
template <int E>
__device__ __forceinline__ void combine(float& m, float& l, float (&acc)[E], float m2, float l2,
                                        const float (&acc2)[E]) {
  const float mx = fmaxf(m, m2);
  const float a = m == -CUDART_INF_F ? 0.0f : expf(m - mx);
  const float b = m2 == -CUDART_INF_F ? 0.0f : expf(m2 - mx);
  l = l * a + l2 * b;
#pragma unroll
  for (int e = 0; e < E; ++e) acc[e] = acc[e] * a + acc2[e] * b;
  m = mx;
}

// E elements from p[start..] (those at or past dim read as zero); full rows use vector loads.
template <typename T, int E>
__device__ __forceinline__ void load_row(const T* p, int start, int dim, bool full, float (&out)[E]) {
  if (full) {
    load_f32<T, E>(p + start, out);
  } else {
#pragma unroll
    for (int e = 0; e < E; ++e) out[e] = start + e < dim ? to_f32(p[start + e]) : 0.0f;
  }
}

template <typename T, int D, int G>
__global__ void __launch_bounds__(threads) attention_rows_kernel(const AttentionParams p) {
  constexpr int L = G * D >= 1024 ? 16 : 8;  // lanes per key
  constexpr int E = D / L;                   // elements per lane
  constexpr int keys_per_warp = 32 / L;
  constexpr int keys_per_block = threads / L;
  __shared__ float s_acc[num_warps][G][D];
  __shared__ float s_ml[num_warps][G][2];

  allow_dependents();  // the merge or the next GEMV may launch early; they wait for this one
  grid_dependency_wait();
  const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int li = lane % L, kg = lane / L;
  const int group = p.n_q_heads / p.n_kv_heads;
  const int dim = p.head_dim;
  const bool full = dim == D;

  const int seq = find_sequence(p.query_start, p.num_seqs, row);
  const int q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int n_keys = p.context_lens[seq] - q_len + (row - p.query_start[seq]) + 1;
  const int k_begin = split * p.split_size;
  const int k_end = min(n_keys, k_begin + p.split_size);

  const T* q_row = static_cast<const T*>(p.qkv) + static_cast<std::int64_t>(row) * p.qkv_stride;
  float q[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    if (g < group) {
      load_row<T, E>(q_row + (kvh * group + g) * dim, li * E, dim, full, q[g]);
#pragma unroll
      for (int e = 0; e < E; ++e) q[g][e] *= p.scale;
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) q[g][e] = 0.0f;
    }
  }
  float m[G], l[G], acc[G][E];
#pragma unroll
  for (int g = 0; g < G; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] = 0.0f;
  }

  const std::int32_t* table = p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  // The loop bound is the same for the whole warp (shuffles need every lane); lanes past the
  // end compute on zeros and skip the update. Two keys per lane group and iteration: both keys'
  // block-table reads and K/V loads are issued before either is used, halving the dependent
  // memory round trips of a long split (the update order over keys is unchanged).
  constexpr int U = 2;
  for (int k0 = k_begin + warp * keys_per_warp; k0 < k_end; k0 += U * keys_per_block) {
    float kv[U][E], vv[U][E];
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * keys_per_block + kg;
      valid[u] = k < k_end;
      if (valid[u]) {
        const std::int64_t slot = static_cast<std::int64_t>(table[k / p.block_size]) * p.block_size +
                                  k % p.block_size;
        const std::int64_t base = (slot * p.n_kv_heads + kvh) * dim;
        load_row<T, E>(kc + base, li * E, dim, full, kv[u]);
        load_row<T, E>(vc + base, li * E, dim, full, vv[u]);
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) kv[u][e] = vv[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
      for (int g = 0; g < G; ++g) {
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) s += q[g][e] * kv[u][e];
#pragma unroll
        for (int o = L / 2; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (valid[u]) {
          const float mx = fmaxf(m[g], s);
          const float a = expf(m[g] - mx);  // m = -inf at first: a = 0
          const float w = expf(s - mx);
          l[g] = l[g] * a + w;
#pragma unroll
          for (int e = 0; e < E; ++e) acc[g][e] = acc[g][e] * a + w * vv[u][e];
          m[g] = mx;
        }
      }
    }
  }

  // Lane groups of a warp hold disjoint keys: combine them through shuffles.
#pragma unroll
  for (int o = L; o < 32; o <<= 1) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
      const float m2 = __shfl_xor_sync(0xffffffffu, m[g], o);
      const float l2 = __shfl_xor_sync(0xffffffffu, l[g], o);
      float acc2[E];
#pragma unroll
      for (int e = 0; e < E; ++e) acc2[e] = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
      combine<E>(m[g], l[g], acc[g], m2, l2, acc2);
    }
  }
  if (kg == 0) {
#pragma unroll
    for (int g = 0; g < G; ++g) {
#pragma unroll
      for (int e = 0; e < E; ++e) s_acc[warp][g][li * E + e] = acc[g][e];
      if (li == 0) {
        s_ml[warp][g][0] = m[g];
        s_ml[warp][g][1] = l[g];
      }
    }
  }
  __syncthreads();

  // Then warps through shared memory: thread i finishes elements i, i + 128, ... of [group, D].
  const std::int64_t out_stride = static_cast<std::int64_t>(p.n_q_heads) * dim;
  for (int i = threadIdx.x; i < group * dim; i += threads) {
    const int g = i / dim, d = i % dim;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < num_warps; ++w) mx = fmaxf(mx, s_ml[w][g][0]);
    float sum = 0.0f, val = 0.0f;
#pragma unroll
    for (int w = 0; w < num_warps; ++w) {
      const float mw = s_ml[w][g][0];
      const float a = mw == -CUDART_INF_F ? 0.0f : expf(mw - mx);
      sum += s_ml[w][g][1] * a;
      val += s_acc[w][g][d] * a;
    }
    const int h = kvh * group + g;
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + row * out_stride + h * dim;
      out[d] = from_f32<T>(sum > 0.0f ? val / sum : 0.0f);
    } else {
      const std::int64_t part = (static_cast<std::int64_t>(row) * p.n_q_heads + h) * p.num_splits + split;
      p.partial_out[part * dim + d] = val;
      if (d == 0) {
        p.partial_ml[part * 2] = mx;
        p.partial_ml[part * 2 + 1] = sum;
      }
    }
  }
}

// Combines the splits of one (row, head): grid (T, n_q_heads), head_dim threads.
template <typename T>
__global__ void attention_merge_kernel(const AttentionParams p) {
  allow_dependents();
  grid_dependency_wait();
  const int row = blockIdx.x, h = blockIdx.y, d = threadIdx.x;
  const std::int64_t first = (static_cast<std::int64_t>(row) * p.n_q_heads + h) * p.num_splits;
  float mx = -CUDART_INF_F;
  for (int s = 0; s < p.num_splits; ++s) mx = fmaxf(mx, p.partial_ml[(first + s) * 2]);
  float sum = 0.0f, val = 0.0f;
  for (int s = 0; s < p.num_splits; ++s) {
    const float ms = p.partial_ml[(first + s) * 2];
    if (ms == -CUDART_INF_F) continue;  // a split past this row's keys
    const float a = expf(ms - mx);
    sum += p.partial_ml[(first + s) * 2 + 1] * a;
    val += p.partial_out[(first + s) * p.head_dim + d] * a;
  }
  T* out = static_cast<T*>(p.out) + (static_cast<std::int64_t>(row) * p.n_q_heads + h) * p.head_dim;
  out[d] = from_f32<T>(sum > 0.0f ? val / sum : 0.0f);
}

template <typename T, int D, int G>
void launch_rows(cudaStream_t stream, const AttentionParams& p) {
  const dim3 grid(p.num_tokens, p.n_kv_heads, p.num_splits);
  launch_pdl(attention_rows_kernel<T, D, G>, grid, dim3(threads), 0, stream, p);
  if (p.num_splits > 1)
    launch_pdl(attention_merge_kernel<T>, dim3(p.num_tokens, p.n_q_heads), dim3(p.head_dim), 0, stream, p);
}

template <typename T, int D>
void launch_rows_dim(cudaStream_t stream, const AttentionParams& p) {
  const int group = p.n_q_heads / p.n_kv_heads;
  if (group <= 1) launch_rows<T, D, 1>(stream, p);
  else if (group <= 2) launch_rows<T, D, 2>(stream, p);
  else if (group <= 4) launch_rows<T, D, 4>(stream, p);
  else launch_rows<T, D, 8>(stream, p);
}

template <typename T>
void launch_rows_typed(cudaStream_t stream, const AttentionParams& p) {
  if (p.head_dim <= 32) launch_rows_dim<T, 32>(stream, p);
  else if (p.head_dim <= 64) launch_rows_dim<T, 64>(stream, p);
  else launch_rows_dim<T, 128>(stream, p);
}

}  // namespace

bool attention_rows_supported(std::int32_t head_dim, std::int32_t group) noexcept {
  return head_dim >= 1 && head_dim <= 128 && group >= 1 && group <= 8;
}

void launch_attention_rows(cudaStream_t stream, DType dt, const AttentionParams& p) {
  if (p.num_tokens == 0) return;
  if (dt == DType::f32) launch_rows_typed<float>(stream, p);
  else launch_rows_typed<__nv_bfloat16>(stream, p);
}

}  // namespace xserv::cuda
