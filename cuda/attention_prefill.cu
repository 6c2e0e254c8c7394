// Paged prefill attention: on tensor cores for bf16 activations (head_dim 64 or 128), on CUDA
// cores for f32 (GPT-2; head_dim 16, 32, 64 or 128).
// Computes, for each sequence's new rows, out[t, h, :] = softmax(scale * q[t, h] . K[0..pos_t]) V
// with K/V read straight from the paged cache [num_blocks, block_size, n_kv_heads, head_dim]
// through the block table (grouped-query: q head h reads kv head h / (n_q / n_kv)); varlen by
// query_start, causal by position (pos_t = context_len - query_len + local row), so a chunk of a
// long prompt attends to the cached prefix as well as to itself.
//
// Two bf16 kernels with that contract; launch_attention_prefill picks one per call:
// - the mma kernel (default), FlashAttention-2 style: mma.sync m16n8k16 (bf16 in, f32
//   accumulate) fed by ldmatrix from XOR-swizzled shared tiles; Q fragments, the scores, the
//   online softmax and the O accumulator stay in registers; K/V tiles of 64 keys double-buffered
//   with cp.async through the block table; causal tiles past a block's last row never loaded,
//   past a warp's rows skipped. Described at the kernel.
// - the wmma kernel (XSERV_CUDA_PREFILL_MMA=0, for A/B comparisons): S and the f32 O round-trip
//   through shared memory (~101 KB a block at head_dim 128).
// f32 activations take a third kernel with the same contract (CUDA cores, f32 throughout: 32-row
// blocks, 32-key tiles), described at the kernel; XSERV_CUDA_PREFILL_F32=0 sends them back to the
// decode kernel once per row (attention_decode.cu).
#include <mma.h>

#include <cstdlib>
#include <string_view>

#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/kernels.hpp"
#include "cuda/mma.cuh"

namespace xserv::cuda {
namespace {

namespace wmma = nvcuda::wmma;
using bf16 = __nv_bfloat16;

constexpr int block_q = 64, block_k = 64, threads = 128, warps = threads / 32;

// ---- wmma kernel -----------------------------------------------------------------------------
// Launch: grid (ceil(max_query_len / 64), n_q_heads, num_seqs), 128 threads = 4 warps; a block
// owns 64 query rows of one head, each warp 16 of them. Per 64-key tile: the block stages K and V
// in shared memory (16-byte loads, all of a thread's in flight together; keys past the context
// zero-filled), each warp computes S = Q K^T with wmma (bf16 in, f32 out), an online softmax on
// its rows (two lanes per row), rescales its f32 output rows in shared memory and accumulates
// P (bf16) V into them with wmma. Tiles entirely above a warp's diagonal are skipped. About
// 101 KB of shared memory per block (head_dim 128), so two blocks share an SM.
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
__global__ void __launch_bounds__(threads) attention_prefill_wmma_kernel(const AttentionParams p) {
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
void launch_wmma(cudaStream_t stream, const AttentionParams& p) {
  static const bool configured = [] {
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_wmma_kernel<D>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Layout<D>::total));
    return true;
  }();
  (void)configured;
  const dim3 grid(ceil_div(p.max_query_len, block_q), p.n_q_heads, p.num_seqs);
  attention_prefill_wmma_kernel<D><<<grid, threads, Layout<D>::total, stream>>>(p);
  XSERV_CUDA_LAUNCH_CHECK();
}

// ---- mma kernel ------------------------------------------------------------------------------
// Launch: grid (n_q_heads, ceil(max_query_len / rows), num_seqs), Warps warps (6 by default); a
// block owns rows = 16 x Warps query rows of one head, warp w rows 16w .. 16w + 15, and walks the
// key tiles of 64 from key 0 to the block's last row. Heads vary fastest, so the G q heads of a
// kv head (and the other heads of the same rows) run side by side and read the same K/V tiles
// out of L2; row tiles go last-first, so the longest causal rows start first and the short ones
// fill the tail.
//
// Fragments: cuda/mma.cuh. So:
// - Q (A, 16 rows x D) is loaded once with ldmatrix.x4 into D/16 fragments;
// - S = Q K^T: K rows (keys) as stored are B's columns: plain ldmatrix.x4 gives the b0/b1 of two
//   8-key tiles per 16-wide slice of D;
// - P V: the S accumulators of two 8-key tiles, rounded to bf16 pairs, are exactly an A fragment
//   (no shared memory), and ldmatrix.x4.trans of V rows gives the b0/b1 of two 8-column tiles.
// Shared tiles are [rows][D] bf16 with 16-byte piece c of row r stored at piece c ^ (r % 8):
// the 8 row addresses of every ldmatrix phase then fall in 8 different bank groups.
//
// Softmax in base 2 with the scale folded in: p = 2^(s * scale * log2(e) - m), running max m
// (in those units) and sum l per row (each lane holds two rows, the 4 lanes of a quad share
// them: max by two shuffles; the sum stays per lane until the end). Rows past the sequence
// compute on zero q and are not stored; keys past the block's last row are zero-filled and masked
// like any key above a row's diagonal (only tiles that reach past the warp's first row are
// masked at all).
//
// Shared memory: two stages of K and V tiles (64 KB at D = 128); Q is staged once in stage 1
// before the first tile is used. Registers bound the blocks an SM holds (168 a thread at 4 or 6
// warps). Measured on the Qwen3-8B 16k prefill (H200, 2026-12-01, one run each, docs/
// benchmarks.md): 6 warps x 2 blocks an SM 24.5k tok/s, 8 x 1 24.1k, 4 x 3 23.6k: more rows
// share each K/V tile copy at the same 12 warps an SM. The attention then ran at ~250 TFLOP/s
// with the tensor pipe ~40% busy, L2 ~40% (ncu, 4 warps): latency-bound, not bandwidth-bound.
constexpr int mma_keys = 64;

template <int D>
struct MmaLayout {
  static constexpr int tile_elems = mma_keys * D;  // one K or V tile, bf16
  static constexpr int stage_elems = 2 * tile_elems;
  static constexpr int total = 2 * stage_elems * 2;  // bytes: two stages of K + V
};

// Copies key tile `tile` (keys tile * 64 ..) of kv head kvh into a stage: thread t moves pieces
// t % chunks of rows t / chunks, + 128 / chunks, ...; keys past last_key are zero-filled.
template <int D, int Threads>
__device__ __forceinline__ void load_kv_tile(const AttentionParams& p, const std::int32_t* table,
                                             int kvh, int tile, int last_key, bf16* sk, bf16* sv) {
  constexpr int chunks = D / 8, rows_per_pass = Threads / chunks;
  const bf16* kc = static_cast<const bf16*>(p.k_cache);
  const bf16* vc = static_cast<const bf16*>(p.v_cache);
  const int c = threadIdx.x % chunks;
  // Power-of-two block sizes (every engine default) divide by shifting: integer division by a
  // run-time value costs more instructions than a tile's softmax.
  const int bs = p.block_size, shift = __ffs(bs) - 1;
  const bool pow2 = (bs & (bs - 1)) == 0;
  const std::int64_t row_elems = static_cast<std::int64_t>(p.n_kv_heads) * D;
#pragma unroll
  for (int r = threadIdx.x / chunks; r < mma_keys; r += rows_per_pass) {
    const int key = tile * mma_keys + r;
    const bool ok = key <= last_key;
    std::int64_t off = 0;
    if (ok) {
      const int blk = pow2 ? key >> shift : key / bs, in_blk = pow2 ? key & (bs - 1) : key % bs;
      off = (static_cast<std::int64_t>(table[blk]) * bs + in_blk) * row_elems + kvh * D + c * 8;
    }
    copy_async16_zfill(sk + swz<D>(r, c), kc + off, ok);
    copy_async16_zfill(sv + swz<D>(r, c), vc + off, ok);
  }
}

// MinBlocks caps the registers (168 a thread at 4 warps x 3 and 6 x 2, no spills); 4 warps x 2
// blocks with 203 registers ran the 16k prefill 5% slower than 4 x 3 (H200, 2026-12-01).
template <int D, int Warps, int MinBlocks>
__global__ void __launch_bounds__(Warps * 32, MinBlocks)
    attention_prefill_mma_kernel(const AttentionParams p) {
  using Lay = MmaLayout<D>;
  constexpr int mma_rows = Warps * 16, mma_threads = Warps * 32;
  static_assert(mma_rows * D <= Lay::stage_elems, "Q is staged in stage 1");
  constexpr int chunks = D / 8, ksteps = D / 16, ntiles = mma_keys / 8, dtiles = D / 8;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* smem = reinterpret_cast<bf16*>(smem_raw);  // stage s: K at s * stage_elems, V after it

  const int h = blockIdx.x, seq = blockIdx.z;
  const int q0 = p.query_start[seq];
  const int q_len = p.query_start[seq + 1] - q0;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * mma_rows;
  if (row0 >= q_len) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int ctx = p.context_lens[seq];
  const int first_pos = ctx - q_len;  // position of the sequence's first new row
  const int rows_here = min(mma_rows, q_len - row0);
  const int kvh = h / (p.n_q_heads / p.n_kv_heads);
  const int last_key = first_pos + row0 + rows_here - 1;
  const int n_tiles = last_key / mma_keys + 1;
  const std::int32_t* table =
      p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;

  // Q (rows past the sequence zero-filled) into stage 1, K/V tile 0 into stage 0.
  bf16* sq = smem + Lay::stage_elems;
  {
    const bf16* qkv = static_cast<const bf16*>(p.qkv);
    for (int i = tid; i < mma_rows * chunks; i += mma_threads) {
      const int r = i / chunks, c = i % chunks;
      const bool ok = r < rows_here;
      const std::int64_t at =
          static_cast<std::int64_t>(q0 + row0 + r) * p.qkv_stride + h * D + c * 8;
      const bf16* src = qkv + (ok ? at : 0);
      copy_async16_zfill(sq + swz<D>(r, c), src, ok);
    }
    copy_async_commit();
  }
  load_kv_tile<D, mma_threads>(p, table, kvh, 0, last_key, smem, smem + Lay::tile_elems);
  copy_async_commit();
  copy_async_wait<1>();  // Q has landed
  __syncthreads();
  unsigned qf[ksteps][4];
  {
    const int r = warp * 16 + (lane & 15);
#pragma unroll
    for (int k = 0; k < ksteps; ++k) ldsm_x4(smem_addr(sq + swz<D>(r, 2 * k + (lane >> 4))), qf[k]);
  }
  __syncthreads();  // every warp holds its Q: stage 1 is free for tile 1

  const int warp_row0 = warp * 16;
  const bool warp_active = warp_row0 < rows_here;
  const int warp_first_pos = first_pos + row0 + warp_row0;  // of the warp's first row
  const int warp_last_pos = first_pos + row0 + min(warp_row0 + 15, rows_here - 1);
  const int pos_a = warp_first_pos + (lane >> 2), pos_b = pos_a + 8;  // this lane's two rows
  const float scale_log2 = p.scale * 1.4426950408889634f;
  float o[dtiles][4];
#pragma unroll
  for (int j = 0; j < dtiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_a = -CUDART_INF_F, m_b = -CUDART_INF_F, l_a = 0.0f, l_b = 0.0f;

  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      bf16* next = smem + ((t + 1) & 1) * Lay::stage_elems;
      load_kv_tile<D, mma_threads>(p, table, kvh, t + 1, last_key, next, next + Lay::tile_elems);
    }
    copy_async_commit();  // possibly empty: the group count stays one per tile
    copy_async_wait<1>();  // tile t has landed
    __syncthreads();
    const int key0 = t * mma_keys;
    if (warp_active && key0 <= warp_last_pos) {
      const bf16* sk = smem + (t & 1) * Lay::stage_elems;
      const bf16* sv = sk + Lay::tile_elems;
      // S[16, 64] = Q K^T
      float s[ntiles][4];
#pragma unroll
      for (int j = 0; j < ntiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int k = 0; k < ksteps; ++k) {
#pragma unroll
        for (int jp = 0; jp < ntiles / 2; ++jp) {
          unsigned b[4];
          const int key = jp * 16 + (lane & 7) + ((lane >> 4) << 3);
          ldsm_x4(smem_addr(sk + swz<D>(key, 2 * k + ((lane >> 3) & 1))), b);
          mma_bf16(s[2 * jp], qf[k], b[0], b[1]);
          mma_bf16(s[2 * jp + 1], qf[k], b[2], b[3]);
        }
      }
      // Mask keys above each row's diagonal (and the zero-filled tail); the row max of the raw
      // scores, scaled into base 2 once (scale > 0), so p = 2^(s * scale_log2 - m) is one FFMA.
      if (key0 + mma_keys - 1 > warp_first_pos) {
#pragma unroll
        for (int j = 0; j < ntiles; ++j) {
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = key0 + j * 8 + 2 * (lane & 3) + (e & 1);
            if (key > (e < 2 ? pos_a : pos_b)) s[j][e] = -CUDART_INF_F;
          }
        }
      }
      float mx_a = -CUDART_INF_F, mx_b = -CUDART_INF_F;
#pragma unroll
      for (int j = 0; j < ntiles; ++j) {
        mx_a = fmaxf(mx_a, fmaxf(s[j][0], s[j][1]));
        mx_b = fmaxf(mx_b, fmaxf(s[j][2], s[j][3]));
      }
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 1));
      mx_a = fmaxf(mx_a, __shfl_xor_sync(0xffffffffu, mx_a, 2));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 1));
      mx_b = fmaxf(mx_b, __shfl_xor_sync(0xffffffffu, mx_b, 2));
      const float new_a = fmaxf(m_a, mx_a * scale_log2), new_b = fmaxf(m_b, mx_b * scale_log2);
      // A row with every key so far masked keeps m = -inf: subtract 0 instead (p = 0 anyway).
      const float base_a = new_a == -CUDART_INF_F ? 0.0f : new_a;
      const float base_b = new_b == -CUDART_INF_F ? 0.0f : new_b;
      const float alpha_a = fast_exp2(m_a - base_a), alpha_b = fast_exp2(m_b - base_b);
      m_a = new_a;
      m_b = new_b;
      // P rounded to bf16 pairs (row a, row b of each 8-key tile): the A fragments of P V. The
      // sums add exactly the rounded values that P V multiplies.
      unsigned pp[ntiles][2];
      float sum_a = 0.0f, sum_b = 0.0f;
#pragma unroll
      for (int j = 0; j < ntiles; ++j) {
        pp[j][0] = pack_bf16(fast_exp2(fmaf(s[j][0], scale_log2, -base_a)),
                             fast_exp2(fmaf(s[j][1], scale_log2, -base_a)));
        pp[j][1] = pack_bf16(fast_exp2(fmaf(s[j][2], scale_log2, -base_b)),
                             fast_exp2(fmaf(s[j][3], scale_log2, -base_b)));
        sum_a += bf16_lo(pp[j][0]) + bf16_hi(pp[j][0]);
        sum_b += bf16_lo(pp[j][1]) + bf16_hi(pp[j][1]);
      }
      l_a = l_a * alpha_a + sum_a;
      l_b = l_b * alpha_b + sum_b;
#pragma unroll
      for (int j = 0; j < dtiles; ++j) {
        o[j][0] *= alpha_a;
        o[j][1] *= alpha_a;
        o[j][2] *= alpha_b;
        o[j][3] *= alpha_b;
      }
      // O[16, D] += P[16, 64] V[64, D], 16 keys at a time.
#pragma unroll
      for (int kk = 0; kk < mma_keys / 16; ++kk) {
        const unsigned a[4] = {pp[2 * kk][0], pp[2 * kk][1], pp[2 * kk + 1][0], pp[2 * kk + 1][1]};
        const int key = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
        for (int dp = 0; dp < dtiles / 2; ++dp) {
          unsigned b[4];
          ldsm_x4_trans(smem_addr(sv + swz<D>(key, 2 * dp + (lane >> 4))), b);
          mma_bf16(o[2 * dp], a, b[0], b[1]);
          mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
        }
      }
    }
    __syncthreads();  // everyone is done with stage t & 1 before tile t + 2 is copied into it
  }
  copy_async_wait<0>();

  if (!warp_active) return;
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 1);
  l_a += __shfl_xor_sync(0xffffffffu, l_a, 2);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 1);
  l_b += __shfl_xor_sync(0xffffffffu, l_b, 2);
  const float inv_a = l_a > 0.0f ? 1.0f / l_a : 0.0f, inv_b = l_b > 0.0f ? 1.0f / l_b : 0.0f;
  const int r_a = warp_row0 + (lane >> 2), r_b = r_a + 8;
  bf16* out = static_cast<bf16*>(p.out) + static_cast<std::int64_t>(q0 + row0) * p.n_q_heads * D +
              h * D + 2 * (lane & 3);
  const std::int64_t row_stride = static_cast<std::int64_t>(p.n_q_heads) * D;
#pragma unroll
  for (int j = 0; j < dtiles; ++j) {
    if (r_a < rows_here)
      *reinterpret_cast<__nv_bfloat162*>(out + r_a * row_stride + j * 8) =
          __floats2bfloat162_rn(o[j][0] * inv_a, o[j][1] * inv_a);
    if (r_b < rows_here)
      *reinterpret_cast<__nv_bfloat162*>(out + r_b * row_stride + j * 8) =
          __floats2bfloat162_rn(o[j][2] * inv_b, o[j][3] * inv_b);
  }
}

template <int D, int Warps, int MinBlocks>
void launch_mma(cudaStream_t stream, const AttentionParams& p) {
  static const bool configured = [] {
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_mma_kernel<D, Warps, MinBlocks>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          MmaLayout<D>::total));
    return true;
  }();
  (void)configured;
  const dim3 grid(p.n_q_heads, ceil_div(p.max_query_len, Warps * 16), p.num_seqs);
  attention_prefill_mma_kernel<D, Warps, MinBlocks>
      <<<grid, Warps * 32, MmaLayout<D>::total, stream>>>(p);
  XSERV_CUDA_LAUNCH_CHECK();
}

// XSERV_CUDA_PREFILL_WARPS (tuning): 4 / 6 (default) / 8 warps a block, i.e. 64 / 96 / 128
// query rows sharing each K/V tile, at 3 / 2 / 1 blocks an SM.
template <int D>
void launch_mma_warps(cudaStream_t stream, const AttentionParams& p) {
  const char* env = std::getenv("XSERV_CUDA_PREFILL_WARPS");
  const std::string_view w = env == nullptr ? "" : env;
  if (w == "4") launch_mma<D, 4, 3>(stream, p);
  else if (w == "8") launch_mma<D, 8, 1>(stream, p);
  else launch_mma<D, 6, 2>(stream, p);
}

// ---- f32 kernel ------------------------------------------------------------------------------
// f32 activations (GPT-2) on CUDA cores: f32 in, f32 products and sums, no tensor cores (TF32
// would round q and k to 10-bit mantissas). Launch: grid (n_q_heads, ceil(max_query_len / Rows),
// num_seqs), W warps; a block owns Rows = 4 x R x W query rows of one head (R rows a thread;
// by default R = 2, W = 4: 32 rows, 128 threads) and walks the key tiles of 32 from key 0 to its
// last row, the K and V tiles double-buffered in shared memory with cp.async through the block table
// (keys past the block's last row zero-filled). Heads vary fastest and row tiles go last-first,
// as in the mma kernel. Before, f32 prefill ran the decode kernel once per query row, each row
// reading all of its K/V from L2 again; here each K/V element read serves Rows rows.
//
// Warp w owns rows 4Rw .. 4Rw + 4R - 1; lane = 8 g + c holds rows 4Rw + g + 4i (i < R), and
// - scores: keys c, c + 8, c + 16, c + 24 of the tile for each of its rows, a dot product over D
//   in float4 steps (Q staged once, pre-scaled by scale * log2(e)); the 8 lanes of a row sit
//   side by side (the row max and sum are three shuffles);
// - online softmax in base 2: p = 2^(s - m) with the running max m per row, written to the
//   warp's rows of a shared P tile (only the owning warp reads them back: __syncwarp);
// - P V: the lane owns columns 4c + 32j (float4 pieces, j < D / 32) of its rows; each float4 of V
//   it reads serves its R rows, P is read four keys at a time. At D = 16 (test fixtures) lanes
//   c < 4 own the four pieces and the others idle in this step.
// Shared rows are padded by 4 floats: the float4 of key c + 8j at column d lies 4 banks after
// key c - 1's, so the 8 keys (K) or 8 column pieces (V) a quarter warp reads are conflict-free
// and the warp's other row groups read the same addresses (broadcast).
//
// Every row attends to key 0, and tile 0 is used by every row, so each row's max is finite from
// the first tile on: no -inf - -inf. Rows past the sequence compute on zero q with the block's
// last row's mask and are not stored.
constexpr int f32_keys = 32;

template <int D, int R, int W>
struct F32Layout {
  static constexpr int rows = 4 * R * W;
  static constexpr int ld = D + 4;             // floats per Q, K and V row
  static constexpr int ldp = f32_keys + 4;     // floats per P row
  static constexpr int q_floats = rows * ld;
  static constexpr int p_floats = rows * ldp;
  static constexpr int tile_floats = f32_keys * ld;  // one K or V tile
  // Q + P + two stages of K + V: 47 KB at D = 64, 32 rows; 87 KB at D = 128, 32 rows.
  static constexpr int bytes = (q_floats + p_floats + 4 * tile_floats) * 4;
};

// Copies key tile `tile` (keys tile * 32 ..) of kv head kvh: thread t moves float4 piece
// t % (D / 4) of keys t / (D / 4), + Threads / (D / 4), ...; keys past last_key are zero-filled.
template <int D, int Threads>
__device__ __forceinline__ void load_f32_kv_tile(const AttentionParams& p, const std::int32_t* table,
                                                 int kvh, int tile, int last_key, float* sk,
                                                 float* sv) {
  constexpr int chunks = D / 4, keys_per_pass = Threads / chunks, ld = D + 4;
  const float* kc = static_cast<const float*>(p.k_cache);
  const float* vc = static_cast<const float*>(p.v_cache);
  const int c = threadIdx.x % chunks;
  const int bs = p.block_size, shift = __ffs(bs) - 1;  // as load_kv_tile: shifts for 2^n blocks
  const bool pow2 = (bs & (bs - 1)) == 0;
  const std::int64_t row_elems = static_cast<std::int64_t>(p.n_kv_heads) * D;
#pragma unroll
  for (int r = threadIdx.x / chunks; r < f32_keys; r += keys_per_pass) {
    const int key = tile * f32_keys + r;
    const bool ok = key <= last_key;
    std::int64_t off = 0;
    if (ok) {
      const int blk = pow2 ? key >> shift : key / bs, in_blk = pow2 ? key & (bs - 1) : key % bs;
      off = (static_cast<std::int64_t>(table[blk]) * bs + in_blk) * row_elems + kvh * D + c * 4;
    }
    copy_async16_zfill(sk + r * ld + c * 4, kc + off, ok);
    copy_async16_zfill(sv + r * ld + c * 4, vc + off, ok);
  }
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc) {
  acc = fmaf(a.x, b.x, acc);
  acc = fmaf(a.y, b.y, acc);
  acc = fmaf(a.z, b.z, acc);
  return fmaf(a.w, b.w, acc);
}

template <int D, int R, int W>
__global__ void __launch_bounds__(W * 32) attention_prefill_f32_kernel(const AttentionParams p) {
  using Lay = F32Layout<D, R, W>;
  constexpr int threads = W * 32;
  constexpr int rows = Lay::rows, ld = Lay::ld, ldp = Lay::ldp, chunks = D / 4;
  constexpr int dj = D >= 32 ? D / 32 : 1;  // float4 column pieces a lane owns
  extern __shared__ __align__(128) unsigned char f32_smem_raw[];
  float* sq = reinterpret_cast<float*>(f32_smem_raw);
  float* sp = sq + Lay::q_floats;
  float* skv = sp + Lay::p_floats;  // stage s: K at 2 s tile_floats, V after it

  const int h = blockIdx.x, seq = blockIdx.z;
  const int q0 = p.query_start[seq];
  const int q_len = p.query_start[seq + 1] - q0;
  const int row0 = (gridDim.y - 1 - blockIdx.y) * rows;
  if (row0 >= q_len) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int first_pos = p.context_lens[seq] - q_len;  // position of the sequence's first new row
  const int rows_here = min(rows, q_len - row0);
  const int kvh = h / (p.n_q_heads / p.n_kv_heads);
  const int last_key = first_pos + row0 + rows_here - 1;
  const int n_tiles = last_key / f32_keys + 1;
  const std::int32_t* table =
      p.block_tables + static_cast<std::int64_t>(seq) * p.max_blocks_per_seq;

  // K/V tile 0 in flight while Q is staged (scaled, so the scores come out in base-2 units).
  load_f32_kv_tile<D, threads>(p, table, kvh, 0, last_key, skv, skv + Lay::tile_floats);
  copy_async_commit();
  {
    const float* qkv = static_cast<const float*>(p.qkv);
    const float qscale = p.scale * 1.4426950408889634f;
    for (int i = tid; i < rows * chunks; i += threads) {
      const int r = i / chunks, c = i % chunks;
      float4 v = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
      if (r < rows_here) {
        v = *reinterpret_cast<const float4*>(
            qkv + static_cast<std::int64_t>(q0 + row0 + r) * p.qkv_stride + h * D + c * 4);
        v.x *= qscale;
        v.y *= qscale;
        v.z *= qscale;
        v.w *= qscale;
      }
      *reinterpret_cast<float4*>(sq + r * ld + c * 4) = v;
    }
  }

  const int g = lane >> 3, c = lane & 7;
  const bool owns_columns = D >= 32 || c < D / 4;  // D = 16: four lanes of a row own its columns
  const int warp_row0 = warp * 4 * R;
  const bool warp_active = warp_row0 < rows_here;
  const int warp_last_pos = first_pos + row0 + min(warp_row0 + 4 * R - 1, rows_here - 1);
  int r_of[R], pos_of[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    r_of[i] = warp_row0 + g + 4 * i;
    pos_of[i] = min(first_pos + row0 + r_of[i], last_key);
  }
  const int block_first_pos = first_pos + row0;
  float o[R][dj][4], m[R], l[R];
#pragma unroll
  for (int i = 0; i < R; ++i) {
    m[i] = -CUDART_INF_F;
    l[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < dj; ++j) o[i][j][0] = o[i][j][1] = o[i][j][2] = o[i][j][3] = 0.0f;
  }

  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      float* next = skv + ((t + 1) & 1) * 2 * Lay::tile_floats;
      load_f32_kv_tile<D, threads>(p, table, kvh, t + 1, last_key, next, next + Lay::tile_floats);
    }
    copy_async_commit();   // possibly empty: one group per tile
    copy_async_wait<1>();  // tile t has landed
    __syncthreads();       // for every thread (and Q, before the first tile)
    const int key0 = t * f32_keys;
    if (warp_active && key0 <= warp_last_pos) {
      const float* sk = skv + (t & 1) * 2 * Lay::tile_floats;
      const float* sv = sk + Lay::tile_floats;
      float s[R][4];
#pragma unroll
      for (int i = 0; i < R; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.0f;
#pragma unroll 8
      for (int d = 0; d < D; d += 4) {
        float4 q[R];
#pragma unroll
        for (int i = 0; i < R; ++i) q[i] = *reinterpret_cast<const float4*>(sq + r_of[i] * ld + d);
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float4 k = *reinterpret_cast<const float4*>(sk + (c + 8 * j) * ld + d);
#pragma unroll
          for (int i = 0; i < R; ++i) s[i][j] = dot4(q[i], k, s[i][j]);
        }
      }
      // Keys above a row's diagonal (and the zero-filled tail past the block's last row).
      if (key0 + f32_keys - 1 > block_first_pos) {
#pragma unroll
        for (int i = 0; i < R; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j)
            if (key0 + c + 8 * j > pos_of[i]) s[i][j] = -CUDART_INF_F;
      }
#pragma unroll
      for (int i = 0; i < R; ++i) {
        float mx = fmaxf(fmaxf(s[i][0], s[i][1]), fmaxf(s[i][2], s[i][3]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
        const float m_new = fmaxf(m[i], mx);  // finite: see the kernel's comment
        const float alpha = exp2f(m[i] - m_new);  // 0 at the first tile
        m[i] = m_new;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const float pj = exp2f(s[i][j] - m_new);
          sp[r_of[i] * ldp + c + 8 * j] = pj;
          sum += pj;
        }
        l[i] = l[i] * alpha + sum;  // this lane's keys only; the row's 8 lanes add up at the end
#pragma unroll
        for (int j = 0; j < dj; ++j) {
          o[i][j][0] *= alpha;
          o[i][j][1] *= alpha;
          o[i][j][2] *= alpha;
          o[i][j][3] *= alpha;
        }
      }
      __syncwarp();  // the warp's P rows are written
#pragma unroll 2
      for (int k = 0; k < (owns_columns ? f32_keys : 0); k += 4) {
        float4 pk[R];
#pragma unroll
        for (int i = 0; i < R; ++i) pk[i] = *reinterpret_cast<const float4*>(sp + r_of[i] * ldp + k);
#pragma unroll
        for (int kk = 0; kk < 4; ++kk) {
#pragma unroll
          for (int j = 0; j < dj; ++j) {
            const float4 v = *reinterpret_cast<const float4*>(sv + (k + kk) * ld + j * 32 + c * 4);
#pragma unroll
            for (int i = 0; i < R; ++i) {
              const float w = kk == 0 ? pk[i].x : kk == 1 ? pk[i].y : kk == 2 ? pk[i].z : pk[i].w;
              o[i][j][0] = fmaf(w, v.x, o[i][j][0]);
              o[i][j][1] = fmaf(w, v.y, o[i][j][1]);
              o[i][j][2] = fmaf(w, v.z, o[i][j][2]);
              o[i][j][3] = fmaf(w, v.w, o[i][j][3]);
            }
          }
        }
      }
    }
    __syncthreads();  // everyone is done with stage t & 1 (and P) before tile t + 2 replaces it
  }
  copy_async_wait<0>();

  if (!warp_active) return;
  const std::int64_t row_stride = static_cast<std::int64_t>(p.n_q_heads) * D;
  float* out = static_cast<float*>(p.out) + static_cast<std::int64_t>(q0 + row0) * row_stride + h * D;
#pragma unroll
  for (int i = 0; i < R; ++i) {
    float sum = l[i];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    sum += __shfl_xor_sync(0xffffffffu, sum, 4);
    const float inv = 1.0f / sum;  // >= 1: the row's max term is 2^0
    if (r_of[i] >= rows_here || !owns_columns) continue;
#pragma unroll
    for (int j = 0; j < dj; ++j)
      *reinterpret_cast<float4*>(out + r_of[i] * row_stride + j * 32 + c * 4) =
          make_float4(o[i][j][0] * inv, o[i][j][1] * inv, o[i][j][2] * inv, o[i][j][3] * inv);
  }
}

template <int D, int R, int W>
void launch_f32(cudaStream_t stream, const AttentionParams& p) {
  using Lay = F32Layout<D, R, W>;
  static const bool configured = [] {
    XSERV_CUDA_CHECK(cudaFuncSetAttribute(attention_prefill_f32_kernel<D, R, W>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Lay::bytes));
    return true;
  }();
  (void)configured;
  const dim3 grid(p.n_q_heads, ceil_div(p.max_query_len, Lay::rows), p.num_seqs);
  attention_prefill_f32_kernel<D, R, W><<<grid, W * 32, Lay::bytes, stream>>>(p);
  XSERV_CUDA_LAUNCH_CHECK();
}

// XSERV_CUDA_PREFILL_F32_ROWS / _WARPS (tuning, read at every launch): the block's rows and
// warps, 16 / 4, 32 / 4 (default), 32 / 8 or 64 / 8 (a thread holds rows / (4 x warps) rows);
// other pairs take the default. GPT-2 prefill (H200, 2026-12-02, docs/benchmarks.md): the 12
// attention launches of 512 tokens took 569 us at 32 / 4, 706 at 16 / 4 (1129 on the decode
// kernel before); prefill tok/s at 512 / 1022 tokens 143k / 151k at 32 / 4, 137-138k / 141k at
// 16 / 4, 136k / 139k at 32 / 8, 137k / 149k at 64 / 8.
template <int D>
void launch_f32_shape(cudaStream_t stream, const AttentionParams& p) {
  const char* rows_env = std::getenv("XSERV_CUDA_PREFILL_F32_ROWS");
  const char* warps_env = std::getenv("XSERV_CUDA_PREFILL_F32_WARPS");
  const std::string_view rows = rows_env == nullptr ? "" : rows_env;
  const bool eight = warps_env != nullptr && std::string_view(warps_env) == "8";
  if (rows == "16" && !eight) launch_f32<D, 1, 4>(stream, p);
  else if (rows == "32" && eight) launch_f32<D, 1, 8>(stream, p);
  else if (rows == "64" && eight) launch_f32<D, 2, 8>(stream, p);
  else launch_f32<D, 2, 4>(stream, p);
}

// XSERV_CUDA_PREFILL_F32=0 sends f32 prefill back to the decode kernel run once per query row
// (launch_attention_rows), for A/B comparisons; read at every call, as prefill_mma_enabled.
bool prefill_f32_enabled() {
  const char* env = std::getenv("XSERV_CUDA_PREFILL_F32");
  return env == nullptr || std::string_view(env) != "0";
}

// XSERV_CUDA_PREFILL_MMA=0 selects the wmma kernel; read at every launch (a prefill's kernels
// run for milliseconds), so tests can compare both kernels in one process.
bool prefill_mma_enabled() {
  const char* env = std::getenv("XSERV_CUDA_PREFILL_MMA");
  return env == nullptr || std::string_view(env) != "0";
}

}  // namespace

bool attention_prefill_supported(DType dt, std::int32_t head_dim) noexcept {
  if (dt == DType::f32)
    return prefill_f32_enabled() &&
           (head_dim == 16 || head_dim == 32 || head_dim == 64 || head_dim == 128);
  return dt == DType::bf16 && (head_dim == 64 || head_dim == 128);
}

void launch_attention_prefill(cudaStream_t stream, DType dt, const AttentionParams& p) {
  if (p.num_tokens == 0 || p.max_query_len == 0) return;
  if (dt == DType::f32) {
    // 16 and 32: the test fixtures' head dims (tiny GPT-2, tiny Qwen3), so the model and
    // engine tests run this kernel too.
    switch (p.head_dim) {
      case 16: launch_f32_shape<16>(stream, p); break;
      case 32: launch_f32_shape<32>(stream, p); break;
      case 64: launch_f32_shape<64>(stream, p); break;
      default: launch_f32_shape<128>(stream, p); break;
    }
  } else if (prefill_mma_enabled()) {
    if (p.head_dim == 64) launch_mma_warps<64>(stream, p);
    else launch_mma_warps<128>(stream, p);
  } else {
    if (p.head_dim == 64) launch_wmma<64>(stream, p);
    else launch_wmma<128>(stream, p);
  }
}

}  // namespace xserv::cuda
