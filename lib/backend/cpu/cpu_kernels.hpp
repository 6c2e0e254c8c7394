// The CPU backend's hot loops, compiled once per instruction set and picked at run time.
//
// xserv is built without -march (a library must run on any x86-64 or ARM machine), so the loops
// that dominate a forward (GEMM/GEMV tiles, attention over the cache) live in cpu_kernels.inc,
// which is compiled several times: generic (the compiler's baseline), and on x86-64 also with
// AVX2+FMA+F16C and with AVX-512. kernels() returns the best table the running CPU supports.
// Each compilation sits in its own namespace, so the copies never collide (no ODR mixing).
#pragma once

#include <cstdint>
#include <vector>

#include "backend/backend.hpp"
#include "tensor/dtype.hpp"

namespace xserv::cpu {

// out[m, n] = sum_k a[m, k] * W(k, n) + bias[n] + beta * out[m, n] for a tile of rows and columns.
struct GemmProblem {
  const float* a = nullptr;  // [m, k], rows k apart
  std::int64_t m = 0, k = 0, n = 0;
  const void* w = nullptr;  // [k, n] (in_out) or [n, k] (out_in), in w_dtype
  DType w_dtype = DType::f32;
  WeightLayout layout = WeightLayout::in_out;
  const float* bias = nullptr;  // [n] f32 or null
  float beta = 0.0f;
  float* out = nullptr;  // rows ldo apart
  std::int64_t ldo = 0;
  bool gelu = false;     // then out = gelu_tanh(out) (GPT-2's MLP up projection, fused)
  std::int64_t kc = 0;   // packed weight tile depth, 0: the kernel's own (XSERV_CPU_GEMM_KC)
  // The next weight tile is prefetched during the current one's multiply into: 2 L1 and L2,
  // 1 L2 only (the backend's default), 0 nowhere (XSERV_CPU_GEMM_PREFETCH=l1|l2|off).
  int pack_prefetch = 1;
  // The first weight tile of a task prefetched into L2 whole before it is packed
  // (XSERV_CPU_GEMM_FIRST=l2; measurement).
  bool first_tile_prefetch = false;
  // The AMX path (cpu_amx.hpp): A rounded to bf16, rows padded to amx_rows and K to amx_k
  // (lda_bf16 elements apart), or null.
  const std::uint16_t* a_bf16 = nullptr;
  std::int64_t lda_bf16 = 0;
  // Software prefetch of a GEMV's weight stream (M <= gemv_max_rows; XSERV_CPU_GEMV_PREFETCH,
  // chosen per CPU vendor in cpu_gemm.cpp): gemv_prefetch_l1, the lines a few rows ahead into L1
  // (prefetcht0) just before they are read; gemv_prefetch_l2, when not 0, the line that many
  // bytes ahead of the streaming position into L2 (prefetcht1), never past the tile's own weights.
  bool gemv_prefetch_l1 = true;
  std::int64_t gemv_prefetch_l2 = 0;
  // How far ahead in the out_in GEMV's stream (bytes, as the C interleaved rows are read) the L1
  // prefetch runs; 0: the same place in the next C rows (C * K weights ahead: 48 KB for GPT-2's
  // f32 mlp down projection, more than the L1 holds). XSERV_CPU_GEMV_L1_KB (cpu_gemm.cpp).
  std::int64_t gemv_l1_ahead = 0;
  // A GEMV tile's first gemv_prefetch_l2 bytes prefetched into L2 before its loop starts
  // (the backend: XSERV_CPU_GEMV_HEAD, on for Intel CPUs; cpu_gemm.cpp): the running L2
  // prefetch covers only what lies that far ahead, so without it every tile (a guided piece:
  // several per thread per GEMV) begins with 32 KB read on demand and by the L1 prefetch alone.
  bool gemv_prefetch_head = false;
  // One activation row (M = 1, batch-1 decode) over out_in weights: the W rows one after the
  // other, each read start to end with 4 accumulators, so a thread's weights are one sequential
  // stream (as stream_read_bench reads), its L1 prefetch gemv_l1_ahead bytes ahead (4 KB when 0)
  // and its L2 prefetch gemv_prefetch_l2 ahead. Otherwise C = 4 rows are read in step, four
  // streams a row apart (M > 1 always: each weight then feeds M rows). The backend sets it
  // unless XSERV_CPU_GEMV_SEQ=0 (cpu_gemm.cpp).
  bool gemv_seq = false;
};

// Rows up to which a GEMM runs as a GEMV: one pass over the weights, all rows at once.
inline constexpr std::int64_t gemv_max_rows = 8;

// Attention of `rows` query rows of one sequence at consecutive positions (row r over keys
// [0, n_keys + r)), the query heads of `kv_heads` consecutive KV groups. Taking several kv heads
// per task turns the strided per-head cache reads into contiguous runs of each slot (decode is
// bound by reading the cache); several rows per task (prefill) read each K/V block once for all
// of them instead of once per row.
struct AttentionTask {
  const float* q = nullptr;  // row r: q + r * q_row_stride, [kv_heads * group, head_dim]
  float* out = nullptr;      // row r: out + r * out_row_stride, [kv_heads * group, head_dim]
  std::int32_t group = 1;    // q heads sharing one kv head
  std::int32_t kv_heads = 1;
  std::int32_t head_dim = 0;
  std::int32_t n_keys = 0;   // of row 0
  std::int32_t rows = 1;
  std::int64_t q_row_stride = 0, out_row_stride = 0;
  const std::int32_t* block_table = nullptr;  // the sequence's blocks
  std::int32_t block_size = 0;
  // The cache: f32, or bf16 (CpuBackend::kv_dtype; read through exact widening to f32).
  DType kv_dtype = DType::f32;
  const void* k_cache = nullptr;  // points at the first kv head of slot 0
  const void* v_cache = nullptr;
  std::int64_t slot_stride = 0;  // elements between consecutive slots (n_kv_heads * head_dim)
  float scale = 1.0f;
  // One-row tasks (decode) prefetch the K and V rows of their heads this many cache blocks ahead
  // into L2 (0: none; XSERV_CPU_ATTN_PREFETCH): between two tokens every weight streams through
  // the caches, so a layer's cache comes from DRAM, in runs of head_dim floats a slot apart that
  // the hardware prefetchers do not follow.
  std::int32_t prefetch_blocks = 0;
  // A one-row task over part of a row's keys (CpuBackend::attention splits long decode contexts
  // into parts): when set, the kernel writes its unnormalised state instead of out, per q head g
  // in partial + g * (head_dim + 2): the output accumulator [head_dim], then the running max and
  // the running sum of exp(score - max), for the caller to merge.
  float* partial = nullptr;
  // Rows in tiles of a register's lanes (a prefill's row blocks; XSERV_CPU_ATTN_LANES=0 turns it
  // off): attention_lanes in cpu_kernels.inc.
  bool lanes = false;
};

// Scratch (floats, per calling thread) the kernels need; the GEMM's is 64-byte aligned (the
// packed panels are read a whole 512-bit register at a time).
inline constexpr std::int64_t gemm_scratch_floats = 256 * 128;
// A head's scores of one cache block take whole registers of the widest copy (16 floats).
inline std::int64_t attention_scores_stride(std::int32_t block_size) noexcept {
  return (std::int64_t{block_size} + 15) / 16 * 16;
}
// Row tiles in lanes (AttentionTask::lanes) take up to 16 rows' transposed q and accumulators
// per head, a block's scores, and a bf16 block's K and V widened.
inline std::int64_t attention_scratch_floats(const AttentionTask& t) noexcept {
  const std::int64_t g = std::int64_t{t.group} * t.kv_heads, d = t.head_dim;
  const std::int64_t stride = attention_scores_stride(t.block_size);
  const std::int64_t rows = t.rows * g * (d + stride + 3);
  if (!t.lanes || t.rows < 2) return rows;
  const std::int64_t lanes = 16 * (2 * g * d + stride + 2 * g) + 2 * stride * d;
  return rows > lanes ? rows : lanes;
}

struct KernelTable {
  const char* isa;
  // Output rows [m0, m1) and columns [n0, n1) of a GEMM, epilogue included. Tiles of at most
  // gemv_max_rows rows take the GEMV path.
  void (*gemm_tile)(const GemmProblem& p, std::int64_t m0, std::int64_t m1, std::int64_t n0,
                    std::int64_t n1, float* scratch);
  void (*attention)(const AttentionTask& t, float* scratch);
  // x = gelu_tanh(x) in place.
  void (*gelu)(float* x, std::int64_t n);
  // out = silu(g) * u.
  void (*silu_mul)(float* out, const float* g, const float* u, std::int64_t n);
  // Index of the first maximum of x[0, n) (greedy sampling); NaN never wins, all NaN gives 0.
  std::int64_t (*argmax)(const float* x, std::int64_t n);
};

namespace generic { extern const KernelTable table; }
#if defined(__x86_64__) && defined(__GNUC__)
#define XSERV_CPU_X86_KERNELS 1
namespace avx2 { extern const KernelTable table; }
namespace avx512 { extern const KernelTable table; }
#endif

// The fastest table this CPU runs; XSERV_CPU_ISA=generic|avx2|avx512 in the environment picks
// another one the CPU supports (benchmarks compare them).
const KernelTable& kernels() noexcept;
// Every table this CPU can run, generic first (tests check each against a reference).
std::vector<const KernelTable*> supported_kernels();

}  // namespace xserv::cpu
