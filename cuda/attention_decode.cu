// Paged attention, one query row per block: decode steps (and f32 prefill with
// XSERV_CUDA_PREFILL_F32=0 or a head_dim other than 16, 32, 64 and 128; attention_prefill.cu
// otherwise).
// Computes out[t, h, :] = softmax(scale * q[t, h] . K[0..pos_t]) V for every q head h of one kv
// head (grouped-query: the G q heads of a kv head share each K/V load), reading K/V straight
// from the paged cache [num_blocks, block_size, n_kv_heads, head_dim] through the sequence's
// block table. pos_t = context_len - query_len + (t - query_start): causal within the step.
// Split-KV: blockIdx.z takes keys [z * split_size, (z + 1) * split_size); with several splits
// each block writes an unnormalised partial (max, sum, acc) and they are combined (by the last
// block of the mma kernel, by attention_merge otherwise), so long contexts spread over many SMs
// even at batch 1 (attention_rows_split sizes them).
// Three kernels, all launched as grid (T, n_kv_heads, num_splits) x 128 threads (the mma kernel:
// 256 on the short-context rule's launches, launch_warps; its one-kv-head-a-warp form for
// batched decode, launch_head_warps: grid (T, n_kv_heads / 8, num_splits) x 256):
// - attention_decode_mma_kernel (bf16, head_dim 64 or 128: every Qwen3; the default): tensor-core
//   scores and P.V, each warp streaming its own 16-key chunks through a cp.async ring, splits
//   merged in-kernel; optionally with the q/k prologue folded in. Described at the kernel.
// - attention_tiles_kernel (the same inputs, XSERV_CUDA_ATTN_MMA=0): K/V tiles of 32 keys in
//   shared memory, copied with cp.async two tiles deep; described at the kernel.
// - attention_rows_kernel (f32, other head dims): a key is read by L lanes (8, or 16 when
//   G * head_dim is large, to bound registers), each owning D / L contiguous elements loaded
//   with 16-byte loads (D: the head_dim rounded up to 32, 64 or 128; a smaller head_dim masks
//   the tail with scalar loads); a warp reads 32 / L keys at once and keeps an online softmax
//   per lane group; groups then combine through shuffles, warps through shared memory.
#include <algorithm>
#include <array>
#include <cstdlib>
#include <string_view>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/mma.cuh"
#include "cuda/qk_transform.cuh"

namespace xserv::cuda {
namespace {

constexpr int threads = 128;
constexpr int num_warps = threads / 32;

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

  const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int li = lane % L, kg = lane / L;
  const int group = p.n_q_heads / p.n_kv_heads;
  const int dim = p.head_dim;
  const bool full = dim == D;

  // Before grid_dependency_wait (the kernel before this one may still be running; launch_pdl):
  // only what no kernel of this step writes, i.e. the batch metadata (uploaded before the step)
  // and the keys cached before this step's rows. Their first round of K/V loads goes out here.
  const int seq = find_sequence(p.query_start, p.num_seqs, row);
  const int q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int n_keys = p.context_lens[seq] - q_len + (row - p.query_start[seq]) + 1;
  const int k_begin = split * p.split_size;
  const int k_end = min(n_keys, k_begin + p.split_size);
  const int cached_end = min(k_end, p.context_lens[seq] - q_len);  // keys before this step's

  const std::int32_t* table = p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const T* kc = static_cast<const T*>(p.k_cache);
  const T* vc = static_cast<const T*>(p.v_cache);
  // Two keys per lane group and iteration: both keys' block-table reads and K/V loads are issued
  // before either is used, halving the dependent memory round trips of a long split (the update
  // order over keys is unchanged).
  constexpr int U = 2;
  const int k_first = k_begin + warp * keys_per_warp;
  float kv[U][E], vv[U][E];
  bool loaded[U];  // the first iteration's key u was loaded before the wait
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int k = k_first + u * keys_per_block + kg;
    loaded[u] = p.early_kv && k < cached_end;
    if (loaded[u]) {
      const std::int64_t slot = static_cast<std::int64_t>(table[k / p.block_size]) * p.block_size + k % p.block_size;
      const std::int64_t base = (slot * p.n_kv_heads + kvh) * dim;
      load_row<T, E>(kc + base, li * E, dim, full, kv[u]);
      load_row<T, E>(vc + base, li * E, dim, full, vv[u]);
    }
  }
  grid_dependency_wait();

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

  const int own = n_keys - 1;  // decode: the row's own key, this step's k and v
  if (p.store_kv && own >= k_begin && own < k_end) {
    const std::int64_t slot = static_cast<std::int64_t>(table[own / p.block_size]) * p.block_size + own % p.block_size;
    const std::int64_t base = (slot * p.n_kv_heads + kvh) * dim;
    const T* k_new = q_row + static_cast<std::int64_t>(p.n_q_heads + kvh) * dim;  // q, k, v heads
    const T* v_new = q_row + static_cast<std::int64_t>(p.n_q_heads + p.n_kv_heads + kvh) * dim;
    for (int i = threadIdx.x; i < dim; i += threads) {
      static_cast<T*>(const_cast<void*>(p.k_cache))[base + i] = k_new[i];
      static_cast<T*>(const_cast<void*>(p.v_cache))[base + i] = v_new[i];
    }
    __syncthreads();  // the block's own writes, visible to its reads below
  }
  // The loop bound is the same for the whole warp (shuffles need every lane); lanes past the
  // end compute on zeros and skip the update.
  for (int k0 = k_first; k0 < k_end; k0 += U * keys_per_block) {
    bool valid[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int k = k0 + u * keys_per_block + kg;
      valid[u] = k < k_end;
      if (k0 == k_first && loaded[u]) continue;
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
  if (p.num_splits == 1 || p.tickets == nullptr) return;  // no tickets: attention_merge_kernel

  // The last block of this (row, kv head) to finish merges the splits, in split order
  // (deterministic), instead of a merge kernel after this one (launch_rows says when).
  __shared__ bool s_last;
  __threadfence();  // this block's partials visible device-wide before its ticket says so
  __syncthreads();
  unsigned* ticket = p.tickets + static_cast<std::int64_t>(row) * p.n_kv_heads + kvh;
  if (threadIdx.x == 0) s_last = atomicAdd(ticket, 1u) == static_cast<unsigned>(p.num_splits - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  for (int i = threadIdx.x; i < group * dim; i += threads) {
    const int g = i / dim, d = i % dim, h = kvh * group + g;
    const std::int64_t first = (static_cast<std::int64_t>(row) * p.n_q_heads + h) * p.num_splits;
    const float* ml = p.partial_ml + first * 2;  // (max, sum) pairs
    float mx = -CUDART_INF_F;
    for (int sp = 0; sp < p.num_splits; ++sp) mx = fmaxf(mx, __ldcg(&ml[sp * 2]));
    float sum = 0.0f, val = 0.0f;
    for (int sp = 0; sp < p.num_splits; ++sp) {
      const float ms = __ldcg(&ml[sp * 2]);  // -inf: a split past this row's keys
      const float a = ms == -CUDART_INF_F ? 0.0f : expf(ms - mx);
      sum += __ldcg(&ml[sp * 2 + 1]) * a;
      val += __ldcg(&p.partial_out[(first + sp) * dim + d]) * a;
    }
    T* out = static_cast<T*>(p.out) + row * out_stride + h * dim;
    out[d] = from_f32<T>(sum > 0.0f ? val / sum : 0.0f);
  }
  if (threadIdx.x == 0) *ticket = 0;  // ready for the next launch (graph replays too)
}

// ---- bf16 rows, head_dim 64 or 128: K/V tiles staged in shared memory --------------------
// The register kernel above keeps q, the accumulators and the loaded keys of every q head of
// the group in registers (Qwen3-8B: G = 4, D = 128 -> 234 registers a thread, two blocks an
// SM), so few bytes are in flight per SM: 0.88 TB/s at 128 rows (ncu, 30% of a Qwen3-8B decode
// step) and about as slow after a 16k-token prompt. Here a block copies tiles of tile_keys keys'
// K and V rows into shared memory with cp.async, two tiles deep (the next tile's copies fly while
// this one is used), and registers hold only each thread's few outputs:
// - copies: two threads per K or V row, one block-table lookup each, made one tile ahead so
//   its latency hides behind a tile of work;
// - scores: warp w takes the q heads g = w, w + 4, ...; lane r the key r of the tile (one key
//   per lane: tile_keys == 32), a dot product over D. K rows are stored with their 16-byte
//   pieces XOR-swizzled by the key (piece c of key r at c ^ (r % 8)), so the lanes of a warp
//   read the same logical piece from different banks while the q piece they share is one
//   broadcast read;
// - online softmax: per head, the warp's max and sum of the tile (shuffles), p into shared;
// - P.V: thread t owns output column d = t % D of heads t / D, t / D + threads / D, ...; each V
//   element is read once for all of the thread's heads, p four keys at a time.
// Same split-KV contract and partial format as the register kernel (attention_merge_kernel).
constexpr int tile_keys = 32;

template <int D, int G>
__global__ void __launch_bounds__(threads) attention_tiles_kernel(const AttentionParams p) {
  using T = __nv_bfloat16;
  constexpr int chunks = D * 2 / 16;                      // 16-byte pieces of a key's row
  constexpr int row_threads = threads / (2 * tile_keys);  // threads copying one K or V row
  constexpr int heads_per_warp = (G + num_warps - 1) / num_warps;
  constexpr int outs = (G * D + threads - 1) / threads;  // outputs a thread owns
  static_assert(tile_keys == 32 && threads % D == 0 && chunks % row_threads == 0 && chunks >= 8,
                "one key per lane, D divides the block, whole pieces per copying thread");
  __shared__ __align__(16) T s_kv[2][2][tile_keys][D];  // [stage][K, V][key][dim]
  __shared__ __align__(16) float s_q[G][D];
  __shared__ __align__(16) float s_p[G][tile_keys];
  __shared__ float s_alpha[G], s_m[G], s_l[G];

  grid_dependency_wait();
  const int row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int group = p.n_q_heads / p.n_kv_heads;
  // A decode step (one row per sequence) needs no search: its log2(S) dependent loads would
  // delay every block's first copy.
  const bool one_row_each = p.num_tokens == p.num_seqs && p.max_query_len == 1;
  const int seq = one_row_each ? row : find_sequence(p.query_start, p.num_seqs, row);
  const int q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int n_keys = p.context_lens[seq] - q_len + (row - p.query_start[seq]) + 1;
  const int k_begin = split * p.split_size;
  const int k_end = min(n_keys, k_begin + p.split_size);
  const int n_tiles = k_end > k_begin ? (k_end - k_begin + tile_keys - 1) / tile_keys : 0;

  // This thread's share of the copies: pieces [c_first, c_first + chunks / row_threads) of key
  // row `copy_r` of K (copy_kv 0) or V (1).
  const int copy_row = threadIdx.x / row_threads;
  const int copy_kv = copy_row / tile_keys, copy_r = copy_row % tile_keys;
  const int c_first = threadIdx.x % row_threads * (chunks / row_threads);
  const std::int32_t* table =
      p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const T* cache = static_cast<const T*>(copy_kv ? p.v_cache : p.k_cache);
  auto slot_of = [&](int tile) -> std::int64_t {  // -1: no key there
    const int k = k_begin + tile * tile_keys + copy_r;
    if (tile >= n_tiles || k >= k_end) return -1;
    return static_cast<std::int64_t>(table[k / p.block_size]) * p.block_size + k % p.block_size;
  };
  auto copy_tile = [&](int tile, std::int64_t slot) {
    if (slot >= 0) {
      const T* src = cache + (slot * p.n_kv_heads + kvh) * D;
      T* dst = s_kv[tile & 1][copy_kv][copy_r];
#pragma unroll
      for (int c = c_first; c < c_first + chunks / row_threads; ++c) {
        const int at = copy_kv == 0 ? c ^ (copy_r & 7) : c;  // K swizzled, V as is
        copy_async16(dst + at * 8, src + c * 8);
      }
    }
    copy_async_commit();  // an empty group past the keys keeps the wait counts uniform
  };
  std::int64_t next_slot = slot_of(0);
  if (n_tiles > 0) {
    copy_tile(0, next_slot);
    next_slot = slot_of(1);
  }

  const T* q_row = static_cast<const T*>(p.qkv) + static_cast<std::int64_t>(row) * p.qkv_stride;
  for (int i = threadIdx.x; i < G * D; i += threads) {
    const int g = i / D;
    s_q[g][i % D] = g < group ? to_f32(q_row[(kvh * group + g) * D + i % D]) * p.scale : 0.0f;
  }
  float m[heads_per_warp], l[heads_per_warp];
#pragma unroll
  for (int j = 0; j < heads_per_warp; ++j) m[j] = -CUDART_INF_F, l[j] = 0.0f;
  float acc[outs];
#pragma unroll
  for (int j = 0; j < outs; ++j) acc[j] = 0.0f;
  const int d = threadIdx.x % D;

  for (int tile = 0; tile < n_tiles; ++tile) {
    if (tile + 1 < n_tiles) {
      copy_tile(tile + 1, next_slot);
      next_slot = slot_of(tile + 2);  // consumed next iteration: its latency hides behind this tile
      copy_async_wait<1>();
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // this tile's K/V (and s_q) visible to every thread
    const int n = min(tile_keys, k_end - (k_begin + tile * tile_keys));
    const T(&ks)[tile_keys][D] = s_kv[tile & 1][0];
    const T(&vs)[tile_keys][D] = s_kv[tile & 1][1];
#pragma unroll
    for (int j = 0; j < heads_per_warp; ++j) {
      const int g = warp + j * num_warps;
      if (g >= G) break;
      float s = 0.0f;
#pragma unroll
      for (int c = 0; c < chunks; ++c) {
        float kf[8];
        load_f32<T, 8>(&ks[lane][(c ^ (lane & 7)) * 8], kf);
        const float4 qa = *reinterpret_cast<const float4*>(&s_q[g][c * 8]);
        const float4 qb = *reinterpret_cast<const float4*>(&s_q[g][c * 8 + 4]);
        s += qa.x * kf[0] + qa.y * kf[1] + qa.z * kf[2] + qa.w * kf[3] + qb.x * kf[4] +
             qb.y * kf[5] + qb.z * kf[6] + qb.w * kf[7];
      }
      if (lane >= n) s = -CUDART_INF_F;
      const float mx = fmaxf(m[j], warp_max(s));  // finite: a tile holds at least one key
      const float alpha = expf(m[j] - mx);        // m = -inf at first: alpha = 0
      const float w = lane < n ? expf(s - mx) : 0.0f;
      l[j] = l[j] * alpha + warp_sum(w);
      m[j] = mx;
      s_p[g][lane] = w;
      if (lane == 0) s_alpha[g] = alpha;
    }
    __syncthreads();  // s_p and s_alpha complete
#pragma unroll
    for (int j = 0; j < outs; ++j) {
      const int g = threadIdx.x / D + j * (threads / D);
      if (g < G) acc[j] *= s_alpha[g];
    }
    for (int r0 = 0; r0 < n; r0 += 4) {
      float v[4];
#pragma unroll
      for (int i = 0; i < 4; ++i)
        v[i] = r0 + i < n ? to_f32(vs[r0 + i][d]) : 0.0f;  // never stale rows
#pragma unroll
      for (int j = 0; j < outs; ++j) {
        const int g = threadIdx.x / D + j * (threads / D);
        if (g < G) {
          const float4 w = *reinterpret_cast<const float4*>(&s_p[g][r0]);
          acc[j] += w.x * v[0] + w.y * v[1] + w.z * v[2] + w.w * v[3];
        }
      }
    }
    __syncthreads();  // this stage is free for the copies issued in the next iteration
  }

#pragma unroll
  for (int j = 0; j < heads_per_warp; ++j) {
    const int g = warp + j * num_warps;
    if (g < G && lane == 0) s_m[g] = m[j], s_l[g] = l[j];
  }
  __syncthreads();
  const std::int64_t out_stride = static_cast<std::int64_t>(p.n_q_heads) * D;
#pragma unroll
  for (int j = 0; j < outs; ++j) {
    const int g = threadIdx.x / D + j * (threads / D);
    if (g >= group) continue;
    const int h = kvh * group + g;
    if (p.num_splits == 1) {
      T* out = static_cast<T*>(p.out) + row * out_stride + h * D;
      out[d] = from_f32<T>(s_l[g] > 0.0f ? acc[j] / s_l[g] : 0.0f);
    } else {
      const std::int64_t part =
          (static_cast<std::int64_t>(row) * p.n_q_heads + h) * p.num_splits + split;
      p.partial_out[part * D + d] = acc[j];
      if (d == 0) {
        p.partial_ml[part * 2] = s_m[g];
        p.partial_ml[part * 2 + 1] = s_l[g];
      }
    }
  }
}

// ---- bf16 rows, head_dim 64 or 128, tensor cores (the default) ----------------------------
// The tile kernel above is bound by its shared-memory traffic (every thread re-reads q and p
// from shared memory per key) and by two block barriers per 32-key tile, not by DRAM: ~1.5 TB/s
// on the KV of a 16k context. Here the G q heads of a kv head are the rows of an m16n8k16 MMA
// (padded to 16: rows G .. 15 are zero and never stored; the tensor cores have cycles to spare
// in decode), so K and V are read out of shared memory once per warp by ldmatrix, and q, the
// scores, the online softmax and the output stay in registers (fragments: cuda/mma.cuh):
// - S = Q K^T over a chunk of 16 keys: Q is the A operand (lane l holds q head l / 4 in a0/a2,
//   loaded once from global; a1/a3 are the zero rows 8 .. 15), K rows as stored are B's
//   columns (plain ldmatrix.x4);
// - softmax in base 2 with the scale folded in, per q head a running max and sum; each lane
//   holds head l / 4's scores of keys 2(l%4) + {0, 1, 8, 9}: the chunk max is two shuffles;
// - P V: the two 8-key score tiles, rounded to bf16 pairs, are the A fragment as they lie;
//   ldmatrix.x4.trans of V rows gives B.
// Warps are independent: warp w takes chunks w, w + W, ... of the block's keys (W = 4 warps, 8
// where a block walks a whole short row: launch_warps), each with its
// own ring of `Stages` chunk buffers filled by cp.async (one 64-bit slot offset per key looked
// up a chunk ahead by lane key % 16 and broadcast by shuffles), so the loop has no block
// barrier and (Stages - 1) x 8 KB per warp are in flight while a chunk is used. Keys past the
// split are zero-filled (V must not hold stale NaNs: 0 x NaN is NaN) and masked to -inf.
// The warps' (m, l, O) combine once through shared memory at the end.
// Split-KV without a merge kernel: a row's `active` splits are those holding any of its keys
// (blocks past them return at once). With one, its block writes the output; otherwise each
// writes its partial (O, m, l in base-2 units) and takes a ticket (an atomic per (row, kv
// head)); the block that takes the last ticket merges the active splits in split order (the
// result does not depend on which block is last, so graph replays equal eager steps) and resets
// the ticket to 0 for the next launch, as gemv.cu's in_out kernel does.
// Programmatic dependent launch: the block reads the batch metadata and block table and issues
// the copies of chunks wholly before this step's keys before grid_dependency_wait, so they
// overlap the kernel before it (qk_transform_store writes only this step's keys and q).
// Measured (H200, 2026-12-01, docs/benchmarks.md): the attention of a Qwen3-8B decode step
// after 16k tokens 961 us (2.52 TB/s) against 1937 us for the tile kernel and its merge; 186.8
// against 159.1 tok/s. Three chunk buffers a warp and splits of at least 64 keys measured best
// of 2/3 buffers and 16/64/256 keys.
// Warps a block: 4 (mma_warps), or 8 with two chunk buffers each where a block walks a whole
// short row (launch_warps): that halves each warp's serial chain of chunks over the same keys.
// HeadWarps (batched decode, launch_head_warps): a block holds a row's 8 kv heads instead, warp w
// streaming every chunk of kv head w's split alone (three buffers, one block an SM): a pair's
// blocks of 4 warps each start with dependent metadata, block-table and first-copy round trips
// and end with a block barrier and combine, which at 1024 short pairs (128 rows) leave the
// kernel at ~2.4 TB/s (ncu, 2026-12-02); here each warp's ring streams a whole split, its row's
// splits (attention_rows_split: enough to fill one wave) merged by the last warp to finish.
constexpr int mma_warps = 4;
constexpr int wide_warps = 8;
constexpr int chunk_keys = 16;  // keys a warp takes at once: one k-step of P V

// Bulk (launches without the q/k prologue, XSERV_CUDA_ATTN_BULK, bulk_launch): a chunk's rows are copied
// whole by cp.async.bulk, which cannot swizzle, so they sit bulk_pad elements apart instead (a
// row pitch of D + 8: the 8 rows of an ldmatrix phase start 4 banks apart), and each warp's
// Stages mbarriers follow the rings.
constexpr int bulk_pad = 8;

template <int D, int Stages, int Warps = mma_warps, bool Bulk = false>
struct DecodeLayout {
  static constexpr int pitch = Bulk ? D + bulk_pad : D;        // elements from one key's row to the next
  static constexpr int chunk_elems = chunk_keys * pitch;       // one K or V chunk, bf16
  static constexpr int warp_elems = Stages * 2 * chunk_elems;  // a warp's ring
  static constexpr int rings_bytes = Warps * warp_elems * 2;
  static constexpr int ring_bytes = rings_bytes + (Bulk ? Warps * Stages * 8 : 0);  // + the mbarriers
  // The end-of-block combine: per warp, 8 heads x (D outputs + m + l) floats.
  static constexpr int combine_bytes = Warps * 8 * (D + 2) * 4;
};

// Element offset of 16-byte piece c of key row r in a chunk: swizzled (cp.async copies), or at
// the padded pitch (bulk copies).
template <int D, bool Bulk>
__device__ __forceinline__ int chunk_at(int r, int c) {
  if constexpr (Bulk) return r * (D + bulk_pad) + c * 8;
  else return swz<D>(r, c);
}

// Shared memory of the in-kernel merge: per head and split a weight and a sum, then one float4
// partial per thread.
__host__ __device__ constexpr int merge_floats(int group, int splits) {  // s_w and s_l, float4-aligned
  return (2 * group * splits + 3) / 4 * 4;
}
constexpr int merge_bytes(int group, int splits, int block_threads) {
  return merge_floats(group, splits) * 4 + block_threads * 16;
}

// The end of a HeadWarps warp (one kv head, one split): its state is the whole split's, so it
// writes the output (one active split) or its partial (O, m, l in base-2 units, as the block
// kernel's), and the last warp of the row's kv head to take a ticket merges the active splits in
// split order. Lane l holds head l / 4's columns 8j + 2(l%4) + {0, 1} (rows 8-15 are padding).
template <int D>
__device__ __forceinline__ void head_warp_finish(const AttentionParams& p, const float (&o)[D / 8][4],
                                                 float m, float l, int row, int kvh, int split,
                                                 int active, int lane) {
  using bf16 = __nv_bfloat16;
  const int group = p.n_q_heads / p.n_kv_heads, g = lane >> 2, t4 = lane & 3;
  const std::int64_t out_stride = static_cast<std::int64_t>(p.n_q_heads) * D;
  bf16* out = static_cast<bf16*>(p.out) + row * out_stride + static_cast<std::int64_t>(kvh) * group * D;
  if (active == 1) {
    if (g < group) {
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
      for (int j = 0; j < D / 8; ++j)
        *reinterpret_cast<__nv_bfloat162*>(out + g * D + j * 8 + 2 * t4) =
            __floats2bfloat162_rn(o[j][0] * inv, o[j][1] * inv);
    }
    return;
  }
  const std::int64_t first = static_cast<std::int64_t>(row) * p.n_q_heads + kvh * group;  // head
  if (g < group) {
    const std::int64_t part = (first + g) * p.num_splits + split;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(p.partial_out + part * D + j * 8 + 2 * t4) = make_float2(o[j][0], o[j][1]);
    if (t4 == 0) *reinterpret_cast<float2*>(p.partial_ml + part * 2) = make_float2(m, l);
  }
  __threadfence();  // this warp's partial visible device-wide before its ticket says so
  __syncwarp();
  unsigned* ticket = p.tickets + static_cast<std::int64_t>(row) * p.n_kv_heads + kvh;
  unsigned last = 0;
  if (lane == 0) last = atomicAdd(ticket, 1u) == static_cast<unsigned>(active - 1);
  if (!__shfl_sync(0xffffffffu, last, 0)) return;
  __threadfence();
  // Four columns a lane and step; each output's weights over the active splits (a few).
  for (int idx = lane; idx < group * D / 4; idx += 32) {
    const int h = idx / (D / 4), c = idx % (D / 4) * 4;
    const float2* ml = reinterpret_cast<const float2*>(p.partial_ml) + (first + h) * p.num_splits;
    float mx = -CUDART_INF_F;
    for (int sp = 0; sp < active; ++sp) mx = fmaxf(mx, __ldcg(&ml[sp]).x);
    float sum = 0.0f;
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    for (int sp = 0; sp < active; ++sp) {
      const float2 v = __ldcg(&ml[sp]);
      const float w = v.x == -CUDART_INF_F ? 0.0f : fast_exp2(v.x - mx);
      const float4 part = __ldcg(reinterpret_cast<const float4*>(p.partial_out + ((first + h) * p.num_splits + sp) * D + c));
      sum += w * v.y;
      acc.x += w * part.x, acc.y += w * part.y, acc.z += w * part.z, acc.w += w * part.w;
    }
    const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
    *reinterpret_cast<__nv_bfloat162*>(out + h * D + c) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
    *reinterpret_cast<__nv_bfloat162*>(out + h * D + c + 2) = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
  }
  if (lane == 0) *ticket = 0;  // ready for the next launch (graph replays too)
}

// The q/k prologue of a HeadWarps warp, all of its heads at once (XSERV_CUDA_ATTN_FOLD_AT_ONCE,
// params.fold_at_once): the norm weights and the RoPE cos/sin (one pair per lane and rotation
// pair, shared by every head of the row) before grid_dependency_wait, then every head's values
// (the G q heads, and k and v when this warp writes the row's own key) loaded at once, so the
// prologue waits for one round trip instead of one per head (transform_head's loop did G + 2 in a
// row, which made the folded form slower than qk_transform_store, docs/benchmarks.md). Lane l
// holds elements l + 32 j, so RoPE's partner i + D/2 is the same lane's j + D/64: no staging.
// Rounds exactly as transform_head (same sums in the same order): q into s_qt (bf16), k and v to
// the cache at `slot`. Calls grid_dependency_wait.
template <int D>
__device__ __forceinline__ void head_warp_transform(const QkTransformParams& t, int row, int kvh, int group,
                                                    bool writer, std::int64_t slot, float pos, int lane,
                                                    __nv_bfloat16 (&s_qt)[8][D]) {
  using bf16 = __nv_bfloat16;
  constexpr int per_lane = D / 32, pairs = per_lane / 2;
  const bf16* q_norm = static_cast<const bf16*>(t.q_norm);
  const bf16* k_norm = static_cast<const bf16*>(t.k_norm);
  float qw[per_lane], kw[per_lane], cs[pairs], sn[pairs];
#pragma unroll
  for (int j = 0; j < per_lane; ++j) {
    qw[j] = q_norm ? to_f32(q_norm[lane + 32 * j]) : 0.0f;
    kw[j] = k_norm ? to_f32(k_norm[lane + 32 * j]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < pairs; ++j) {
    const float angle = pos * (t.rope ? t.inv_freq[lane + 32 * j] : 0.0f);
    cs[j] = cosf(angle);
    sn[j] = sinf(angle);
  }
  grid_dependency_wait();
  const int n_q = t.n_q_heads, n_kv = t.n_kv_heads;
  const bf16* qkv_row = static_cast<const bf16*>(t.qkv) + static_cast<std::int64_t>(row) * t.qkv_stride;
  // Heads 0..group-1: q; head 8: k; head 9: v (k and v only when writing).
  float x[10][per_lane];
#pragma unroll
  for (int h = 0; h < 10; ++h) {
    const bool live = h < 8 ? h < group : writer;
    const int col = h < 8 ? (kvh * group + h) * D : h == 8 ? (n_q + kvh) * D : (n_q + n_kv + kvh) * D;
#pragma unroll
    for (int j = 0; j < per_lane; ++j) x[h][j] = live ? to_f32(qkv_row[col + lane + 32 * j]) : 0.0f;
  }
  bf16* k_dst = static_cast<bf16*>(t.k_cache) + (slot * n_kv + kvh) * D;
  bf16* v_dst = static_cast<bf16*>(t.v_cache) + (slot * n_kv + kvh) * D;
#pragma unroll
  for (int h = 0; h < 9; ++h) {
    const bool live = h < 8 ? h < group : writer;
    if (!live) continue;  // warp-uniform
    const bool is_q = h < 8;
    if (is_q ? q_norm != nullptr : k_norm != nullptr) {
      float sq = 0.0f;
#pragma unroll
      for (int j = 0; j < per_lane; ++j) sq += x[h][j] * x[h][j];
      const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(D) + t.norm_eps);
#pragma unroll
      for (int j = 0; j < per_lane; ++j)
        x[h][j] = to_f32(from_f32<bf16>(to_f32(from_f32<bf16>(x[h][j] * rstd)) * (is_q ? qw[j] : kw[j])));
    }
    bf16 out[per_lane];
    if (t.rope) {
#pragma unroll
      for (int j = 0; j < pairs; ++j) {
        const float x1 = x[h][j], x2 = x[h][j + pairs];
        out[j] = from_f32<bf16>(x1 * cs[j] - x2 * sn[j]);
        out[j + pairs] = from_f32<bf16>(x2 * cs[j] + x1 * sn[j]);
      }
    } else {
#pragma unroll
      for (int j = 0; j < per_lane; ++j) out[j] = from_f32<bf16>(x[h][j]);
    }
#pragma unroll
    for (int j = 0; j < per_lane; ++j) {
      if (is_q) s_qt[h][lane + 32 * j] = out[j];
      else k_dst[lane + 32 * j] = out[j];
    }
  }
  if (writer) {
#pragma unroll
    for (int j = 0; j < per_lane; ++j) v_dst[lane + 32 * j] = from_f32<bf16>(x[9][j]);  // exact: read as bf16
  }
}

template <int D, int Stages, bool Fused, int Warps, bool HeadWarps = false, bool Bulk = false>
__global__ void __launch_bounds__(Warps * 32)
    attention_decode_mma_kernel(const QkAttentionParams params) {
  using bf16 = __nv_bfloat16;
  const AttentionParams& p = params.attn;
  using Lay = DecodeLayout<D, Stages, Warps, Bulk>;
  static_assert(!Bulk || !Fused, "bulk copies: without the q/k prologue");
  constexpr int block_threads = Warps * 32;
  constexpr int pieces = D / 8;               // 16-byte pieces of a K or V row
  constexpr int rows_per_copy = 32 / pieces;  // rows one warp-wide cp.async covers (2 or 4)
  constexpr int copies = 2 * chunk_keys / rows_per_copy;  // cp.async per lane and chunk
  constexpr int ksteps = D / 16, dtiles = D / 8;
  static_assert(Stages >= 2 && Lay::combine_bytes <= Lay::ring_bytes, "combine reuses the rings");
  extern __shared__ __align__(128) unsigned char smem_raw[];

  // Before grid_dependency_wait (the kernel before this one, qk_transform_store, may still be
  // running): only what no kernel of this step writes, i.e. the batch metadata and the cached
  // keys before this step's rows.
  // HeadWarps (launch_head_warps): block (row, y, split), warp w takes kv head y * Warps + w and
  // every chunk of the split alone; the warps share nothing (no block barrier).
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.x, kvh = HeadWarps ? blockIdx.y * Warps + warp : blockIdx.y, split = blockIdx.z;
  if (HeadWarps && kvh >= p.n_kv_heads) return;
  const int group = p.n_q_heads / p.n_kv_heads;
  const bool one_row_each = p.num_tokens == p.num_seqs && p.max_query_len == 1;
  const int seq = one_row_each ? row : find_sequence(p.query_start, p.num_seqs, row);
  const int q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int n_keys = p.context_lens[seq] - q_len + (row - p.query_start[seq]) + 1;
  // Splits past this row's keys (a shorter row of the batch) have nothing to do: the merge
  // counts only the `active` ones; a row with one active split writes its output directly.
  // HeadWarps: the row's own keys in num_splits near-equal runs of whole chunks (split_size
  // unused), so every split of a row holds about as many keys whatever the bucket.
  const int split_size =
      HeadWarps ? ((n_keys + p.num_splits - 1) / p.num_splits + chunk_keys - 1) / chunk_keys * chunk_keys
                : p.split_size;
  const int active = (n_keys + split_size - 1) / split_size;
  if (split >= active) return;
  const bool direct = active == 1;
  const int k_begin = split * split_size;
  const int k_end = min(n_keys, k_begin + split_size);
  const int n_chunks = (k_end - k_begin + chunk_keys - 1) / chunk_keys;
  // The split's chunks are dealt to the block's warps in turn (chunk c to warp c % Warps), or all
  // to this warp (HeadWarps).
  constexpr int chunk_warps = HeadWarps ? 1 : Warps;
  const int first_chunk = HeadWarps ? 0 : warp;
  const int my_chunks = n_chunks > first_chunk ? (n_chunks - first_chunk + chunk_warps - 1) / chunk_warps : 0;
  const int cached_end = p.context_lens[seq] - q_len;  // keys written before this step

  // Copies: lane key % 16 looks up the slot of key `lane % 16` of a chunk; copy n moves piece
  // lane % pieces of row n * rows_per_copy + lane / pieces, row 2k the K and 2k + 1 the V of key k.
  bf16* const ring = reinterpret_cast<bf16*>(smem_raw) + warp * Lay::warp_elems;
  // Bulk: this warp's mbarriers, one a buffer; chunk i completes phase (i / Stages) & 1 of
  // bars[i % Stages]. A row of the cache is contiguous (row_bytes), a chunk's rows are not.
  std::uint64_t* const bars = reinterpret_cast<std::uint64_t*>(smem_raw + Lay::rings_bytes) + warp * Stages;
  constexpr unsigned row_bytes = D * 2;
  if constexpr (Bulk) {
    if (lane == 0) {
#pragma unroll
      for (int j = 0; j < Stages; ++j) mbar_init(&bars[j]);
      mbar_init_fence();
    }
    __syncwarp();
  }
  const bf16* kc = static_cast<const bf16*>(p.k_cache);
  const bf16* vc = static_cast<const bf16*>(p.v_cache);
  const std::int32_t* table = p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  const int bs = p.block_size, shift = __ffs(bs) - 1;
  const bool pow2 = (bs & (bs - 1)) == 0;
  // A lane's key of chunk i, its block-table entry (a global load; -1: no key) and the element
  // offset of its K/V row (-1: none). The load and the arithmetic are apart so the key loop can
  // read entries ahead and use them later: a load's first use is where the warp waits for it.
  auto chunk_key = [&](int i) {
    return k_begin + (first_chunk + i * chunk_warps) * chunk_keys + (lane & (chunk_keys - 1));
  };
  auto chunk_block = [&](int i) -> int {
    const int key = chunk_key(i);
    if (i >= my_chunks || key >= k_end) return -1;
    return table[pow2 ? key >> shift : key / bs];
  };
  auto offset_of = [&](int i, int block) -> long long {
    if (block < 0) return -1;
    const int key = chunk_key(i), in_blk = pow2 ? key & (bs - 1) : key % bs;
    return ((static_cast<long long>(block) * bs + in_blk) * p.n_kv_heads + kvh) * D;
  };
  auto chunk_offset = [&](int i) -> long long { return offset_of(i, chunk_block(i)); };
  auto copy_chunk = [&](int i, long long off) {
    if constexpr (Bulk) {
      // Lane l < 16 copies the K row of key l of the chunk, lane 16 + l its V row, one bulk copy
      // each; lane 0 first announces the bytes of the chunk's keys. Keys past the split get
      // zero rows (their scores are masked; P V must not meet stale NaNs).
      if (i < my_chunks) {
        bf16* stage = ring + (i % Stages) * 2 * Lay::chunk_elems;
        const int key0 = k_begin + (first_chunk + i * chunk_warps) * chunk_keys;
        const unsigned n_valid = static_cast<unsigned>(min(chunk_keys, k_end - key0));
        if (lane == 0) mbar_expect_tx(&bars[i % Stages], 2 * n_valid * row_bytes);
        __syncwarp();
        const int key = lane & (chunk_keys - 1), is_v = lane >> 4;
        bf16* dst = stage + is_v * Lay::chunk_elems + key * Lay::pitch;
        if (off >= 0) {
          bulk_copy(dst, (is_v ? vc : kc) + off, row_bytes, &bars[i % Stages]);
        } else {
#pragma unroll
          for (int c = 0; c < pieces; ++c) reinterpret_cast<uint4*>(dst)[c] = make_uint4(0u, 0u, 0u, 0u);
        }
      }
      return;
    }
    if (i < my_chunks) {  // warp-uniform: the shuffles need every lane
      bf16* stage = ring + (i % Stages) * 2 * Lay::chunk_elems;
      const int c = lane % pieces;
#pragma unroll
      for (int n = 0; n < copies; ++n) {
        const int r = n * rows_per_copy + lane / pieces, key = r >> 1, is_v = r & 1;
        const long long o = __shfl_sync(0xffffffffu, off, key);
        const bf16* src = (is_v ? vc : kc) + (o >= 0 ? o + c * 8 : 0);
        copy_async16_zfill(stage + is_v * Lay::chunk_elems + swz<D>(key, c), src, o >= 0);
      }
    }
    copy_async_commit();  // possibly empty: one group per chunk keeps the wait counts uniform
  };
  // The first Stages - 1 chunks: those wholly in the cached prefix before the wait (in order:
  // the commit groups count chunks), the rest after it. The slots of the first Stages chunks
  // (the last one is the key loop's first copy) are looked up at once, so their block-table
  // reads are in flight together rather than one round trip per chunk before the first copy.
  long long first_offs[Stages];
#pragma unroll
  for (int j = 0; j < Stages; ++j) first_offs[j] = chunk_offset(j);
  int issued = 0;  // chunks copied so far
  auto prologue_copies = [&](bool cached_only) {
#pragma unroll
    for (int j = 0; j < Stages - 1; ++j) {  // unrolled: first_offs stays in registers
      if (j != issued) continue;            // copied already, or an earlier chunk stopped here
      const int start = k_begin + (first_chunk + j * chunk_warps) * chunk_keys;
      if (cached_only && j < my_chunks && min(start + chunk_keys, k_end) > cached_end) continue;
      copy_chunk(j, first_offs[j]);
      issued = j + 1;
    }
  };

  // Fused (decode steps only, one row per sequence): this block transforms its G q heads into
  // shared memory itself, and the block whose split holds the row's own key (the last one)
  // writes that key's k and v to the cache, then copies the chunk holding it; the chunks wholly
  // before that key are copied first, while the transform runs (with one split, at short
  // contexts, every block is a writer: its copies would otherwise wait for the transform).
  const int g = lane >> 2, t4 = lane & 3;
  unsigned qf[ksteps][2];
  const bool fold_heads_at_once = params.fold_at_once;
  if constexpr (Fused) {
    // HeadWarps: each warp transforms its own kv head's q heads (and k, v when it writes).
    __shared__ __align__(16) bf16 s_qt_all[HeadWarps ? Warps : 1][8][D];
    __shared__ float s_stage[Warps][D];
    bf16(&s_qt)[8][D] = s_qt_all[HeadWarps ? warp : 0];
    const QkTransformParams& t = params.qk;
    const bool writer = split == (n_keys - 1) / split_size;
    prologue_copies(true);
    const float pos = static_cast<float>(t.positions[row]);  // batch metadata: before the wait
    const std::int64_t slot = t.slot_mapping[row];
    if constexpr (HeadWarps) {
      if (fold_heads_at_once)
        head_warp_transform<D>(t, row, kvh, group, writer, slot, pos, lane, s_qt);
      else
        grid_dependency_wait();
    } else {
      grid_dependency_wait();
    }
    bf16* qkv_row = static_cast<bf16*>(t.qkv) + static_cast<std::int64_t>(row) * t.qkv_stride;
    const bool one_by_one = !HeadWarps || !fold_heads_at_once;
    for (int h = HeadWarps ? 0 : warp; one_by_one && h < group + (writer ? 2 : 0); h += chunk_warps) {  // warp-uniform
      if (h < group) {
        transform_head<bf16>(t, qkv_row + (kvh * group + h) * D, s_qt[h], s_stage[warp],
                             static_cast<const bf16*>(t.q_norm), pos, lane);
      } else if (h == group) {
        transform_head<bf16>(t, qkv_row + (p.n_q_heads + kvh) * D,
                             static_cast<bf16*>(t.k_cache) + (slot * p.n_kv_heads + kvh) * D,
                             s_stage[warp], static_cast<const bf16*>(t.k_norm), pos, lane);
      } else {
        const bf16* src = qkv_row + (p.n_q_heads + p.n_kv_heads + kvh) * D;
        bf16* dst = static_cast<bf16*>(t.v_cache) + (slot * p.n_kv_heads + kvh) * D;
        for (int i = lane; i < D; i += 32) dst[i] = src[i];
      }
    }
    if constexpr (HeadWarps) {
      __threadfence_block();
      __syncwarp();  // q in s_qt; the warp's k/v row visible to its own copies
    } else {
      __syncthreads();  // q in s_qt; the writer's k/v row visible to its own copies
    }
    prologue_copies(false);
#pragma unroll
    for (int k = 0; k < ksteps; ++k) {
      qf[k][0] = g < group ? *reinterpret_cast<const unsigned*>(&s_qt[g][16 * k + 2 * t4]) : 0u;
      qf[k][1] = g < group ? *reinterpret_cast<const unsigned*>(&s_qt[g][16 * k + 8 + 2 * t4]) : 0u;
    }
  } else {
    // Q as A fragments: head g = lane / 4 (zero past the group), columns 16k + 2(l%4) + {0, 1}
    // in a0 and + 8 in a2; rows 8 .. 15 (a1, a3) are zero.
    prologue_copies(true);
    grid_dependency_wait();
    prologue_copies(false);
    const bf16* q_row = static_cast<const bf16*>(p.qkv) + static_cast<std::int64_t>(row) * p.qkv_stride +
                        (kvh * group + g) * D + 2 * t4;
#pragma unroll
    for (int k = 0; k < ksteps; ++k) {
      qf[k][0] = g < group ? *reinterpret_cast<const unsigned*>(q_row + 16 * k) : 0u;
      qf[k][1] = g < group ? *reinterpret_cast<const unsigned*>(q_row + 16 * k + 8) : 0u;
    }
  }
  const float scale_log2 = p.scale * 1.4426950408889634f;
  float o[dtiles][4];
#pragma unroll
  for (int j = 0; j < dtiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m = -CUDART_INF_F, l = 0.0f;

  // The block-table entries of the next copies are read two chunks ahead of their copy: read
  // one iteration ahead and used at once (the offset's arithmetic), the warp waited for the
  // table's L2/DRAM round trip once per chunk (ncu, 2026-12-06: a third of the 8B long-context
  // kernel's stall samples, a quarter of the 128-row one's, on that one instruction).
  long long next_off = first_offs[Stages - 1];
  int ahead[2] = {chunk_block(Stages), chunk_block(Stages + 1)};  // entries of chunks i + Stages, + 1
  for (int i = 0; i < my_chunks; ++i) {
    copy_chunk(i + Stages - 1, next_off);  // into the buffer chunk i - 1 used
    next_off = offset_of(i + Stages, ahead[0]);  // read two iterations ago
    ahead[0] = ahead[1];
    ahead[1] = chunk_block(i + Stages + 2);      // first used two iterations on
    if constexpr (Bulk) {
      mbar_wait(&bars[i % Stages], static_cast<unsigned>(i / Stages) & 1u);  // chunk i has landed
    } else {
      copy_async_wait<Stages - 1>();       // chunk i has landed (this lane's copies)
    }
    __syncwarp();                          // ... and every lane's (and their zero rows)
    const bf16* sk = ring + (i % Stages) * 2 * Lay::chunk_elems;
    const bf16* sv = sk + Lay::chunk_elems;
    float s[2][4] = {};
#pragma unroll
    for (int k = 0; k < ksteps; ++k) {
      unsigned b[4];
      const int key = (lane & 7) + ((lane >> 4) << 3);
      ldsm_x4(smem_addr(sk + chunk_at<D, Bulk>(key, 2 * k + ((lane >> 3) & 1))), b);
      const unsigned a[4] = {qf[k][0], 0u, qf[k][1], 0u};
      mma_bf16(s[0], a, b[0], b[1]);
      mma_bf16(s[1], a, b[2], b[3]);
    }
    const int key0 = k_begin + (first_chunk + i * chunk_warps) * chunk_keys;
    if (key0 + chunk_keys > k_end) {  // the split's last chunk: mask its zero-filled tail
#pragma unroll
      for (int j = 0; j < 2; ++j)
#pragma unroll
        for (int e = 0; e < 2; ++e)
          if (key0 + j * 8 + 2 * t4 + e >= k_end) s[j][e] = -CUDART_INF_F;
    }
    float mx = fmaxf(fmaxf(s[0][0], s[0][1]), fmaxf(s[1][0], s[1][1]));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(m, mx * scale_log2);  // finite: a chunk holds at least one key
    const float alpha = fast_exp2(m - m_new);       // m = -inf at first: 0
    m = m_new;
    // P rounded to bf16 pairs; the sum adds exactly the rounded values that P V multiplies.
    const unsigned p0 = pack_bf16(fast_exp2(fmaf(s[0][0], scale_log2, -m)),
                                  fast_exp2(fmaf(s[0][1], scale_log2, -m)));
    const unsigned p1 = pack_bf16(fast_exp2(fmaf(s[1][0], scale_log2, -m)),
                                  fast_exp2(fmaf(s[1][1], scale_log2, -m)));
    l = l * alpha + (bf16_lo(p0) + bf16_hi(p0) + bf16_lo(p1) + bf16_hi(p1));
    const unsigned a[4] = {p0, 0u, p1, 0u};
    const int key = (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int dp = 0; dp < dtiles / 2; ++dp) {
      unsigned b[4];
      ldsm_x4_trans(smem_addr(sv + chunk_at<D, Bulk>(key, 2 * dp + (lane >> 4))), b);
      o[2 * dp][0] *= alpha;
      o[2 * dp][1] *= alpha;
      o[2 * dp + 1][0] *= alpha;
      o[2 * dp + 1][1] *= alpha;
      mma_bf16(o[2 * dp], a, b[0], b[1]);
      mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
    }
    __syncwarp();  // every lane is done with this buffer before the next copy refills it
  }
  if constexpr (!Bulk) copy_async_wait<0>();  // only empty groups can be left; nothing may land after the combine
  l += __shfl_xor_sync(0xffffffffu, l, 1);
  l += __shfl_xor_sync(0xffffffffu, l, 2);
  if constexpr (HeadWarps) {
    head_warp_finish<D>(p, o, m, l, row, kvh, split, active, lane);
    return;
  }

  // The warps' states through shared memory (the rings are free once every warp is here).
  __syncthreads();
  float* s_o = reinterpret_cast<float*>(smem_raw);  // [warp][8][D]
  float* s_ml = s_o + Warps * 8 * D;                 // [warp][8][2]
#pragma unroll
  for (int j = 0; j < dtiles; ++j)
    *reinterpret_cast<float2*>(&s_o[(warp * 8 + g) * D + j * 8 + 2 * t4]) = make_float2(o[j][0], o[j][1]);
  if (t4 == 0) s_ml[(warp * 8 + g) * 2] = m, s_ml[(warp * 8 + g) * 2 + 1] = l;
  __syncthreads();
  const std::int64_t out_stride = static_cast<std::int64_t>(p.n_q_heads) * D;
  for (int idx = tid; idx < group * D; idx += block_threads) {
    const int h = idx / D, d = idx % D;
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < Warps; ++w) mx = fmaxf(mx, s_ml[(w * 8 + h) * 2]);
    float sum = 0.0f, val = 0.0f;
#pragma unroll
    for (int w = 0; w < Warps; ++w) {
      const float mw = s_ml[(w * 8 + h) * 2];
      const float a = mw == -CUDART_INF_F ? 0.0f : fast_exp2(mw - mx);
      sum += s_ml[(w * 8 + h) * 2 + 1] * a;
      val += s_o[(w * 8 + h) * D + d] * a;
    }
    const int qh = kvh * group + h;
    if (direct) {
      static_cast<bf16*>(p.out)[row * out_stride + qh * D + d] = __float2bfloat16_rn(sum > 0.0f ? val / sum : 0.0f);
    } else {
      const std::int64_t part = (static_cast<std::int64_t>(row) * p.n_q_heads + qh) * p.num_splits + split;
      p.partial_out[part * D + d] = val;
      if (d == 0) {
        p.partial_ml[part * 2] = mx;
        p.partial_ml[part * 2 + 1] = sum;
      }
    }
  }
  if (direct) return;

  // The last block of this (row, kv head) to get here merges every split.
  __shared__ bool s_last;
  __threadfence();  // this block's partial visible device-wide before its ticket says so
  __syncthreads();
  unsigned* ticket = p.tickets + static_cast<std::int64_t>(row) * p.n_kv_heads + kvh;
  if (tid == 0) s_last = atomicAdd(ticket, 1u) == static_cast<unsigned>(active - 1);
  __syncthreads();
  if (!s_last) return;
  __threadfence();
  // Every active split wrote all of its partial; the ones past them are not read.
  const int splits = active;
  float* s_w = reinterpret_cast<float*>(smem_raw);  // [group][splits]: weights, then sums
  float* s_l = s_w + group * splits;                // [group][splits]
  float4* s_part = reinterpret_cast<float4*>(s_w + merge_floats(group, splits));  // [threads]
  const std::int64_t first = static_cast<std::int64_t>(row) * p.n_q_heads + kvh * group;  // head
  for (int idx = tid; idx < group * splits; idx += block_threads) {  // (m, l) of every split at once
    const int h = idx / splits, sp = idx % splits;
    const float2 ml = __ldcg(reinterpret_cast<const float2*>(p.partial_ml) +
                             (first + h) * p.num_splits + sp);
    s_w[idx] = ml.x;
    s_l[idx] = ml.y;
  }
  __syncthreads();
  __shared__ float s_sum[8];
  for (int h = warp; h < group; h += Warps) {  // per head: max, weights, their sum
    float mx = -CUDART_INF_F;
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, s_w[h * splits + s]);
    mx = warp_max(mx);
    float sum = 0.0f;
    for (int s = lane; s < splits; s += 32) {
      const float ms = s_w[h * splits + s];
      const float w = ms == -CUDART_INF_F ? 0.0f : fast_exp2(ms - mx);
      s_w[h * splits + s] = w;
      sum += w * s_l[h * splits + s];
    }
    sum = warp_sum(sum);
    if (lane == 0) s_sum[h] = sum;
  }
  __syncthreads();
  // Outputs as float4s: `outs` of them, each summed over `slices` interleaved sets of splits
  // (more slices when the group is small, so every thread has loads in flight).
  const int outs = group * D / 4;
  const int slices = max(1, block_threads / outs);
  const int slice = tid / outs;
  for (int oi = tid % outs; oi < outs && slice < slices; oi += block_threads) {
    const int h = oi / (D / 4);
    const float4* part = reinterpret_cast<const float4*>(p.partial_out + (first + h) * p.num_splits * D) + oi % (D / 4);
    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll 8
    for (int s = slice; s < splits; s += slices) {  // no branch: the loads of 8 splits in flight
      const float w = s_w[h * splits + s];
      const float4 v = __ldcg(part + static_cast<std::int64_t>(s) * (D / 4));
      acc.x += w * v.x, acc.y += w * v.y, acc.z += w * v.z, acc.w += w * v.w;
    }
    if (slices == 1) {
      const float inv = s_sum[h] > 0.0f ? 1.0f / s_sum[h] : 0.0f;
      bf16* out = static_cast<bf16*>(p.out) + row * out_stride + (kvh * group) * D + oi * 4;
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
      *reinterpret_cast<__nv_bfloat162*>(out + 2) = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
    } else {
      s_part[tid] = acc;
    }
  }
  if (slices > 1) {
    __syncthreads();
    if (tid < outs) {
      float4 acc = s_part[tid];
      for (int sl = 1; sl < slices; ++sl) {  // in slice order: deterministic
        const float4 v = s_part[sl * outs + tid];
        acc.x += v.x, acc.y += v.y, acc.z += v.z, acc.w += v.w;
      }
      const int h = tid / (D / 4);
      const float inv = s_sum[h] > 0.0f ? 1.0f / s_sum[h] : 0.0f;
      bf16* out = static_cast<bf16*>(p.out) + row * out_stride + (kvh * group) * D + tid * 4;
      *reinterpret_cast<__nv_bfloat162*>(out) = __floats2bfloat162_rn(acc.x * inv, acc.y * inv);
      *reinterpret_cast<__nv_bfloat162*>(out + 2) = __floats2bfloat162_rn(acc.z * inv, acc.w * inv);
    }
  }
  if (tid == 0) *ticket = 0;  // ready for the next launch (graph replays too)
}

// ---- Short-context decode in one pass (XSERV_CUDA_ATTN_SHORT, the short-context rule's path) ----
// The folded mma kernel above, at batch 1 over ~140 keys, is a chain of latencies after its
// grid_dependency_wait: the q/k transform (a load of the head, its norm weights and RoPE
// frequencies, sincos, a staging round through shared memory), a block barrier, the copy of the
// chunk holding the row's own key (written to the cache by another warp, read back through L2),
// one or two chunks a warp walked one after the other (an online-softmax rescale between them),
// then two block barriers around the combine. Here, for one-split launches over a bucket of at
// most short_context_keys keys (16 chunks of 16), a block of short_warps warps (grid (rows, kv
// heads)) holds the whole row in shared memory and:
// - before the wait: looks up every key's slot (lanes 0-15 the keys of chunk w, lanes 16-31
//   those of chunk w + 8: one block-table round trip) and copies every key cached before this
//   step, both of a warp's chunks (the second copied after the wait lost 3.5% on the 0.6B:
//   docs/benchmarks.md), zero-filling keys past the row; loads its lane's q/k norm weights and
//   computes cos/sin of its RoPE angles (the position is batch metadata);
// - after it: every warp transforms the group's q heads itself (one load round trip, the
//   rotation pairs in-lane: transform_lane), so no barrier stands between the transform and the
//   scores; the warp holding the own key's chunk also transforms k and copies v, into its chunk
//   in shared memory (and into the cache for later steps) rather than reading them back;
// - scores of its one or two chunks (up to 32 keys) at once, one softmax over them (no rescale),
//   P V over both;
// - its (m, l, O) into its own chunk buffers (no barrier to free them), one block barrier, and
//   the combine over the warps in warp order (deterministic: graph replays equal eager steps).
// Same fragments, masks and roundings as the mma kernel (P rounded to bf16, the sum of the
// rounded values; base-2 softmax with the scale folded in).
constexpr int short_warps = 8;
constexpr int short_chunks = short_context_keys / chunk_keys;  // 16: two a warp
static_assert(short_chunks == 2 * short_warps, "two chunks a warp");

template <int D>
struct ShortLayout {
  static constexpr int chunk_elems = chunk_keys * D;        // one K or V chunk, bf16
  static constexpr int warp_elems = 2 * 2 * chunk_elems;    // a warp's two chunks, K and V
  static constexpr int kv_bytes = short_warps * warp_elems * 2;
  // Then each warp's copy of the group's transformed q heads, group x D bf16.
  static constexpr int smem_bytes(int group) { return kv_bytes + short_warps * group * D * 2; }
  // The combine reuses a warp's chunk buffers: 8 rows x D outputs + (m, l) of 8 rows, f32.
  static_assert((8 * D + 16) * 4 <= warp_elems * 2, "the combine fits a warp's buffers");
};

// a * b in 64 bits from 32-bit operands: one IMAD.WIDE (a 64-bit multiply of the two widened
// values, which the compiler emits when it hoists the widening out of a loop, takes several).
__device__ __forceinline__ long long mul_wide(int a, int b) {
  long long r;
  asm("mul.wide.s32 %0, %1, %2;" : "=l"(r) : "r"(a), "r"(b));
  return r;
}

template <int D>
__global__ void __launch_bounds__(short_warps * 32, 1)
    attention_decode_short_kernel(const QkAttentionParams params) {
  using bf16 = __nv_bfloat16;
  using Lay = ShortLayout<D>;
  const AttentionParams& p = params.attn;
  const QkTransformParams& t = params.qk;
  constexpr int pieces = D / 8;               // 16-byte pieces of a K or V row
  constexpr int rows_per_copy = 32 / pieces;  // rows one warp-wide cp.async covers (2 or 4)
  constexpr int copies = 2 * chunk_keys / rows_per_copy;  // cp.async per lane and chunk
  constexpr int ksteps = D / 16, dtiles = D / 8, per_lane = D / 32, pairs = D / 64;
  extern __shared__ __align__(128) unsigned char smem_raw[];

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int row = blockIdx.x, kvh = blockIdx.y;
  const int group = p.n_q_heads / p.n_kv_heads;
  const bool one_row_each = p.num_tokens == p.num_seqs && p.max_query_len == 1;
  const int seq = one_row_each ? row : find_sequence(p.query_start, p.num_seqs, row);
  const int q_len = p.query_start[seq + 1] - p.query_start[seq];
  const int n_keys = p.context_lens[seq] - q_len + (row - p.query_start[seq]) + 1;
  const int own = n_keys - 1;  // this step's key: its k and v come from the transform
  const int n_chunks = (n_keys + chunk_keys - 1) / chunk_keys;  // <= short_chunks (the launch's rule)
  const int mine = (n_chunks > warp) + (n_chunks > warp + short_warps);  // chunks w, w + 8
  const bool owner = mine > 0 && own / chunk_keys % short_warps == warp;
  bf16* const region = reinterpret_cast<bf16*>(smem_raw) + warp * Lay::warp_elems;  // [chunk][K, V][16][D]
  bf16* const s_q = reinterpret_cast<bf16*>(smem_raw + Lay::kv_bytes) + warp * group * D;  // [group][D]
  const std::int64_t out_stride = static_cast<std::int64_t>(p.n_q_heads) * D;
  bf16* const out = static_cast<bf16*>(p.out) + row * out_stride + static_cast<std::int64_t>(kvh) * group * D;

  // Slots: lane l looks up key l % 16 of chunk w + 8 (l / 16): its cache slot (an int32, as
  // slot_mapping's), -1 past the row (zero-filled), -2 the own key (written by the transform,
  // not copied).
  int key_slot = -1;
  {
    const int key = (warp + short_warps * (lane >> 4)) * chunk_keys + (lane & (chunk_keys - 1));
    const std::int32_t* table = p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
    const int bs = p.block_size;
    if (key == own) {
      key_slot = -2;
    } else if (key < own) {
      const bool pow2 = (bs & (bs - 1)) == 0;
      const int blk = pow2 ? key >> (__ffs(bs) - 1) : key / bs, in_blk = pow2 ? key & (bs - 1) : key % bs;
      key_slot = table[blk] * bs + in_blk;
    }
  }
  // The copies' addresses from the 32-bit slots and per-lane constants: copy n moves piece
  // `piece` of row n * rows_per_copy + lane / pieces of the chunk's [key][K, V] rows, i.e. of key
  // n * rows_per_copy / 2 + key_in_copy, so a copy is a shuffle of that key's slot, one
  // multiply-add into the lane's base pointer and the cp.async at a precomputed shared address.
  // (Shuffling a 64-bit element offset and comparing and selecting it in 64 bits took ~34
  // instructions a copy where this takes ~17: ncu on an H100, 2026-12-07, the batch-1 Qwen3-0.6B
  // launch 9.18 -> 8.10 us, its warps' instructions before the copies are issued 744 -> 403;
  // Qwen3-0.6B decode +1.7% at batch 1: docs/benchmarks.md, "The one-pass attention's lean
  // copies".)
  const int piece = lane % pieces, lane_is_v = (lane / pieces) & 1, key_in_copy = lane / pieces >> 1;
  const unsigned char* lane_src = static_cast<const unsigned char*>(lane_is_v ? p.v_cache : p.k_cache) +
                                  (static_cast<long long>(kvh) * D + piece * 8) * 2;
  const int slot_bytes = p.n_kv_heads * D * 2;  // one slot's K (or V) of every kv head
  auto copy_chunk = [&](int j) {  // warp-uniform: the shuffles need every lane
    const unsigned stage = smem_addr(region + (2 * j + lane_is_v) * Lay::chunk_elems);
#pragma unroll
    for (int n = 0; n < copies; ++n) {
      const int key = n * (rows_per_copy / 2) + key_in_copy;
      const int s = __shfl_sync(0xffffffffu, key_slot, j * chunk_keys + key);
      const unsigned char* src = lane_src + mul_wide(max(s, 0), slot_bytes);
      if (s != -2) copy_async16_zfill_at(stage + swz<D>(key, piece) * 2, src, s >= 0);
    }
  };
  if (mine > 0) copy_chunk(0);
  if (mine > 1) copy_chunk(1);
  copy_async_commit();

  // The transform's inputs that no kernel of this step writes.
  const float pos = static_cast<float>(t.positions[row]);
  const std::int64_t slot = t.slot_mapping[row];
  const bool norm = t.q_norm != nullptr;  // Qwen3: both norms or neither
  float qw[per_lane], kw[per_lane], cs[pairs], sn[pairs];
#pragma unroll
  for (int j = 0; j < per_lane; ++j) {
    qw[j] = norm ? to_f32(static_cast<const bf16*>(t.q_norm)[lane + 32 * j]) : 0.0f;
    kw[j] = t.k_norm != nullptr ? to_f32(static_cast<const bf16*>(t.k_norm)[lane + 32 * j]) : 0.0f;
  }
#pragma unroll
  for (int j = 0; j < pairs; ++j) {
    const float angle = t.rope ? pos * t.inv_freq[lane + 32 * j] : 0.0f;
    cs[j] = cosf(angle);
    sn[j] = sinf(angle);
  }

  grid_dependency_wait();
  // params.l2_next (the o_proj's weight) into L2, a slice a warp, once the warp's own loads of
  // the step are out: after the wait only this kernel's arithmetic and a few KB of q/k/v rows
  // remain, so DRAM would idle until the o_proj's blocks (which cannot become resident beside
  // this kernel's) start their own round trips.
  const auto ask_next = [&] {
    if (lane == 0 && params.l2_next.bytes > 0)
      prefetch_slice_l2(static_cast<const unsigned char*>(params.l2_next.data), params.l2_next.bytes,
                        (blockIdx.y * gridDim.x + blockIdx.x) * short_warps + warp,
                        gridDim.x * gridDim.y * short_warps);
  };
  if (mine == 0) ask_next();

  const int g = lane >> 2, t4 = lane & 3;
  unsigned qf[ksteps][2];
  float o[dtiles][4];
#pragma unroll
  for (int j = 0; j < dtiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m = -CUDART_INF_F, l = 0.0f;
  if (mine > 0) {  // warp-uniform
    // The group's q heads (and, for the owner, k and v): every load first, one round trip.
    const bf16* qkv_row = static_cast<const bf16*>(t.qkv) + static_cast<std::int64_t>(row) * t.qkv_stride;
    float x[8][per_lane], xk[per_lane];
    bf16 xv[per_lane];
#pragma unroll
    for (int h = 0; h < 8; ++h)
      if (h < group)
#pragma unroll
        for (int j = 0; j < per_lane; ++j) x[h][j] = to_f32(qkv_row[(kvh * group + h) * D + lane + 32 * j]);
    if (owner) {
#pragma unroll
      for (int j = 0; j < per_lane; ++j) {
        xk[j] = to_f32(qkv_row[(p.n_q_heads + kvh) * D + lane + 32 * j]);
        xv[j] = qkv_row[(p.n_q_heads + p.n_kv_heads + kvh) * D + lane + 32 * j];
      }
    }
#pragma unroll
    for (int h = 0; h < 8; ++h) {
      if (h < group) {
        transform_lane<bf16, D>(x[h], qw, cs, sn, norm, t.rope, t.norm_eps);
#pragma unroll
        for (int j = 0; j < per_lane; ++j) s_q[h * D + lane + 32 * j] = __float2bfloat16_rn(x[h][j]);
      }
    }
    if (owner) {
      transform_lane<bf16, D>(xk, kw, cs, sn, t.k_norm != nullptr, t.rope, t.norm_eps);
      const int j_own = own / chunk_keys >= short_warps ? 1 : 0, r_own = own % chunk_keys;
      bf16* sk = region + j_own * 2 * Lay::chunk_elems;
      bf16* sv = sk + Lay::chunk_elems;
      bf16* gk = static_cast<bf16*>(t.k_cache) + (slot * p.n_kv_heads + kvh) * D;
      bf16* gv = static_cast<bf16*>(t.v_cache) + (slot * p.n_kv_heads + kvh) * D;
#pragma unroll
      for (int j = 0; j < per_lane; ++j) {
        const int i = lane + 32 * j;
        const bf16 kb = __float2bfloat16_rn(xk[j]);
        sk[swz<D>(r_own, i >> 3) + (i & 7)] = kb;
        sv[swz<D>(r_own, i >> 3) + (i & 7)] = xv[j];
        gk[i] = kb;
        gv[i] = xv[j];
      }
    }
    __syncwarp();  // q (and the own k/v) visible to the warp's lanes
    ask_next();
#pragma unroll
    for (int k = 0; k < ksteps; ++k) {
      qf[k][0] = g < group ? *reinterpret_cast<const unsigned*>(&s_q[g * D + 16 * k + 2 * t4]) : 0u;
      qf[k][1] = g < group ? *reinterpret_cast<const unsigned*>(&s_q[g * D + 16 * k + 8 + 2 * t4]) : 0u;
    }
    copy_async_wait<0>();
    __syncwarp();  // every lane's copies landed

    // Scores of both chunks at once: s[2 j + n] is n-tile n (keys 8n ..) of chunk j.
    float s[4][4] = {};
#pragma unroll
    for (int k = 0; k < ksteps; ++k) {
      const int key = (lane & 7) + ((lane >> 4) << 3);
      const unsigned a[4] = {qf[k][0], 0u, qf[k][1], 0u};
      unsigned b[4];
      ldsm_x4(smem_addr(region + swz<D>(key, 2 * k + ((lane >> 3) & 1))), b);
      mma_bf16(s[0], a, b[0], b[1]);
      mma_bf16(s[1], a, b[2], b[3]);
      if (mine > 1) {
        ldsm_x4(smem_addr(region + 2 * Lay::chunk_elems + swz<D>(key, 2 * k + ((lane >> 3) & 1))), b);
        mma_bf16(s[2], a, b[0], b[1]);
        mma_bf16(s[3], a, b[2], b[3]);
      }
    }
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      const int key0 = (warp + short_warps * (n >> 1)) * chunk_keys + (n & 1) * 8 + 2 * t4;
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (n >= 2 * mine || key0 + e >= n_keys) s[n][e] = -CUDART_INF_F;
        mx = fmaxf(mx, s[n][e]);
      }
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float scale_log2 = p.scale * 1.4426950408889634f;
    m = mx * scale_log2;  // finite: chunk w holds at least one key
    unsigned pp[4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
      pp[n] = pack_bf16(fast_exp2(fmaf(s[n][0], scale_log2, -m)), fast_exp2(fmaf(s[n][1], scale_log2, -m)));
      l += bf16_lo(pp[n]) + bf16_hi(pp[n]);
    }
    const int vkey = (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      if (j < mine) {
        const unsigned a[4] = {pp[2 * j], 0u, pp[2 * j + 1], 0u};
        const bf16* sv = region + j * 2 * Lay::chunk_elems + Lay::chunk_elems;
#pragma unroll
        for (int dp = 0; dp < dtiles / 2; ++dp) {
          unsigned b[4];
          ldsm_x4_trans(smem_addr(sv + swz<D>(vkey, 2 * dp + (lane >> 4))), b);
          mma_bf16(o[2 * dp], a, b[0], b[1]);
          mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
  }
  copy_async_wait<0>();  // nothing may land in the buffers the combine reuses
  __syncwarp();          // every lane is done with this warp's buffers

  // (m, l, O) of the warp's rows into its own buffers, then across warps in warp order.
  float* s_o = reinterpret_cast<float*>(region);  // [8][D], then (m, l) of 8 rows
#pragma unroll
  for (int j = 0; j < dtiles; ++j)
    *reinterpret_cast<float2*>(&s_o[g * D + j * 8 + 2 * t4]) = make_float2(o[j][0], o[j][1]);
  if (t4 == 0) s_o[8 * D + 2 * g] = m, s_o[8 * D + 2 * g + 1] = l;
  __syncthreads();
  for (int idx = tid; idx < group * D; idx += short_warps * 32) {
    const int h = idx / D, d = idx % D;
    float mw[short_warps];
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int w = 0; w < short_warps; ++w) {
      mw[w] = reinterpret_cast<const float*>(smem_raw + static_cast<std::size_t>(w) * Lay::warp_elems * 2)[8 * D + 2 * h];
      mx = fmaxf(mx, mw[w]);
    }
    float sum = 0.0f, val = 0.0f;
#pragma unroll
    for (int w = 0; w < short_warps; ++w) {
      const float* so = reinterpret_cast<const float*>(smem_raw + static_cast<std::size_t>(w) * Lay::warp_elems * 2);
      const float a = mw[w] == -CUDART_INF_F ? 0.0f : fast_exp2(mw[w] - mx);
      sum += so[8 * D + 2 * h + 1] * a;
      val += so[h * D + d] * a;
    }
    out[h * D + d] = __float2bfloat16_rn(sum > 0.0f ? val / sum : 0.0f);
  }
}

// Combines the splits of one (row, head): grid (T, n_q_heads), merge_threads threads. Long
// contexts have a hundred splits and more, so the loops over splits run across the block (a
// loop of dependent L2 round trips per thread took ~0.5 us a split): the maxima and weights in
// parallel, then head_dim columns x (merge_threads / head_dim) slices of the splits, each slice
// with several loads in flight, the slices summed through shared memory.
constexpr int merge_threads = 512;
constexpr int max_splits = 512;

template <typename T>
__global__ void __launch_bounds__(merge_threads) attention_merge_kernel(const AttentionParams p) {
  __shared__ float s_w[max_splits];
  __shared__ float s_scratch[32];
  __shared__ float s_acc[merge_threads];
  grid_dependency_wait();
  const int row = blockIdx.x, h = blockIdx.y, dim = p.head_dim, splits = p.num_splits;
  const std::int64_t first = (static_cast<std::int64_t>(row) * p.n_q_heads + h) * splits;
  const float* ml = p.partial_ml + first * 2;
  float mx = -CUDART_INF_F;
  for (int s = threadIdx.x; s < splits; s += merge_threads) mx = fmaxf(mx, ml[s * 2]);
  mx = block_max(mx, s_scratch);
  float sum = 0.0f;
  for (int s = threadIdx.x; s < splits; s += merge_threads) {
    const float ms = ml[s * 2];  // -inf: a split past this row's keys
    const float a = ms == -CUDART_INF_F ? 0.0f : expf(ms - mx);
    s_w[s] = a;
    sum += ml[s * 2 + 1] * a;
  }
  sum = block_sum(sum, s_scratch);  // its barriers also publish s_w
  const int slices = merge_threads / dim, slice = threadIdx.x / dim, d = threadIdx.x % dim;
  float val = 0.0f;
  if (slice < slices) {
    const float* part = p.partial_out + first * dim + d;
#pragma unroll 8
    for (int s = slice; s < splits; s += slices)
      val += part[static_cast<std::int64_t>(s) * dim] * s_w[s];
  }
  s_acc[threadIdx.x] = val;
  __syncthreads();
  if (threadIdx.x < dim) {
    for (int i = 1; i < slices; ++i) val += s_acc[i * dim + threadIdx.x];
    T* out = static_cast<T*>(p.out) + (static_cast<std::int64_t>(row) * p.n_q_heads + h) * dim;
    out[threadIdx.x] = from_f32<T>(sum > 0.0f ? val / sum : 0.0f);
  }
}

// The register kernel merges its splits in its last block (one kernel fewer a layer: GPT-2 f32
// decode, ~3.7 us a layer) when there are tickets and at most rows_merge_splits splits (each
// thread of that block walks every split of its outputs); otherwise, or with
// XSERV_CUDA_ATTN_MERGE_KERNEL=1 (read at every call), attention_merge_kernel follows it.
constexpr int rows_merge_splits = 64;

bool rows_merge_kernel() noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_MERGE_KERNEL");
  return env != nullptr && std::string_view(env) == "1";
}

bool rows_early_kv() noexcept {
  static const bool on = [] {
    const char* env = std::getenv("XSERV_CUDA_ATTN_EARLY_KV");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return on;
}

template <typename T, int D, int G>
void launch_rows(cudaStream_t stream, const AttentionParams& p) {
  const dim3 grid(p.num_tokens, p.n_kv_heads, p.num_splits);
  AttentionParams rp = p;
  rp.early_kv = rows_early_kv();
  const bool in_kernel = p.tickets != nullptr && p.num_splits <= rows_merge_splits && !rows_merge_kernel();
  if (!in_kernel) rp.tickets = nullptr;
  launch_pdl(attention_rows_kernel<T, D, G>, grid, dim3(threads), 0, stream, rp);
  if (p.num_splits > 1 && !in_kernel)
    launch_pdl(attention_merge_kernel<T>, dim3(p.num_tokens, p.n_q_heads), dim3(merge_threads), 0,
               stream, p);
}

template <typename T, int D>
void launch_rows_dim(cudaStream_t stream, const AttentionParams& p) {
  const int group = p.n_q_heads / p.n_kv_heads;
  if (group <= 1) launch_rows<T, D, 1>(stream, p);
  else if (group <= 2) launch_rows<T, D, 2>(stream, p);
  else if (group <= 4) launch_rows<T, D, 4>(stream, p);
  else launch_rows<T, D, 8>(stream, p);
}

template <int D>
void launch_tiles_dim(cudaStream_t stream, const AttentionParams& p) {
  const int group = p.n_q_heads / p.n_kv_heads;
  const dim3 grid(p.num_tokens, p.n_kv_heads, p.num_splits);
  if (group <= 1)
    launch_pdl(attention_tiles_kernel<D, 1>, grid, dim3(threads), 0, stream, p);
  else if (group <= 2)
    launch_pdl(attention_tiles_kernel<D, 2>, grid, dim3(threads), 0, stream, p);
  else if (group <= 4)
    launch_pdl(attention_tiles_kernel<D, 4>, grid, dim3(threads), 0, stream, p);
  else
    launch_pdl(attention_tiles_kernel<D, 8>, grid, dim3(threads), 0, stream, p);
  if (p.num_splits > 1)
    launch_pdl(attention_merge_kernel<__nv_bfloat16>, dim3(p.num_tokens, p.n_q_heads),
               dim3(merge_threads), 0, stream, p);
}

bool use_tiles(DType dt, std::int32_t head_dim) noexcept {
  static const bool enabled = [] {
    const char* env = std::getenv("XSERV_CUDA_ATTN_TILES");
    return env == nullptr || std::string_view(env) != "0";
  }();
  return enabled && dt == DType::bf16 && (head_dim == 64 || head_dim == 128);
}

// Blocks of the tile kernel resident on one SM (shared memory bounds it, not registers), per
// head_dim (64, 128) and group bucket (1, 2, 4, 8); asked once.
int tiles_blocks_per_sm(std::int32_t head_dim, std::int32_t group) {
  static const auto table = [] {
    std::array<std::array<int, 4>, 2> t{};
    const auto query = [](auto kernel) {
      int blocks = 0;
      XSERV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, threads, 0));
      return std::max(blocks, 1);
    };
    t[0] = {query(attention_tiles_kernel<64, 1>), query(attention_tiles_kernel<64, 2>),
            query(attention_tiles_kernel<64, 4>), query(attention_tiles_kernel<64, 8>)};
    t[1] = {query(attention_tiles_kernel<128, 1>), query(attention_tiles_kernel<128, 2>),
            query(attention_tiles_kernel<128, 4>), query(attention_tiles_kernel<128, 8>)};
    return t;
  }();
  const int g = group <= 1 ? 0 : group <= 2 ? 1 : group <= 4 ? 2 : 3;
  return table[head_dim == 64 ? 0 : 1][static_cast<std::size_t>(g)];
}

// Where use_tiles holds: the mma kernel unless XSERV_CUDA_ATTN_MMA=0 (the tile kernel and its
// merge, for before/after comparisons). Read at every call, as the prefill switches are, so the
// tests cover both kernels in one process; a recorded graph keeps the kernels it was recorded with.
bool use_mma() noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_MMA");
  return env == nullptr || std::string_view(env) != "0";
}

int device_sm_count() {
  static const int sm_count = [] {
    int device = 0, n = 0;
    XSERV_CUDA_CHECK(cudaGetDevice(&device));
    XSERV_CUDA_CHECK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device));
    return std::max(n, 1);
  }();
  return sm_count;
}

// "Few rows": the batch's (row, kv head) pairs, one block each, fill less than half the SMs
// (batch 1 and small batches of every Qwen3). Such launches keep the deeper ring
// (launch_stages).
bool few_decode_rows(std::int64_t rows_x_kv_heads, int sm_count) noexcept {
  return 2 * rows_x_kv_heads < sm_count;
}

// One wave of whole rows: the pairs fit one block an SM (16 rows of Qwen3's 8 kv heads on the
// H200's 132 SMs). Where a block walks a whole row (one split), such launches take wide_warps
// (launch_warps), and over a short context they are the short-context rule
// (short_context_decode).
bool one_wave_of_rows(std::int64_t rows_x_kv_heads, int sm_count) noexcept {
  return rows_x_kv_heads <= sm_count;
}

// Tuning, read at every call: chunk buffers per warp (XSERV_CUDA_ATTN_STAGES, 2 .. 4; unset: 0,
// chosen per launch by launch_stages) and the keys a split holds at least
// (XSERV_CUDA_ATTN_SPLIT_KEYS, a multiple of 16, default 64: one chunk per warp).
int mma_stages() noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_STAGES");
  const int v = env ? std::atoi(env) : 0;
  return v >= 2 && v <= 4 ? v : 0;
}

// The ring depth of one launch when XSERV_CUDA_ATTN_STAGES does not force one. Three chunk
// buffers a warp (96 KB a block at head_dim 128, two blocks an SM) keep long splits streaming
// (batch 1 after 16k keys); once the batch's rows alone give half a wave of (row, kv head) pairs
// (batched decode: hundreds of blocks of one or a few chunks per warp, one block per pair and
// split), two buffers (64 KB, three blocks an SM) let more blocks overlap their first copies and
// their merges with each other's streaming: Qwen3-1.7B decode at 16 / 64 / 128 rows 1.91 / 2.25 /
// 2.87 -> 1.84 / 2.24 / 2.83 ms a step (docs/benchmarks.md, "Batched decode steps"; at 16 rows
// 384-512 blocks meet a 264-block wave at 3 buffers, 396 at 2). Splits are sized for the
// 3-buffer wave either way (attention_rows_split), so the batch-1 launch shapes are unchanged.
int launch_stages(const AttentionParams& p) {
  const int forced = mma_stages();
  if (forced != 0) return forced;
  return few_decode_rows(static_cast<std::int64_t>(p.num_tokens) * p.n_kv_heads, device_sm_count()) ? 3 : 2;
}
// XSERV_CUDA_ATTN_SPLIT_KEYS when it is set to a multiple of 16, else 0 (the rules decide).
std::int32_t mma_split_keys_forced() noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_SPLIT_KEYS");
  const int v = env ? std::atoi(env) : 0;
  return v >= chunk_keys && v % chunk_keys == 0 ? v : 0;
}
std::int32_t mma_split_keys() noexcept {
  const std::int32_t forced = mma_split_keys_forced();
  return forced != 0 ? forced : 64;
}

// The fewest keys a split of the register kernel holds (XSERV_CUDA_ATTN_ROWS_SPLIT_KEYS, a
// multiple of 16), read at every call. 32 (two passes of a block's warps) rather than 16: fewer
// splits make the last block's merge shorter, and GPT-2 f32 decode at batch 1 measured 2717 /
// 2727 -> 2825 / 2799 tok/s after 128 tokens and 2458 / 2416 -> 2501 / 2534 after 1000
// (64 keys: 2777 / 2764 and 2526 / 2525; 128: slower; docs/benchmarks.md, "GPT-2 decode launch
// shapes").
constexpr int default_rows_split_keys = 32;
std::int32_t rows_split_keys() noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_ROWS_SPLIT_KEYS");
  const int v = env ? std::atoi(env) : default_rows_split_keys;
  return v >= 16 && v % 16 == 0 ? v : default_rows_split_keys;
}

// The largest dynamic shared memory a launch of the mma kernel asks for: its rings, or the merge
// of max_splits splits of 8 heads.
template <int D, int Stages, int Warps, bool Bulk = false>
constexpr int mma_max_smem() {
  // The end-of-kernel merge reuses the rings, never the bulk form's mbarriers after them.
  static_assert(!Bulk || merge_bytes(8, max_splits, Warps * 32) <= DecodeLayout<D, Stages, Warps, Bulk>::rings_bytes);
  return std::max(DecodeLayout<D, Stages, Warps, Bulk>::ring_bytes, merge_bytes(8, max_splits, Warps * 32));
}

template <int D, int Stages, bool Fused = false, int Warps = mma_warps, bool HeadWarps = false, bool Bulk = false>
auto mma_kernel_configured() {
  static const auto kernel = [] {
    auto* k = attention_decode_mma_kernel<D, Stages, Fused, Warps, HeadWarps, Bulk>;
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          mma_max_smem<D, Stages, Warps, Bulk>()));
    return k;
  }();
  return kernel;
}

template <int D, int Stages>
int mma_blocks_per_sm_of() {
  static const int blocks = [] {
    int b = 0;
    XSERV_CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(
        &b, mma_kernel_configured<D, Stages>(), mma_warps * 32, DecodeLayout<D, Stages>::ring_bytes));
    return std::max(b, 1);
  }();
  return blocks;
}

int mma_blocks_per_sm(std::int32_t head_dim, int stages) {
  if (head_dim == 64) {
    return stages == 2 ? mma_blocks_per_sm_of<64, 2>()
                       : stages == 3 ? mma_blocks_per_sm_of<64, 3>() : mma_blocks_per_sm_of<64, 4>();
  }
  return stages == 2 ? mma_blocks_per_sm_of<128, 2>()
                     : stages == 3 ? mma_blocks_per_sm_of<128, 3>() : mma_blocks_per_sm_of<128, 4>();
}

// Whether a launch without the q/k prologue takes the kernel's bulk-copy form (DecodeLayout's
// Bulk: each key row copied whole by cp.async.bulk instead of 16-byte cp.async pieces): asked for
// (XSERV_CUDA_ATTN_BULK=1, read at every call) and built for sm_90 or later (below that its bulk
// copies and barriers compile to nothing).
template <int D, int Stages, int Warps, bool HeadWarps>
bool bulk_launch() {
  const char* env = std::getenv("XSERV_CUDA_ATTN_BULK");
  if (env == nullptr || std::atoi(env) != 1) return false;  // the default path never loads the form
  static const bool usable = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, attention_decode_mma_kernel<D, Stages, false, Warps, HeadWarps, true>) ==
               cudaSuccess &&
           attr.binaryVersion >= 90;
  }();
  return usable;
}

template <int D, int Stages, bool Fused, int Warps = mma_warps, bool Bulk = false>
void launch_mma(cudaStream_t stream, const QkAttentionParams& qp) {
  if constexpr (!Fused && !Bulk) {
    if (bulk_launch<D, Stages, Warps, false>()) return launch_mma<D, Stages, false, Warps, true>(stream, qp);
  }
  const AttentionParams& p = qp.attn;
  const int group = p.n_q_heads / p.n_kv_heads;
  const int smem = std::max(DecodeLayout<D, Stages, Warps, Bulk>::ring_bytes,
                            p.num_splits > 1 ? merge_bytes(group, p.num_splits, Warps * 32) : 0);
  const dim3 grid(p.num_tokens, p.n_kv_heads, p.num_splits);
  launch_pdl(mma_kernel_configured<D, Stages, Fused, Warps, false, Bulk>(), grid, dim3(Warps * 32),
             static_cast<std::size_t>(smem), stream, qp);
}

// Warps a block of one launch: XSERV_CUDA_ATTN_WARPS=4 / 8 (read at every call) forces them.
// Otherwise a launch whose blocks each walk a whole row's keys (one split) and fit one wave
// (one_wave_of_rows: the short-context rule's launches) takes wide_warps, the rest mma_warps.
// At a few hundred keys a block's time is its warps' serial chains of chunks (each chunk's
// dependent ldmatrix/mma/softmax steps, and a copy round trip per chunk past the ring), and
// nothing else runs on its SM: 8 warps halve the chains. Measured (H200, 2026-12-02,
// docs/benchmarks.md): batch-1 decode 1210 -> 1302 / 1286 tok/s on Qwen3-0.6B and 694 -> 746 /
// 744 on 1.7B at 128 + 128 (4 -> 8 warps, both with one split and the folded prologue).
// 8 warps take two chunk buffers each (128 KB a block at head_dim 128), three with
// XSERV_CUDA_ATTN_STAGES=3 (192 KB: every chunk of a 256-key row is copied before the wait).
int launch_warps(const AttentionParams& p) {
  const char* env = std::getenv("XSERV_CUDA_ATTN_WARPS");
  const int forced = env ? std::atoi(env) : 0;
  if (forced == mma_warps || forced == wide_warps) return forced;
  const bool whole_rows =
      p.num_splits == 1 && one_wave_of_rows(static_cast<std::int64_t>(p.num_tokens) * p.n_kv_heads, device_sm_count());
  return whole_rows ? wide_warps : mma_warps;
}

// Whether a launch takes the kernel's HeadWarps form (launch_head_warps) rather than one block
// of 4 warps a (row, kv head) pair: by default where the pairs exceed one wave of those blocks at
// two chunk buffers a warp (three an SM at head_dim 128: 50 rows and up at 8 kv heads on the
// H200). Measured there (docs/benchmarks.md, "Batched decode attention: one kv head a warp"):
// Qwen3-1.7B decode at 64 / 128 rows 2.16 / 2.77 -> 2.13 / 2.61 ms a step. Below that nothing was
// measured, so the block kernel stays. XSERV_CUDA_ATTN_HEAD_WARPS (read at every call): 0 never,
// 1 wherever the pairs exceed one block an SM (17 rows and up at 8 kv heads).
bool head_warps_launch(std::int32_t head_dim, std::int64_t rows_x_kv_heads, int sm_count) {
  const char* env = std::getenv("XSERV_CUDA_ATTN_HEAD_WARPS");
  if (env != nullptr && std::string_view(env) == "0") return false;
  if (env != nullptr && std::string_view(env) == "1") return !one_wave_of_rows(rows_x_kv_heads, sm_count);
  return rows_x_kv_heads > static_cast<std::int64_t>(mma_blocks_per_sm(head_dim, 2)) * sm_count;
}

// One kv head a warp (the kernel's HeadWarps form): blocks of wide_warps warps over a row's kv
// heads and one split, each warp streaming every chunk of its head's split through its own ring
// (two or three buffers: XSERV_CUDA_ATTN_STAGES=2 / default 3, one block an SM), no block barrier
// and no combine of warps; a row's splits (attention_rows_split) are merged by its last warp.
// Without the q/k prologue it can take the bulk-copy form (bulk_launch).
template <int D, int Stages, bool Fused>
void launch_head_warps(cudaStream_t stream, const QkAttentionParams& qp) {
  const AttentionParams& p = qp.attn;
  const dim3 grid(p.num_tokens, (p.n_kv_heads + wide_warps - 1) / wide_warps, p.num_splits);
  if constexpr (!Fused) {
    if (bulk_launch<D, Stages, wide_warps, true>()) {
      launch_pdl(mma_kernel_configured<D, Stages, false, wide_warps, true, true>(), grid, dim3(wide_warps * 32),
                 static_cast<std::size_t>(DecodeLayout<D, Stages, wide_warps, true>::ring_bytes), stream, qp);
      return;
    }
  }
  launch_pdl(mma_kernel_configured<D, Stages, Fused, wide_warps, true>(), grid, dim3(wide_warps * 32),
             static_cast<std::size_t>(DecodeLayout<D, Stages, wide_warps>::ring_bytes), stream, qp);
}

// XSERV_CUDA_ATTN_SHORT (read at every call): 1 (default) the one-pass kernel
// (attention_decode_short_kernel) for the folded launches of the short-context rule, 0 the mma
// kernel (8 warps, 2 buffers) as before.
bool short_enabled() noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_SHORT");
  return env == nullptr || std::atoi(env) != 0;
}

template <int D>
auto short_kernel_configured() {
  static const auto kernel = [] {
    auto* k = attention_decode_short_kernel<D>;
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          ShortLayout<D>::smem_bytes(8)));
    return k;
  }();
  return kernel;
}

template <int D>
void launch_short(cudaStream_t stream, const QkAttentionParams& qp) {
  const auto kernel = short_kernel_configured<D>();
  const AttentionParams& p = qp.attn;
  const int group = p.n_q_heads / p.n_kv_heads;
  launch_pdl(kernel, dim3(p.num_tokens, p.n_kv_heads), dim3(short_warps * 32),
             static_cast<std::size_t>(ShortLayout<D>::smem_bytes(group)), stream, qp);
}

template <int D, bool Fused>
void launch_mma_dim(cudaStream_t stream, const QkAttentionParams& p) {
  if (head_warps_launch(D, static_cast<std::int64_t>(p.attn.num_tokens) * p.attn.n_kv_heads, device_sm_count())) {
    if (mma_stages() == 2) launch_head_warps<D, 2, Fused>(stream, p);
    else launch_head_warps<D, 3, Fused>(stream, p);
    return;
  }
  if (launch_warps(p.attn) == wide_warps) {
    // The short-context rule's folded launches (one split of at most short_context_keys keys, the
    // ring depth not forced): the one-pass kernel unless XSERV_CUDA_ATTN_SHORT=0.
    if constexpr (Fused) {
      if (short_enabled() && p.attn.num_splits == 1 && p.attn.split_size <= short_context_keys && mma_stages() == 0) {
        launch_short<D>(stream, p);
        return;
      }
    }
    if (mma_stages() == 3) launch_mma<D, 3, Fused, wide_warps>(stream, p);
    else launch_mma<D, 2, Fused, wide_warps>(stream, p);
    return;
  }
  const int stages = launch_stages(p.attn);
  if (stages == 2) launch_mma<D, 2, Fused>(stream, p);
  else if (stages == 3) launch_mma<D, 3, Fused>(stream, p);
  else launch_mma<D, 4, Fused>(stream, p);
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

AttentionSplit attention_rows_split(DType dt, std::int32_t head_dim, std::int32_t group,
                                    std::int64_t rows_x_kv_heads, std::int32_t context_bucket,
                                    int sm_count) {
  auto sized = [&](std::int32_t keys, std::int64_t want, std::int32_t unit) {
    const auto splits =
        static_cast<std::int32_t>(std::min<std::int64_t>(want, std::max(1, keys / unit)));
    std::int32_t size = (keys + splits - 1) / splits;
    size = (size + unit - 1) / unit * unit;
    return AttentionSplit{(context_bucket + size - 1) / size, size};
  };
  if (!use_tiles(dt, head_dim)) {
    // The register kernel: about two blocks per SM (its occupancy), splits down to
    // rows_split_keys keys.
    return sized(context_bucket,
                 std::max<std::int64_t>(1, (2 * sm_count + rows_x_kv_heads - 1) / rows_x_kv_heads),
                 rows_split_keys());
  }
  // The tile and mma kernels: one full wave of resident blocks holding keys. The longest
  // context is more than half its bucket, so splits sized to give that wave at half the bucket
  // keep at least one full wave busy (splits past a row's keys return at once); sized at the
  // whole bucket, a context just past a power of two (16384 + a few) left half the SMs idle.
  // Enough rows fill the wave unsplit.
  const bool mma = use_mma();
  if (mma && mma_split_keys_forced() == 0 && short_context_decode(rows_x_kv_heads, context_bucket, sm_count))
    return {1, context_bucket};
  if (mma && head_warps_launch(head_dim, rows_x_kv_heads, sm_count)) {
    // One block an SM, a row's kv heads in each (8 a block): as many splits of every row as
    // still fit one wave (each row's keys split evenly in the kernel; split_size unused), at
    // least 64 keys a split.
    const std::int64_t blocks = (rows_x_kv_heads + wide_warps - 1) / wide_warps;
    const auto splits = static_cast<std::int32_t>(
        std::clamp<std::int64_t>(sm_count / blocks, 1, std::max(1, context_bucket / 64)));
    return {splits, (context_bucket + splits - 1) / splits};
  }
  const std::int64_t wave =
      static_cast<std::int64_t>(mma ? mma_blocks_per_sm(head_dim, mma_stages() ? mma_stages() : 3)
                                    : tiles_blocks_per_sm(head_dim, group)) *
      sm_count;
  const std::int32_t unit = mma ? mma_split_keys() : tile_keys;
  const std::int64_t want = (wave + rows_x_kv_heads - 1) / rows_x_kv_heads;
  if (want <= 1) return {1, context_bucket};
  const AttentionSplit s = sized(context_bucket / 2, want, unit);
  if (s.num_splits <= max_splits) return s;
  return sized(context_bucket, max_splits, unit);  // the merge's limit (bucket 64k and up)
}

bool attention_rows_store_kv(DType dt, std::int32_t head_dim) noexcept { return !use_tiles(dt, head_dim); }

void launch_attention_rows(cudaStream_t stream, DType dt, const AttentionParams& p) {
  if (p.num_tokens == 0) return;
  if (use_tiles(dt, p.head_dim)) {
    // The mma kernel merges its splits itself and needs the tickets for that; without them
    // (a caller that did not provide any) the tile kernel and its merge take the same splits.
    if (use_mma() && (p.num_splits == 1 || p.tickets != nullptr)) {
      const QkAttentionParams qp{p, {}, true, {}};
      if (p.head_dim == 64)
        launch_mma_dim<64, false>(stream, qp);
      else
        launch_mma_dim<128, false>(stream, qp);
      return;
    }
    if (p.head_dim == 64)
      launch_tiles_dim<64>(stream, p);
    else
      launch_tiles_dim<128>(stream, p);
    return;
  }
  if (dt == DType::f32) launch_rows_typed<float>(stream, p);
  else launch_rows_typed<__nv_bfloat16>(stream, p);
}

bool short_context_decode(std::int64_t rows_x_kv_heads, std::int32_t context_bucket, int sm_count) noexcept {
  return context_bucket <= short_context_keys && one_wave_of_rows(rows_x_kv_heads, sm_count);
}

bool qk_attention_mma_supported(DType dt, std::int32_t head_dim, std::int32_t group,
                                std::int32_t max_query_len, std::int64_t rows_x_kv_heads,
                                std::int32_t context_bucket, int sm_count) noexcept {
  const char* env = std::getenv("XSERV_CUDA_ATTN_FUSE_QK");  // at every call, as use_mma
  const bool heads = env != nullptr && std::string_view(env) == "heads";
  const bool enabled = env != nullptr && !heads
                           ? std::string_view(env) != "0"
                           : short_context_decode(rows_x_kv_heads, context_bucket, sm_count) ||
                                 (heads && use_mma() && head_warps_launch(head_dim, rows_x_kv_heads, sm_count));
  return enabled && max_query_len == 1 && use_tiles(dt, head_dim) && use_mma() && group >= 1 &&
         group <= 8;
}

void launch_qk_attention_mma(cudaStream_t stream, const QkAttentionParams& params) {
  if (params.attn.num_tokens == 0) return;
  const char* env = std::getenv("XSERV_CUDA_ATTN_FOLD_AT_ONCE");  // at every call, as FUSE_QK
  const bool at_once = env == nullptr || std::string_view(env) != "0";
  QkAttentionParams p = params;
  p.fold_at_once = at_once;
  if (p.attn.head_dim == 64)
    launch_mma_dim<64, true>(stream, p);
  else
    launch_mma_dim<128, true>(stream, p);
}

}  // namespace xserv::cuda
