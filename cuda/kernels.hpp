// Launchers of the CUDA backend's own kernels, one .cu file per family. Plain C++ on this side
// so cuda_backend.cpp needs no device code. Every launcher enqueues on `stream` and returns;
// `dt` is the activation dtype (f32 or bf16), which is also the dtype of the weights a kernel
// reads (import_weight converts f16 to bf16) and of the KV cache.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "tensor/dtype.hpp"

namespace xserv::cuda {

// Whether kernels that support it are launched with programmatic dependent launch (see
// launch_pdl in common.cuh); XSERV_CUDA_PDL=0 turns it off. On since each kernel lets the next one
// launch only after its own wait (two kernels of a chain overlap): on the H200 that made batch-1
// decode 4-8% faster on the small models (docs/benchmarks.md, "Programmatic dependent launch, one
// kernel ahead"), where letting every kernel launch the next first thing had measured no faster.
bool pdl_enabled() noexcept;
// The RMSNorm/LayerNorm register kernel and the vectorised SwiGLU launch with programmatic
// dependent launch too (XSERV_CUDA_SMALL_PDL, read once; needs pdl_enabled()): they load what
// no kernel writes (the norm weights) before grid_dependency_wait. On by default (Qwen3-1.7B at
// 16 decode rows 1.58 -> 1.52 ms a step, 64/128 rows unchanged); XSERV_CUDA_SMALL_PDL=0 gives the
// plain launches that only let the next kernel start early.
bool small_kernels_pdl() noexcept;
// Decode GEMVs whose weight is larger than this launch plainly even with pdl_enabled()
// (XSERV_CUDA_PDL_GEMV_MB, read once; default 32 MB): Qwen3-8B's 33-201 MB GEMVs run 13-52 us,
// there is no launch gap to hide, and the dependent blocks resident early measured 2-3% slower.
std::int64_t pdl_gemv_max_bytes() noexcept;

// embedding.cu
void launch_embedding(cudaStream_t stream, DType dt, void* out, const std::int32_t* ids,
                      const void* table, const void* pos_table, const std::int32_t* positions,
                      std::int64_t rows, std::int64_t dim, std::int64_t vocab,
                      std::int64_t n_positions);
// tokens[i] < 0 becomes sampled[-tokens[i] - 1] (an overlapped step's inputs; one block).
void launch_resolve_tokens(cudaStream_t stream, std::int32_t* tokens, std::int64_t n,
                           const std::int32_t* sampled);
// A decode step's batch kept on the device (Backend::prepare_decode; one block): when
// control[0] is set (a step after the one whose copy armed it), positions, slots and context
// lengths of rows below control[1] grow by one; then tokens[i] = token_src[i], a negative one
// resolved from `sampled` as above (sampled may be null when none is negative); control[0] = 1.
void launch_prepare_decode(cudaStream_t stream, std::int32_t* tokens, const std::int32_t* token_src,
                           std::int32_t* positions, std::int32_t* slots, std::int32_t* context_lens,
                           std::int32_t* control, std::int64_t n, const std::int32_t* sampled);

// norm.cu: LayerNorm (bias may be null) or RMSNorm (bias unused) with the optional fused
// residual add (residual += x; normalise residual).
void launch_norm(cudaStream_t stream, DType dt, bool rms, void* out, const void* x,
                 void* residual, const void* weight, const void* bias, float eps,
                 std::int64_t rows, std::int64_t dim);
// The end of a residual GEMM split in K (Gemm::run_split_k) and the next RMSNorm, one kernel:
//   x = x + sum_s partials[s]   (f32 sum in split order, + x, rounded to dt once, as cuBLASLt's
//                                beta = 1 GEMM rounds)
//   h = RMSNorm(x) * weight     (rounded as launch_norm: bf16(bf16(x rstd) w))
// x, h [rows, dim] in dt (bf16 or f32); partials [splits][rows][dim] f32. dim % 256 == 0 (whole
// warps) and dim <= 8192, 16-byte aligned x, h, weight (residual_rms_norm_supported).
bool residual_rms_norm_supported(std::int64_t dim, const void* x, const void* h, const void* weight) noexcept;
void launch_residual_rms_norm(cudaStream_t stream, DType dt, void* x, void* h, const float* partials, int splits,
                              const void* weight, float eps, std::int64_t rows, std::int64_t dim);

// activation.cu
void launch_gelu(cudaStream_t stream, DType dt, void* x, std::int64_t n);
void launch_swiglu(cudaStream_t stream, DType dt, void* out, const void* gate_up,
                   std::int64_t rows, std::int64_t inner);
void launch_gather_rows(cudaStream_t stream, DType dt, void* out, const void* x,
                        const std::int32_t* rows, std::int64_t num_rows, std::int64_t dim);
// Converts n elements between float dtypes (f32, f16, bf16), used at weight import.
void launch_convert(cudaStream_t stream, DType from, DType to, const void* src, void* dst,
                    std::int64_t n);
// dst [n, k] = src [k, n] transposed, elements of 2 or 4 bytes (weights at load).
void launch_transpose(cudaStream_t stream, std::size_t elem_bytes, const void* src, void* dst,
                      std::int64_t k, std::int64_t n);
// dst[i] = offset + scale * (uniform(seed, i) * 2 - 1): dummy weights made on the device.
void launch_fill_random(cudaStream_t stream, DType dt, void* dst, std::int64_t n,
                        std::uint64_t seed, float scale, float offset);

// A range of the next kernel's weight that a kernel asks into L2 (common.cuh, bulk_prefetch_l2)
// once its own loads are out, where its remaining work would leave DRAM idle: data and bytes
// multiples of 16; empty: nothing. A hint only: no result depends on it.
struct L2Prefetch {
  const void* data = nullptr;
  std::int64_t bytes = 0;
};

// gemv.cu: out[m, :] = a[m, :] . W (+ bias) (+ beta * out) for M <= max_gemv_rows, a and W in
// dt (f32 or bf16), out in dt or f32; W [N, K] (in_out = false) or [K, N] (in_out = true). The
// weight-streaming path of decode steps. in_out GEMMs split K over blocks and need
// gemv_scratch_floats() floats of scratch and gemv_tickets() zeroed counters (left zeroed).
// When the GEMV kernels beat cuBLASLt (measured on the H200, decode ms/step, GEMV / cuBLASLt):
// one row always (Qwen3-8B 4.90 / 5.34); 2-4 rows only for small weights (Qwen3-0.6B at batch 4
// 1.40 / 1.53, GPT-2 0.81 / 0.89), not for Qwen3-8B's 33-201 MB ones (batch 2 5.47 / 5.38,
// batch 4 7.16 / 5.42: every weight load re-reads M activation vectors from L1).
constexpr std::int64_t max_gemv_rows = 4;
constexpr std::int64_t max_gemv_multirow_weight_bytes = std::int64_t{16} << 20;
bool gemv_supported(DType dt, bool in_out, std::int64_t m, std::int64_t n, std::int64_t k,
                    const void* a, const void* w) noexcept;
std::size_t gemv_scratch_floats(DType dt, bool in_out, std::int64_t m, std::int64_t n,
                                std::int64_t k, int sm_count) noexcept;
std::size_t gemv_tickets(DType dt, std::int64_t n) noexcept;
// What the op around a one-row GEMV knows of the next kernel (CudaBackend::gemm_rms_norm_gemm:
// the o_proj, then the SwiGLU GEMV). The defaults change nothing.
struct GemvChain {
  bool trigger_early = false;        // let the next kernel launch before this one's wait
  std::int64_t pdl_max_bytes = -1;   // PDL up to this weight size instead of pdl_gemv_max_bytes(); -1: the rule
  // The bulk GEMV asks these bytes into L2 after its own dependency wait and its read of the
  // activation row: [l2_next, l2_next + l2_next_bytes) and, with l2_next_second > 0, the same
  // length from l2_next + l2_next_second (the first rows of a gate|up's gate and up halves, in the
  // order its blocks read them). A hint only: no result depends on it; skipped unless both starts
  // are 16-byte aligned, as bulk prefetches need (GemvTuning::l2_next_mb).
  const void* l2_next = nullptr;
  std::int64_t l2_next_bytes = 0;
  std::int64_t l2_next_second = 0;
  // Only if this GEMV's blocks hold their whole weight in their rings before the wait (so that
  // after it DRAM idles through the products): the default rule of GemvTuning::l2_next_mb.
  bool l2_next_if_held = false;
};
// Whether a one-row GEMV of weight_bytes launches with programmatic dependent launch under chain.
bool gemv_launches_pdl(std::int64_t weight_bytes, const GemvChain& chain = {}) noexcept;
void launch_gemv(cudaStream_t stream, DType dt, DType out_dt, bool in_out, void* out,
                 std::int64_t ldo, const void* a, const void* w, const void* bias, float beta,
                 std::int64_t m, std::int64_t n, std::int64_t k, int sm_count, float* partial,
                 unsigned* tickets, const GemvChain& chain = {});

// Launch-shape overrides of the out_in GEMVs (0 = the measured default, warps_per_column in
// gemv.cu): warps per output column, 1, 2, 4 or 8, without and with the norm prologue.
// Read once from XSERV_CUDA_GEMV_WPR and XSERV_CUDA_GEMV_NORM_WPR;
// bench/gemv_bench and the op tests write here between launches (not thread-safe: for
// benchmarks and tests only).
// bulk: plain one-row GEMVs with K up to max_bulk_k stream their weights through shared memory
// with bulk copies (gemv_bulk_kernel in gemv.cu), measured faster on every Qwen3 size and GPT-2
// (docs/benchmarks.md, "Decode GEMVs on bulk copies"); XSERV_CUDA_GEMV_BULK=0 turns it off.
// early_out: the bulk GEMV reads its bias and previous output (the residual of beta = 1) right
// after the dependency wait instead of after the reduction (gemv.cu, finish_read): measured +1.7%
// on Qwen3-0.6B at batch 1 (docs/benchmarks.md, "Shorter decode critical paths");
// XSERV_CUDA_GEMV_EARLY_OUT=0 turns it off. bulk_max_mb (opt-in, XSERV_CUDA_GEMV_BULK_MAX_MB=N):
// only weights of at most N MB take the bulk kernel (0: any), the larger ones (lm_heads,
// Qwen3-8B's down_proj) the register kernel, measured faster alone at those sizes
// (docs/benchmarks.md, "Tried, not merged: norm GEMVs on bulk copies").
struct GemvTuning {
  int wpr = 0, norm_wpr = 0;
  bool bulk = true;
  bool early_out = true;
  int bulk_max_mb = 0;
  // Issue 12, 2026-12-03 (opt-in while measured): bulk_wide (XSERV_CUDA_GEMV_BULK_WIDE=1): the
  // bulk kernel reads an activation row too long for two blocks an SM beside its shared-memory
  // copy (Qwen3-8B's down_proj) from global memory, so two blocks fit; norm_occ
  // (XSERV_CUDA_GEMV_NORM_OCC, bits): the one-row norm GEMV's registers capped for 6 blocks an SM
  // without SwiGLU (1) and 4 with it (2); evict_first (XSERV_CUDA_GEMV_EVICT_FIRST=1): the
  // one-row GEMVs read their weights under an L2 evict-first policy; norm_persist
  // (XSERV_CUDA_GEMV_NORM_PERSIST=1, takes precedence over norm_occ): the one-row norm GEMVs with
  // one wave of persistent blocks, the prologue once a block and the next column group's first
  // loads issued before the current one's reduction.
  bool bulk_wide = false;
  int norm_occ = 0;
  bool evict_first = false;
  // -1 (default): on for bf16 rows of up to 2048 elements where one wave of persistent blocks
  // covers every column group (gemv.cu says why), and for logits (bf16 in, f32 out: the final
  // norm + lm_head) at any width; 0 off; 1 on; 2 the rule before 2026-12-04 (bf16 rows of up to
  // 2048 elements however many groups, and the logits).
  int norm_persist = -1;
  // norm_early_w (XSERV_CUDA_GEMV_NORM_EARLY_W=0 turns it off): the one-row RMSNorm GEMVs load
  // the norm weight before the dependency wait (one 16-byte vector a thread, rows of up to 2048
  // bf16). That weight is evicted from L2 by the weights streamed between two uses, so after the
  // wait it was a DRAM round trip on every norm GEMV's critical path; the same values. Measured
  // on the H200 (docs/benchmarks.md, "Batch-1 decode of the small Qwen3 models: ..."): Qwen3-1.7B
  // b1 834.5 -> 848.7 tok/s, 0.6B 1481 -> 1487.
  bool norm_early_w = true;
  // resid_prefetch (XSERV_CUDA_GEMV_RESID_PREFETCH=0 turns it off): the bulk GEMV asks its first
  // row's residual into L2 before the dependency wait (written kernels ago, evicted since by the
  // streamed weights): Qwen3-0.6B b1 1508 -> 1516 tok/s (docs/benchmarks.md, "Batch-1 decode of
  // the small Qwen3 models").
  bool resid_prefetch = true;
  // early_trigger (XSERV_CUDA_GEMV_EARLY_TRIGGER, bits; default 6): the one-row GEMVs let the next
  // kernel launch (griddepcontrol.launch_dependents) before their own dependency wait instead of
  // after it; 1: the bulk kernel (o_proj, down_proj), 2: the norm GEMVs (register and persistent
  // kernels: q|k|v, gate|up). The o_proj waits on the decode attention with its weight already in
  // its shared-memory ring, leaving DRAM idle; with the early trigger a PDL-launched gate|up can
  // become resident then and issue its first loads. The next kernel still waits for this one to
  // complete (griddepcontrol.wait): the same results. Measured (docs/benchmarks.md, "Batch-1
  // decode of Qwen3-1.7B: a CUPTI profile"): 1 gains on Qwen3-0.6B (b1 +1.2%), loses on GPT-2
  // (-3.4%) and does nothing for Qwen3-1.7B, whose 50 MB gate|up launches plainly; so off.
  // 4: only the bulk GEMV whose next kernel is the SwiGLU GEMV (the o_proj of
  // Backend::gemm_rms_norm_gemm at one row; GPT-2 runs no such op), see swiglu_pdl_mb. The
  // default: where that gate|up takes PDL (Qwen3-0.6B's 12.6 MB; not the 1.7B's 50 MB or the 8B's
  // 201 MB under the 32 MB rule) it fetches while the o_proj waits: Qwen3-0.6B b1 1318 -> 1343 and
  // 1319 -> 1349 tok/s in two interleaved passes (H100, 2026-12-05, docs/benchmarks.md, "The
  // o_proj -> gate|up boundary alone"); with swiglu_pdl_mb = 64 the 1.7B lost 1.5%.
  // 6 (bits 2 and 4, the default since 2026-12-07): the norm GEMVs too, so the decode attention
  // launches under the q|k|v GEMV's wait and starts its prologue earlier: batch-1 decode on an
  // H100, two interleaved passes against 4, Qwen3-0.6B 1352 / 1352 -> 1397 / 1397 tok/s (+3.3%),
  // GPT-2 2882 / 2888 -> 2956 / 2966 (+2.6%), Qwen3-1.7B 724 -> 722, 8B 179.9 -> 179.8; 2 alone
  // (without bit 4) gave the 0.6B nothing (docs/benchmarks.md, "The norm GEMVs' early trigger").
  int early_trigger = 6;
  // swiglu_pdl_mb (XSERV_CUDA_GEMV_SWIGLU_PDL_MB, opt-in): the RMSNorm + gate|up + SwiGLU GEMV
  // that follows a residual GEMV in one op (Backend::gemm_rms_norm_gemm at one row) takes PDL up
  // to this many MB of weight instead of pdl_gemv_max_bytes(): Qwen3-1.7B's 50 MB gate|up, the one
  // 1.7B GEMV past the 32 MB rule, whose start otherwise waits for the o_proj's completion and then
  // a DRAM round trip before its first bytes. 0: the rule. With early_trigger bit 4 (the bulk
  // GEMV of that op, the o_proj, lets it launch before its own wait, and no other bulk GEMV does),
  // its resident blocks fetch their first weights while the o_proj waits on the attention.
  int swiglu_pdl_mb = 0;
  // l2_next_mb (XSERV_CUDA_GEMV_L2_NEXT_MB): the o_proj of Backend::gemm_rms_norm_gemm at one
  // row (a bulk GEMV) asks the first N MB of the gate|up weight that follows it into L2 (half
  // from the gate rows, half from the up rows, the order its blocks read them: GemvChain::l2_next)
  // once it has passed its wait and read the activation row. Where the o_proj's rings hold its
  // whole weight before the wait (Qwen3-1.7B's 8.4 MB; not the 8B's 33.5 MB, which still
  // streams after it), DRAM idles through its ~2.5 us of products and the gate|up's plain launch;
  // the gate|up's first wave then starts from L2. -1 (default): 6 MB, only there and only ahead
  // of a gate|up that launches plainly (a PDL-launched one, Qwen3-0.6B's, is resident and
  // fetching already: it lost 3.6% with 12 MB); 0: off; N > 0: N MB wherever the op runs the
  // bulk GEMV (for comparisons). Measured on an H100 (2026-12-05, docs/benchmarks.md, "The
  // gate|up's first MB into L2"): Qwen3-1.7B b1 704-705 -> 720.7-720.8 tok/s (+2.3%) with 6 MB,
  // +1.7-1.9% with 8, +1.5% with 4, +1.3% with 10, +0.4% with 12 and 16 (the o_proj's
  // completion then waits on its prefetches: its end moved +1.5 us at 12 MB). On an H200
  // (2026-12-06, "The next op's weight into L2 during batched decode") it loses: 847-848 tok/s with 6 MB against
  // 856 off, 844-849 with 4 and 8 (two interleaved passes): its DRAM (4.8 TB/s) brings the gate|up's
  // first wave in about as fast from DRAM, and the prefetches only add traffic. So the default
  // rule holds only on devices whose DRAM peak is under gemv_l2_next_max_dram.
  // Asked before the o_proj's wait instead (first tried; removed 2026-12-07): it lengthened the
  // decode attention's post-wait chain by ~1.9 us while the gate|up gained ~1.4 us (16 MB; +0.4%
  // at 8 MB). Earlier L2 prefetches lost too (docs/benchmarks.md): a side stream's during the
  // three-kernel attention, and every GEMV's of its own weights before its wait, which fetched
  // while the previous GEMV still streamed.
  int l2_next_mb = -1;
};
// The DRAM peak (bytes/s) under which GemvTuning::l2_next_mb's default rule holds: an H100 SXM's
// 3.35 TB/s gains by it, an H200's 4.8 TB/s loses.
constexpr double gemv_l2_next_max_dram = 4.0e12;
constexpr int max_bulk_k = 16384;
// bench/gemv_bench's reference: a pure streaming read of `bytes` (a multiple of 16, 16-byte
// aligned) by `blocks` blocks of 256 threads, the ceiling a GEMV of that weight is held against.
void launch_read_probe(cudaStream_t stream, const void* p, std::size_t bytes, unsigned* sink, int blocks);
GemvTuning& gemv_tuning() noexcept;
// gemm_skinny.cu: the same product for 5..max_skinny_gemm_rows rows on tensor cores (batched
// decode), a and W [N, K] (out_in) in bf16, out in bf16 or f32: each weight element is loaded
// once and used for every row (gemm_skinny.cu says how). Needs N % 32 == 0, K % 64 == 0 and
// 16-byte aligned a and W; max_rows lowers the row limit (XSERV_CUDA_SKINNY_ROWS). Used up to
// default_skinny_gemm_rows: on the H200 it matches cuBLASLt at 8 and 16 rows on Qwen3-8B and
// beats it by ~3% on Qwen3-1.7B, and loses at 32 (docs/benchmarks.md, "A skinny tensor-core GEMM").
constexpr std::int64_t max_skinny_gemm_rows = 32;
constexpr std::int64_t default_skinny_gemm_rows = 16;
bool skinny_gemm_supported(DType dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* a,
                           const void* w, std::int64_t max_rows) noexcept;
void launch_skinny_gemm(cudaStream_t stream, DType out_dt, void* out, std::int64_t ldo, const void* a,
                        const void* w, const void* bias, float beta, std::int64_t m, std::int64_t n,
                        std::int64_t k, int sm_count);
// The same kernel as a pre-norm block's input side (Backend::rms_norm_gemm at 5..32 rows, bf16):
// out = RMSNorm(x) * norm_weight . W^T, the normalised rows rounded as launch_norm rounds them;
// with swiglu, W holds n rows (gate, then up) and out [m, n / 2] = silu(y_gate) * y_up as
// launch_swiglu rounds it. `scratch` holds skinny_norm_scratch_bytes(k) bytes on the device,
// zeroed before its first use and left zeroed by every launch (the row statistics, gemm_skinny.cu
// says how); launches on one stream may share it. Needs what skinny_gemm_supported needs, a
// 16-byte aligned norm weight and n / 32 >= k / 256 (rounded up). A null norm_weight (swiglu
// only) takes x as already normalised: the GEMM with the SwiGLU epilogue alone, no scratch. A
// null scratch with a norm weight: every block computes the row statistics itself (for
// comparisons, XSERV_CUDA_SKINNY_STATS=block).
bool skinny_norm_gemm_supported(DType dt, std::int64_t m, std::int64_t n, std::int64_t k, const void* x,
                                const void* norm_weight, const void* w, std::int64_t max_rows) noexcept;
std::size_t skinny_norm_scratch_bytes(std::int64_t k) noexcept;
// `next`: every warp asks its slice of that range into L2 after its last weight load (the
// SwiGLU GEMM asked for the down_proj's first MB, XSERV_CUDA_SKINNY_L2_NEXT_MB).
void launch_skinny_norm_gemm(cudaStream_t stream, void* out, const void* x, const void* norm_weight, float eps,
                             const void* w, bool swiglu, std::int64_t m, std::int64_t n, std::int64_t k,
                             int sm_count, void* scratch, L2Prefetch next = {});

// The same out_in GEMV with the ops around it in a pre-norm block fused in (one kernel instead of
// two or three at decode): out[m, :] = RMSNorm(x[m, :]) * norm_weight . W, rounded as
// launch_norm then launch_gemv would; with swiglu, W holds 2n rows (gate, then up) and
// out[m, j] = silu(y[m, j]) * y[m, n + j] as launch_swiglu rounds it. out is [m, n] in dt.
// Each block normalises the rows into shared memory, m * k elements: up to max_gemv_norm_smem
// bytes (one or two 4096-wide bf16 rows) that prologue is cheaper than a separate norm kernel;
// past it (larger batches) the separate kernels run. out_dt f32 with bf16 x (logits: the final
// norm and the lm_head of a decode step in one kernel) takes one row and no SwiGLU.
constexpr std::size_t max_gemv_norm_smem = 16 * 1024;
bool norm_gemv_supported(DType dt, std::int64_t m, std::int64_t n, std::int64_t k,
                         const void* x, const void* norm_weight, const void* w) noexcept;
void launch_norm_gemv(cudaStream_t stream, DType dt, void* out, const void* x,
                      const void* norm_weight, float eps, const void* w, bool swiglu,
                      std::int64_t m, std::int64_t n, std::int64_t k, int sm_count,
                      DType out_dt, const GemvChain& chain = {});

// The GEMV with GPT-2's LayerNorm before it and optionally GELU after it (one kernel instead of
// two or three at decode): out[m, :] = gelu?(LayerNorm(x[m, :]) * norm_weight + norm_bias . W +
// bias), everything in dt, rounded as launch_norm, launch_gemv and launch_gelu would. W [n, k]
// (out_in: the transposed Conv1D weights GPT-2 runs with by default; m * k values of dt in
// shared memory, 16-byte aligned x, norm weight and bias) or [k, n] (in_out: needs
// gemv_scratch_floats(dt, true, m, n, k) floats and gemv_tickets(dt, n) as launch_gemv; m * k
// f32 values of shared memory); the shared memory up to max_gemv_norm_smem bytes.
struct LayerNormGemvArgs {
  void* out;
  const void* x;
  const void* norm_weight;
  const void* norm_bias;  // may be null
  float eps;
  const void* w;
  const void* bias;  // may be null
  bool gelu;
  std::int64_t m, n, k;
  bool in_out = true;  // W's layout
};
bool layer_norm_gemv_supported(DType dt, const LayerNormGemvArgs& args) noexcept;
void launch_layer_norm_gemv(cudaStream_t stream, DType dt, const LayerNormGemvArgs& args,
                            int sm_count, float* partial, unsigned* tickets);

// mlp.cu: one decode row's whole SwiGLU MLP with its residual as one kernel (Backend::rms_norm_mlp):
//   x += swiglu(RMSNorm(x) * norm_w . W_gate_up^T) . W_down^T
// x [1, n] bf16 (read and written), W_gate_up [2 * inter, n], W_down [n, inter], the norm weight
// [n], all 16-byte aligned. Thread-block clusters split the intermediates (sm_90); needs
// mlp_fused_partial_floats() floats of scratch and 8 zeroed tickets (left zeroed). stages: 4 KB
// slots of each warp's ring of weight copies (2-4; XSERV_CUDA_FUSED_MLP_STAGES).
bool mlp_fused_supported(DType dt, std::int64_t rows, std::int64_t n, std::int64_t inter, const void* x,
                         const void* gate_up, const void* down, int sm_count) noexcept;
std::size_t mlp_fused_partial_floats(std::int64_t n, std::int64_t inter, int sm_count) noexcept;
constexpr int mlp_fused_tickets = 8;
void launch_mlp_fused(cudaStream_t stream, void* x, const void* norm_w, float eps, const void* gate_up,
                      const void* down, std::int64_t n, std::int64_t inter, float* partials, unsigned* tickets,
                      int sm_count, int stages = 3);

// rope_kv.cu
constexpr int max_head_dim = 256;
struct QkTransformParams {
  void* qkv = nullptr;  // [T, qkv_stride]
  std::int64_t qkv_stride = 0;
  const void* q_norm = nullptr;  // [head_dim] or null
  const void* k_norm = nullptr;
  float norm_eps = 1e-6f;
  bool rope = false;
  const std::int32_t* positions = nullptr;
  const std::int32_t* slot_mapping = nullptr;
  void* k_cache = nullptr;  // [slots, n_kv_heads, head_dim]
  void* v_cache = nullptr;
  std::int32_t rows = 0, n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  float inv_freq[max_head_dim / 2] = {};  // RoPE inverse frequencies, computed on the host in f32
};
// Launches of XSERV_CUDA_QK_ROWS rows or more (default 257: prompt chunks) take the many-rows
// kernel (head_dim 64 or 128), the others one head a warp; both write the same bits.
void launch_qk_transform_store(cudaStream_t stream, DType dt, const QkTransformParams& p);
// The same with the kernel chosen (tests); other head_dims than 64 and 128 take one head a warp.
void launch_qk_transform_store(cudaStream_t stream, DType dt, const QkTransformParams& p, bool rows_kernel);

// attention_decode.cu / attention_prefill.cu
struct AttentionParams {
  void* out = nullptr;        // [T, n_q_heads * head_dim]
  const void* qkv = nullptr;  // [T, qkv_stride], q heads first
  std::int64_t qkv_stride = 0;
  const void* k_cache = nullptr;  // [num_blocks, block_size, n_kv_heads, head_dim]
  const void* v_cache = nullptr;
  const std::int32_t* query_start = nullptr;   // [S + 1]
  const std::int32_t* context_lens = nullptr;  // [S]
  const std::int32_t* block_tables = nullptr;  // [S, max_blocks_per_seq]
  std::int32_t num_tokens = 0, num_seqs = 0, max_query_len = 0, max_context_len = 0;
  std::int32_t max_blocks_per_seq = 0, block_size = 0;
  std::int32_t n_q_heads = 0, n_kv_heads = 0, head_dim = 0;
  float scale = 1.0f;
  // Split-KV scratch of the row kernel: [T, n_q_heads, num_splits, head_dim] partial outputs and
  // [T, n_q_heads, num_splits, 2] (max, sum) pairs.
  float* partial_out = nullptr;
  float* partial_ml = nullptr;
  std::int32_t num_splits = 1, split_size = 0;
  // [T, n_kv_heads] counters, zero between launches: the bf16 mma decode kernel's blocks count
  // their finished splits here and the last one merges them (and resets its counter). Without
  // them, split launches take the tile kernel and a merge kernel instead.
  unsigned* tickets = nullptr;
  // Decode rows (query length 1) on the register kernel (attention_rows_store_kv): the block whose
  // split holds a row's own key first copies the row's k and v from qkv, as they are (no norm, no
  // RoPE: GPT-2), into the cache, in place of a qk_transform_store kernel before it.
  bool store_kv = false;
  // The register kernel loads its first keys before grid_dependency_wait when they were cached
  // before this step (XSERV_CUDA_ATTN_EARLY_KV=0: after it, as before 2026-12-02).
  bool early_kv = true;
};
// One query row per block (decode), keys split over num_splits blocks.
void launch_attention_rows(cudaStream_t stream, DType dt, const AttentionParams& p);
// Whether launch_attention_rows runs the register kernel for this dtype and head_dim (f32, and
// bf16 head dims other than 64 and 128), the one that honours AttentionParams::store_kv.
bool attention_rows_store_kv(DType dt, std::int32_t head_dim) noexcept;
// How launch_attention_rows splits each row's keys: num_splits blocks of split_size keys, for
// rows_x_kv_heads = rows * n_kv_heads and contexts up to context_bucket keys (the split depends
// on the bucket only, so a recorded graph stays valid while contexts grow within it).
struct AttentionSplit {
  std::int32_t num_splits, split_size;
};
AttentionSplit attention_rows_split(DType dt, std::int32_t head_dim, std::int32_t group,
                                    std::int64_t rows_x_kv_heads, std::int32_t context_bucket,
                                    int sm_count);
// The mma decode kernel's short-context rule: a decode launch whose (row, kv head) pairs fit one
// wave of one block an SM (16 rows of Qwen3's 8 kv heads on the H200's 132 SMs), over a context bucket
// of at most short_context_keys keys, takes one split per pair (no partials, no merge), 8 warps
// a block, and, through qk_attention, the q/k prologue folded into the attention
// (qk_attention_mma_supported). At a few hundred keys the merge's round trips cost more than the
// extra blocks gain and 8 warps walk a row in two chunks each; past that bucket the splits win
// (a 256-key split lost 8% after 1000 tokens; the folded prologue alone gained nothing there),
// and at 128 rows the folded prologue lost (serving). XSERV_CUDA_ATTN_SPLIT_KEYS,
// XSERV_CUDA_ATTN_FUSE_QK and XSERV_CUDA_ATTN_WARPS, when set, override it. Measured:
// docs/benchmarks.md, "Short-context decode attention".
constexpr std::int32_t short_context_keys = 256;
bool short_context_decode(std::int64_t rows_x_kv_heads, std::int32_t context_bucket, int sm_count) noexcept;
bool attention_rows_supported(std::int32_t head_dim, std::int32_t group) noexcept;
// Prefill attention in query-row tiles: tensor-core tiles of 64+ rows for bf16 (head_dim 64 or
// 128), CUDA-core tiles of 32 rows for f32 (head_dim 16, 32, 64 or 128; unless
// XSERV_CUDA_PREFILL_F32=0, read at every call: then f32 is not supported here and takes
// launch_attention_rows).
void launch_attention_prefill(cudaStream_t stream, DType dt, const AttentionParams& p);
bool attention_prefill_supported(DType dt, std::int32_t head_dim) noexcept;

// qk_transform_store and decode attention in one launch (launch_qk_attention_mma below): qk.rows,
// n_*_heads and head_dim must agree with attn.
struct QkAttentionParams {
  AttentionParams attn;
  QkTransformParams qk;
  // The HeadWarps form's prologue transforms all of a warp's heads at once (head_warp_transform);
  // false: one head after another (transform_head). Set by launch_qk_attention_mma.
  bool fold_at_once = true;
  // The next kernel's weight (the o_proj's), asked into L2 by the one-pass short-context kernel
  // (attention_decode_short_kernel) after its wait, while its own work leaves DRAM idle. Other
  // kernels ignore it. Set by CudaBackend::qk_attention from Backend::prefetch_next.
  L2Prefetch l2_next;
};
// attention_decode.cu: the bf16 mma decode kernel with the prologue folded in (each block
// transforms its q heads, the block of the row's own key writes k and v to the cache first), for
// steps where every sequence has one query row. The splits (attn.num_splits, split_size,
// partial_*, tickets) are set as for launch_attention_rows. Taken by default where
// short_context_decode holds (rows_x_kv_heads = rows * n_kv_heads, context_bucket as for the
// splits); XSERV_CUDA_ATTN_FUSE_QK=1 / 0 (read at every call) forces it on / off for every
// decode step, =heads adds the launches that take the one-kv-head-a-warp form (batched decode
// past one wave, head_warps_launch). XSERV_CUDA_ATTN_FOLD_AT_ONCE=0 (read at every call) makes that form
// transform its heads one after another, as before 2026-12-03 (for comparisons).
bool qk_attention_mma_supported(DType dt, std::int32_t head_dim, std::int32_t group,
                                std::int32_t max_query_len, std::int64_t rows_x_kv_heads,
                                std::int32_t context_bucket, int sm_count) noexcept;
void launch_qk_attention_mma(cudaStream_t stream, const QkAttentionParams& p);

// sampling.cu
struct SamplingRowParams {
  float temperature;
  std::int32_t top_k;
  float top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  float uniform;  // sampling_uniform(seed, step)
  std::int32_t use_penalties;
};
// counts [R, V]: low 31 bits count the token in the output, bit 31 marks it in prompt/output.
void launch_token_counts(cudaStream_t stream, std::uint32_t* counts, std::int64_t vocab,
                         std::int32_t rows, const std::int32_t* prompt_tokens,
                         const std::int32_t* prompt_start, const std::int32_t* output_tokens,
                         const std::int32_t* output_start);
// Any rows: each row split over many blocks, a radix select per filter (`passes` launches: 8 per
// filter of the row with most, the draw included). `select` holds sample_select_bytes(rows).
std::size_t sample_select_bytes(std::int32_t rows);
void launch_sample(cudaStream_t stream, float* logits, std::int32_t rows, std::int64_t vocab,
                   const SamplingRowParams* params, int passes, const std::uint32_t* counts,
                   void* select, std::int32_t* out_ids);
// The same sampling when every row is greedy or has 0 < top_k <= k_max <= sample_topk_max_k
// (sampling_topk.cu): the row split over many blocks, then a draw over the candidates.
// `candidates` holds rows * sample_topk_candidates(vocab, k_max, rows) u64 keys. With `tickets`
// (rows zeroed unsigned, left zeroed) and every row greedy (k_max = 1), one kernel: the last block
// of a row picks its id (XSERV_CUDA_SAMPLE_ONE_PASS); otherwise the candidates and the draw kernel.
inline constexpr int sample_topk_max_k = 1024;
inline constexpr int sample_topk_max_candidates = 4096;
int sample_topk_candidates(std::int64_t vocab, int k_max, std::int32_t rows);
// Blocks a row of a greedy batch (k_max = 1) of `rows` rows is split over: 256 up to
// greedy_wide_rows rows, 64 above, or XSERV_CUDA_SAMPLE_GREEDY_BLOCKS at any size (read once); at
// any count but 64 the whole last block reads the blocks' keys, at 64 its thread 0 alone
// (sampling_topk.cu says why).
inline constexpr std::int32_t greedy_wide_rows = 4;
int sample_greedy_blocks(std::int32_t rows) noexcept;
void launch_sample_topk(cudaStream_t stream, float* logits, std::int32_t rows, std::int64_t vocab,
                        const SamplingRowParams* params, const std::uint32_t* counts, int k_max,
                        void* candidates, unsigned* tickets, std::int32_t* out_ids);

// logprobs.cu: log_softmax of raw logits [R, V] at ids[r] (device) into out_chosen [R], and the
// top_n most likely tokens (value desc, id asc) into out_top_ids / out_top_lp [R, top_n].
void launch_logprobs(cudaStream_t stream, const float* logits, std::int32_t rows,
                     std::int64_t vocab, const std::int32_t* ids, std::int32_t top_n,
                     float* out_chosen, std::int32_t* out_top_ids, float* out_top_lp);

}  // namespace xserv::cuda
