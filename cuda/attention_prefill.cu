// FlashAttention-style paged prefill on tensor cores (bf16 activations, head_dim 64 or 128).
// Computes, for each sequence's new rows, out[t, h, :] = softmax(scale * q[t, h] . K[0..pos_t]) V
// with K/V read straight from the paged cache [num_blocks, block_size, n_kv_heads, head_dim]
// through the block table (grouped-query: q head h reads kv head h / (n_q / n_kv)); varlen by
// query_start, causal by position (pos_t = context_len - query_len + local row), so a chunk of a
// long prompt attends to the cached prefix as well as to itself.
// Launch: grid (ceil(max_query_len / 64), n_q_heads, num_seqs), 128 threads = 4 warps; a block
// owns 64 query rows of one head, each warp 16 of them. Per 64-key tile: the block stages K and V
// in shared memory (16-byte loads, all of a thread's in flight together; keys past the context
// zero-filled), each warp computes S = Q K^T with wmma (bf16 in, f32 out), an online softmax on
// its rows (two lanes per row), rescales its f32 output rows in shared memory and accumulates
// P (bf16) V into them with wmma. Tiles entirely above a warp's diagonal are skipped. About
// 101 KB of shared memory per block (head_dim 128), so two blocks share an SM.
#include <mma.h>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"

namespace xserv::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int block_q = 64, block_k = 64, threads = 128, warps = threads / 32;

template <int D>
struct Layout {
  static constexpr int ldh = D + 8;        // bf16 tiles: row stride (elements), padded vs banks
  static constexpr int lds = block_k + 4;  // f32 S [16, 64] of a warp
  static constexpr int ldp = block_k + 8;  // bf16 P [16, 64], written over S once S is read
  static constexpr int ldo = D + 4;        // f32 O [16, D] of a warp
  static constexpr int q_bytes = block_q * ldh * 2;
  static constexpr int kv_bytes = block_k * ldh * 2;
  static constexpr int scratch_bytes = 16 * lds * 4;
  static constexpr int o_bytes = 16 * ldo * 4;
  static constexpr int warp_bytes = scratch_bytes + o_bytes;
  // About 101 KB for D = 128: two blocks fit on an SM.
  static constexpr int total = q_bytes + 2 * kv_bytes + warps * warp_bytes;
  static_assert(16 * ldp * 2 <= scratch_bytes && ldp * 2 <= lds * 4, "P must fit over S");
};

template <int D>
__global__ void __launch_bounds__(threads) attention_prefill_kernel(const AttentionParams p) {
  using Lay = Layout<D>;
  extern __shared__ __align__(128) unsigned char smem[];
  bf16* sq = reinterpret_cast<bf16*>(smem);
  bf16* sk = reinterpret_cast<bf16*>(smem + Lay::q_bytes);
  bf16* sv = reinterpret_cast<bf16*>(smem + Lay::q_bytes + Lay::kv_bytes);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  unsigned char* wbase = smem + Lay::q_bytes + 2 * Lay::kv_bytes + warp * Lay::warp_bytes;
  float* s_scratch = reinterpret_cast<float*>(wbase);
  bf16* s_p = reinterpret_cast<bf16*>(wbase);  // over S, after the softmax has read it
  float* s_o = reinterpret_cast<float*>(wbase + Lay::scratch_bytes);

  const int tile = blockIdx.x, h = blockIdx.y, seq = blockIdx.z;
  const int q0 = p.query_start[seq];
  const int q_len = p.query_start[seq + 1] - q0;
  const int row0 = tile * block_q;
  if (row0 >= q_len) return;
  const int ctx = p.context_lens[seq];
  const int first_pos = ctx - q_len;  // position of the sequence's first new row
  const int rows_here = min(block_q, q_len - row0);
  const int kvh = h / (p.n_q_heads / p.n_kv_heads);
  const int last_key = first_pos + row0 + rows_here - 1;
  const std::int32_t* table = p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;
  constexpr int chunks = D / 8;  // 16-byte chunks per row

  const bf16* qkv = static_cast<const bf16*>(p.qkv);
  for (int c = tid; c < block_q * chunks; c += threads) {
    const int r = c / chunks, cc = c % chunks;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (r < rows_here)
      v = *reinterpret_cast<const uint4*>(qkv + static_cast<std::int64_t>(q0 + row0 + r) * p.qkv_stride +
                                          h * D + cc * 8);
    *reinterpret_cast<uint4*>(sq + r * Lay::ldh + cc * 8) = v;
  }

  // Two lanes per row: lane / 2 is the row within the warp's 16, lane % 2 the half of the tile.
  const int r = lane >> 1, half = lane & 1;
  const int warp_row0 = warp * 16;
  const bool warp_active = warp_row0 < rows_here;
  const int warp_last_pos = first_pos + row0 + min(warp_row0 + 15, rows_here - 1);
  const bool row_valid = warp_row0 + r < rows_here;
  const int q_pos = first_pos + row0 + warp_row0 + r;
  float m_r = -CUDART_INF_F, l_r = 0.0f;
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); c += 4)
    *reinterpret_cast<float4*>(s_o + r * Lay::ldo + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

  const bf16* kc = static_cast<const bf16*>(p.k_cache);
  const bf16* vc = static_cast<const bf16*>(p.v_cache);
  for (int kt = 0; kt <= last_key; kt += block_k) {
    __syncthreads();  // everyone is done with the previous K/V tile (and Q is staged)
    {
      // All of a thread's block-table reads, then all of its K/V loads, then the stores: the
      // loads of a tile are in flight together instead of one dependent round trip per chunk.
      constexpr int per_thread = block_k * chunks / threads;
      std::int64_t off[per_thread];
      bool ok[per_thread];
#pragma unroll
      for (int i = 0; i < per_thread; ++i) {
        const int c = tid + i * threads;
        const int key = kt + c / chunks;
        ok[i] = key <= last_key;
        off[i] = ok[i] ? (static_cast<std::int64_t>(table[key / p.block_size]) * p.block_size +
                          key % p.block_size) * p.n_kv_heads * D + kvh * D + (c % chunks) * 8
                       : 0;
      }
      uint4 kv[per_thread], vv[per_thread];
#pragma unroll
      for (int i = 0; i < per_thread; ++i) {
        kv[i] = ok[i] ? *reinterpret_cast<const uint4*>(kc + off[i]) : make_uint4(0, 0, 0, 0);
        vv[i] = ok[i] ? *reinterpret_cast<const uint4*>(vc + off[i]) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int i = 0; i < per_thread; ++i) {
        const int c = tid + i * threads;
        *reinterpret_cast<uint4*>(sk + (c / chunks) * Lay::ldh + (c % chunks) * 8) = kv[i];
        *reinterpret_cast<uint4*>(sv + (c / chunks) * Lay::ldh + (c % chunks) * 8) = vv[i];
      }
    }
    __syncthreads();
    if (!warp_active || kt > warp_last_pos) continue;

    // S[16, 64] = Q_w[16, D] . K^T
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> s_acc[block_k / 16];
#pragma unroll
      for (int n = 0; n < block_k / 16; ++n) wmma::fill_fragment(s_acc[n], 0.0f);
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, sq + warp_row0 * Lay::ldh + kk * 16, Lay::ldh);
#pragma unroll
        for (int n = 0; n < block_k / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::col_major> b;
          wmma::load_matrix_sync(b, sk + n * 16 * Lay::ldh + kk * 16, Lay::ldh);
          wmma::mma_sync(s_acc[n], a, b, s_acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < block_k / 16; ++n)
        wmma::store_matrix_sync(s_scratch + n * 16, s_acc[n], Lay::lds, wmma::mem_row_major);
    }
    __syncwarp();

    // Online softmax of row r over this tile's half (32 keys per lane).
    float s_val[32];
    float mx = -CUDART_INF_F;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const int c = half * 32 + j;
      float s = s_scratch[r * Lay::lds + c] * p.scale;
      if (!row_valid || kt + c > q_pos) s = -CUDART_INF_F;
      s_val[j] = s;
      mx = fmaxf(mx, s);
    }
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    __syncwarp();  // every lane has read S: P may now overwrite it
    const float m_new = fmaxf(m_r, mx);
    const float alpha = m_r == -CUDART_INF_F ? 0.0f : expf(m_r - m_new);
    float sum = 0.0f;
#pragma unroll
    for (int j = 0; j < 32; ++j) {
      const bf16 pb = __float2bfloat16_rn(s_val[j] == -CUDART_INF_F ? 0.0f : expf(s_val[j] - m_new));
      s_p[r * Lay::ldp + half * 32 + j] = pb;
      sum += __bfloat162float(pb);  // the normaliser sums exactly what P V multiplies
    }
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    l_r = l_r * alpha + sum;
    m_r = m_new;
    // O *= alpha row by row, then O += P[16, 64] . V[64, D] straight into the rescaled O.
    for (int c = half * (D / 2); c < (half + 1) * (D / 2); c += 4) {
      float4* o4 = reinterpret_cast<float4*>(s_o + r * Lay::ldo + c);
      float4 v = *o4;
      v.x *= alpha;
      v.y *= alpha;
      v.z *= alpha;
      v.w *= alpha;
      *o4 = v;
    }
    __syncwarp();
    {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> o_acc[D / 16];
#pragma unroll
      for (int n = 0; n < D / 16; ++n)
        wmma::load_matrix_sync(o_acc[n], s_o + n * 16, Lay::ldo, wmma::mem_row_major);
#pragma unroll
      for (int kk = 0; kk < block_k / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, bf16, wmma::row_major> a;
        wmma::load_matrix_sync(a, s_p + kk * 16, Lay::ldp);
#pragma unroll
        for (int n = 0; n < D / 16; ++n) {
          wmma::fragment<wmma::matrix_b, 16, 16, 16, bf16, wmma::row_major> b;
          wmma::load_matrix_sync(b, sv + kk * 16 * Lay::ldh + n * 16, Lay::ldh);
          wmma::mma_sync(o_acc[n], a, b, o_acc[n]);
        }
      }
#pragma unroll
      for (int n = 0; n < D / 16; ++n)
        wmma::store_matrix_sync(s_o + n * 16, o_acc[n], Lay::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (!warp_active || !row_valid) return;
  bf16* out = static_cast<bf16*>(p.out) +
              static_cast<std::int64_t>(q0 + row0 + warp_row0 + r) * p.n_q_heads * D + h * D;
  const float inv = l_r > 0.0f ? 1.0f / l_r : 0.0f;
  for (int c = half * (D / 2); c < (half + 1) * (D / 2); c += 8) {
    float v[8];
#pragma unroll
    for (int j = 0; j < 8; ++j) v[j] = s_o[r * Lay::ldo + c + j] * inv;
    store_f32<bf16, 8>(out + c, v);
  }
}

template <int D>
void launch_dim(cudaStream_t stream, const AttentionParams& p) {
  static const bool configured = [] {
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_kernel<D>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Layout<D>::total));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(p.max_query_len, block_q), p.n_q_heads, p.num_seqs);
  attention_prefill_kernel<D><<<grid, threads, Layout<D>::total, stream>>>(p);
  XSERV_CUDA_LAUNCH_CHECK();
}

}  // namespace

bool attention_prefill_supported(DType dt, std::int32_t head_dim) noexcept {
  return dt == DType::bf16 && (head_dim == 64 || head_dim == 128);
}

void launch_attention_prefill(cudaStream_t stream, const AttentionParams& p) {
  if (p.num_tokens == 0 || p.max_query_len == 0) return;
  if (p.head_dim == 64) launch_dim<64>(stream, p);
  else launch_dim<128>(stream, p);
}

}  // namespace xserv::cuda
