// Decode attention for short contexts as one kernel (opt-in, see "Supported" below: it is not
// faster yet): the attention prologue (per-head q/k
// RMSNorm, neox RoPE, k and v into the paged cache: what qk_transform_store does) and the
// attention itself (what attention_decode.cu's kernels and their merge do), for steps where every
// sequence brings one query row. At batch 1 with a few hundred keys the three kernels of the
// unfused path (prologue ~3.9 us, split attention ~5.9 us, merge ~3.8 us on the H200) are bound
// by launch latency and their dependent loads, not by the bytes they move; this one kernel does
// the same work in one block per (kv head, row).
//
// Launch: grid (n_kv_heads, rows) x 256 threads (8 warps). Per block:
// 1. Warps 0 .. G-1 transform the G q heads of the kv head into shared memory (f32 values of the
//    activation-dtype q the unfused prologue writes), warp G the k head (written to the cache
//    slot), warp G+1 copies v to the cache. A lane owns the elements lane*H .. lane*H+H-1 of each
//    half of the head (H = head_dim / 64), so the rotation pairs stay within a lane. Rounding as
//    rope_kv.cu: normalised value rounded to the dtype before and after the weight, rotated
//    value rounded once.
// 2. After a barrier (which makes this block's cache writes visible to it), warp w takes keys
//    w*8 .. w*8+7, then 64 further, and so on: the 8 keys' K and V rows are loaded together
//    (block-table lookups per key), a warp reduction gives each of the G scores, and an online
//    softmax per head accumulates P.V in registers.
// 3. The warps' (max, sum, acc) combine in a fixed order (a tree over shared memory: the result
//    does not depend on timing, so graph replays equal eager steps bit for bit), and warp 0
//    writes out = acc / sum in the activation dtype.
// Supported: head_dim 64 or 128, G = n_q_heads / n_kv_heads <= 8, f32 or bf16
// (qk_attention_supported); the backend takes this path only when asked (XSERV_CUDA_FUSED_ATTN=N:
// contexts up to N keys), because it measured SLOWER than the three kernels (H200, 2026-12-01,
// docs/benchmarks.md): Qwen3-0.6B at batch 1 and 128-256 keys 30 us per layer (ncu) against
// ~13.6 us, 718 tok/s against 1003; after a 900-token prompt 253 against 976. At batch 1 the
// grid is one block per kv head (8 of 132 SMs), and each warp then issues ~5000 dependent
// instructions (block-table lookups, scalar K/V loads, G warp reductions per key) at one per
// ~12 cycles: the work the split kernels spread over 64 blocks is serialised. What it would
// take: split the keys over blocks here too (each block transforms q itself, the block of the
// last split also writes k/v) and let the last block to finish merge (an atomic ticket, as
// gemv.cu's in_out kernel does), with 16-byte K/V loads. That is now attention_decode.cu's mma
// kernel with the q/k prologue folded in (the default for few rows over contexts of up to 256
// keys, short_context_decode; XSERV_CUDA_ATTN_FUSE_QK=1 everywhere).
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

constexpr int warps = 8;
constexpr int keys_per_warp = 8;  // K/V rows a warp loads at once

template <typename T>
__device__ __forceinline__ float round_to(float x) {
  return to_f32(from_f32<T>(x));
}

// D: head_dim; GM: the group size rounded up to a power of two (registers per head).
template <typename T, int D, int GM>
__global__ void __launch_bounds__(warps * 32) qk_attention_kernel(const QkAttentionParams p) {
  constexpr int E = D / 32, H = E / 2;  // elements per lane; per half of the head
  __shared__ float s_q[GM][D];
  __shared__ float s_red[warps / 2][GM][D];
  __shared__ float s_ml[warps][GM][2];
  grid_dependency_wait();  // qkv is the previous kernel's output
  const AttentionParams& a = p.attn;
  const QkTransformParams& t = p.qk;
  const int kvh = blockIdx.x, row = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int G = a.n_q_heads / a.n_kv_heads;
  const int seq = find_sequence(a.query_start, a.num_seqs, row);
  const int ctx = a.context_lens[seq];
  int idx[E];
#pragma unroll
  for (int h = 0; h < H; ++h) {
    idx[h] = lane * H + h;
    idx[H + h] = D / 2 + lane * H + h;
  }

  // 1. Prologue.
  const T* qkv_row = static_cast<const T*>(a.qkv) + static_cast<std::int64_t>(row) * a.qkv_stride;
  const std::int64_t slot = t.slot_mapping[row];
  const float pos = static_cast<float>(t.positions[row]);
  for (int w = warp; w < G + 2; w += warps) {
    if (w == G + 1) {  // v: straight to the cache
      const T* src = qkv_row + static_cast<std::int64_t>(a.n_q_heads + a.n_kv_heads + kvh) * D;
      T* dst = static_cast<T*>(t.v_cache) + (slot * a.n_kv_heads + kvh) * D;
      for (int i = lane; i < D; i += 32) dst[i] = src[i];
      continue;
    }
    const bool is_q = w < G;
    const int head = is_q ? kvh * G + w : a.n_q_heads + kvh;
    const T* src = qkv_row + static_cast<std::int64_t>(head) * D;
    float x[E];
#pragma unroll
    for (int e = 0; e < E; ++e) x[e] = to_f32(src[idx[e]]);
    const T* norm = static_cast<const T*>(is_q ? t.q_norm : t.k_norm);
    if (norm) {
      float sq = 0.0f;
#pragma unroll
      for (int e = 0; e < E; ++e) sq += x[e] * x[e];
      const float rstd = rsqrtf(warp_sum(sq) / static_cast<float>(D) + t.norm_eps);
#pragma unroll
      for (int e = 0; e < E; ++e) x[e] = round_to<T>(round_to<T>(x[e] * rstd) * to_f32(norm[idx[e]]));
    }
    float y[E];
    if (t.rope) {
#pragma unroll
      for (int h = 0; h < H; ++h) {
        const float angle = pos * t.inv_freq[idx[h]];
        const float c = cosf(angle), sn = sinf(angle);
        y[h] = round_to<T>(x[h] * c - x[H + h] * sn);
        y[H + h] = round_to<T>(x[H + h] * c + x[h] * sn);
      }
    } else {
#pragma unroll
      for (int e = 0; e < E; ++e) y[e] = round_to<T>(x[e]);
    }
    if (is_q) {
#pragma unroll
      for (int e = 0; e < E; ++e) s_q[w][idx[e]] = y[e];
    } else {
      T* dst = static_cast<T*>(t.k_cache) + (slot * a.n_kv_heads + kvh) * D;
#pragma unroll
      for (int e = 0; e < E; ++e) dst[idx[e]] = from_f32<T>(y[e]);
    }
  }
  __syncthreads();

  // 2. Keys 0 .. ctx-1 (the row's own key included), an online softmax per q head.
  float q[GM][E], m[GM], l[GM], acc[GM][E];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    m[g] = -CUDART_INF_F;
    l[g] = 0.0f;
#pragma unroll
    for (int e = 0; e < E; ++e) {
      q[g][e] = g < G ? s_q[g][idx[e]] : 0.0f;
      acc[g][e] = 0.0f;
    }
  }
  const std::int32_t* table = a.block_tables + static_cast<std::int64_t>(seq) * a.max_blocks_per_seq;
  const T* kc = static_cast<const T*>(a.k_cache);
  const T* vc = static_cast<const T*>(a.v_cache);
  for (int j0 = warp * keys_per_warp; j0 < ctx; j0 += warps * keys_per_warp) {
    float kf[keys_per_warp][E], vf[keys_per_warp][E];
#pragma unroll
    for (int u = 0; u < keys_per_warp; ++u) {
      const int j = j0 + u;
      if (j < ctx) {
        const std::int64_t s = static_cast<std::int64_t>(table[j / a.block_size]) * a.block_size + j % a.block_size;
        const std::int64_t base = (s * a.n_kv_heads + kvh) * D;
#pragma unroll
        for (int e = 0; e < E; ++e) {
          kf[u][e] = to_f32(kc[base + idx[e]]);
          vf[u][e] = to_f32(vc[base + idx[e]]);
        }
      } else {
#pragma unroll
        for (int e = 0; e < E; ++e) kf[u][e] = vf[u][e] = 0.0f;
      }
    }
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      if (g >= G) break;
      float s[keys_per_warp];
      float mx = m[g];
#pragma unroll
      for (int u = 0; u < keys_per_warp; ++u) {
        float part = 0.0f;
#pragma unroll
        for (int e = 0; e < E; ++e) part += q[g][e] * kf[u][e];
        s[u] = j0 + u < ctx ? warp_sum(part) * a.scale : -CUDART_INF_F;
        mx = fmaxf(mx, s[u]);
      }
      const float corr = m[g] == -CUDART_INF_F ? 0.0f : expf(m[g] - mx);
      l[g] *= corr;
#pragma unroll
      for (int e = 0; e < E; ++e) acc[g][e] *= corr;
#pragma unroll
      for (int u = 0; u < keys_per_warp; ++u) {
        const float pu = s[u] == -CUDART_INF_F ? 0.0f : expf(s[u] - mx);
        l[g] += pu;
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] += pu * vf[u][e];
      }
      m[g] = mx;
    }
  }

  // 3. Warps combine: rescale to the block's max, then a fixed-order tree sum.
  if (lane == 0) {
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      s_ml[warp][g][0] = m[g];
      s_ml[warp][g][1] = l[g];
    }
  }
  __syncthreads();
  float total[GM];
#pragma unroll
  for (int g = 0; g < GM; ++g) {
    float mx = -CUDART_INF_F;
    for (int w = 0; w < warps; ++w) mx = fmaxf(mx, s_ml[w][g][0]);
    float sum = 0.0f;
    for (int w = 0; w < warps; ++w) {
      const float mw = s_ml[w][g][0];
      sum += mw == -CUDART_INF_F ? 0.0f : s_ml[w][g][1] * expf(mw - mx);
    }
    total[g] = sum;
    const float mine = m[g] == -CUDART_INF_F ? 0.0f : expf(m[g] - mx);
#pragma unroll
    for (int e = 0; e < E; ++e) acc[g][e] *= mine;
  }
#pragma unroll
  for (int half = warps / 2; half >= 1; half /= 2) {
    if (warp >= half && warp < 2 * half) {
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e) s_red[warp - half][g][idx[e]] = acc[g][e];
    }
    __syncthreads();
    if (warp < half) {
#pragma unroll
      for (int g = 0; g < GM; ++g)
#pragma unroll
        for (int e = 0; e < E; ++e) acc[g][e] += s_red[warp][g][idx[e]];
    }
    __syncthreads();
  }
  if (warp == 0) {
    T* out = static_cast<T*>(a.out) + static_cast<std::int64_t>(row) * a.n_q_heads * D;
#pragma unroll
    for (int g = 0; g < GM; ++g) {
      if (g >= G) break;
      const float inv = 1.0f / total[g];
#pragma unroll
      for (int e = 0; e < E; ++e)
        out[static_cast<std::int64_t>(kvh * G + g) * D + idx[e]] = from_f32<T>(acc[g][e] * inv);
    }
  }
}

template <typename T, int D>
void launch_d(cudaStream_t stream, const QkAttentionParams& p, int group) {
  const dim3 grid(p.attn.n_kv_heads, p.attn.num_tokens);
  const dim3 block(warps * 32);
  if (group <= 1) launch_pdl(qk_attention_kernel<T, D, 1>, grid, block, 0, stream, p);
  else if (group <= 2) launch_pdl(qk_attention_kernel<T, D, 2>, grid, block, 0, stream, p);
  else if (group <= 4) launch_pdl(qk_attention_kernel<T, D, 4>, grid, block, 0, stream, p);
  else launch_pdl(qk_attention_kernel<T, D, 8>, grid, block, 0, stream, p);
}

template <typename T>
void launch_typed(cudaStream_t stream, const QkAttentionParams& p, int group) {
  if (p.attn.head_dim == 64) launch_d<T, 64>(stream, p, group);
  else launch_d<T, 128>(stream, p, group);
}

}  // namespace

bool qk_attention_supported(DType dt, std::int32_t head_dim, std::int32_t group) noexcept {
  return (dt == DType::f32 || dt == DType::bf16) && (head_dim == 64 || head_dim == 128) &&
         group >= 1 && group <= 8;
}

void launch_qk_attention(cudaStream_t stream, DType dt, const QkAttentionParams& p) {
  if (p.attn.num_tokens == 0) return;
  const int group = p.attn.n_q_heads / p.attn.n_kv_heads;
  if (dt == DType::f32) launch_typed<float>(stream, p, group);
  else launch_typed<__nv_bfloat16>(stream, p, group);
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace xserv::cuda
