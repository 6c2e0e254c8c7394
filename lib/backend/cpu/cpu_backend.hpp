// CpuBackend: the reference implementation of Backend, and the path for machines without a GPU.
//
// Activations and the KV cache are f32; weights stay in their file dtype (f32, bf16, f16) and are
// converted tile by tile inside the kernels, accumulating in f32. Ops run synchronously on the
// calling thread plus a ThreadPool (BackendOptions::threads, 0 = all hardware threads); the hot
// loops are picked per instruction set at run time (cpu_kernels.hpp). f32 GEMMs with more rows
// than a GEMV go to OpenBLAS when xserv is built with it (XSERV_HAVE_BLAS).
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <vector>

#include "backend/backend.hpp"
#include "backend/cpu/cpu_kernels.hpp"
#include "core/thread_pool.hpp"

namespace xserv::cpu {

class CpuBackend final : public Backend {
 public:
  // `kernels` overrides the instruction-set choice (tests run every table); null = the best.
  // use_blas = false keeps f32 GEMMs on xserv's own kernel even where OpenBLAS is built in
  // (with the AVX-512 kernels xserv's own GEMM is used anyway: it is faster).
  explicit CpuBackend(const BackendOptions& options = {}, const KernelTable* kernels = nullptr,
                      bool use_blas = true);

  Device device() const noexcept override { return Device{DeviceKind::cpu, 0}; }
  std::string name() const override;
  DType activation_dtype(DType) const noexcept override { return DType::f32; }
  // f32, or with XSERV_CPU_KV=bf16 (read when the backend is made) bf16 for bf16 weights: K and V
  // rounded to bf16 as the model's own bf16 cache holds them, half the cache's memory and half the
  // bytes a decode step's attention reads (the step's largest item at long contexts). f16 models
  // keep f32: their own cache is f16, a rounding bf16 would not reproduce.
  DType kv_dtype(DType weights) const noexcept override {
    return kv_bf16_ && weights == DType::bf16 ? DType::bf16 : DType::f32;
  }
  // Asked for explicitly (xserv_model_params.kv_cache_dtype), f32 or bf16 for any weights.
  bool supports_kv_dtype(DType, DType kv) const noexcept override {
    return kv == DType::f32 || kv == DType::bf16;
  }

  Allocator& allocator() noexcept override;
  Tensor import_weight(const Tensor& host) override;
  void upload(Tensor dst, const void* host_src) override;
  void download(void* host_dst, const Tensor& src) override;
  void fill_zero(Tensor dst) override;
  void copy(Tensor dst, const Tensor& src) override;
  void transpose(Tensor dst, const Tensor& src) override;
  MemoryInfo memory_info() const override;
  DeviceBatch upload_batch(const ForwardBatch& batch) override;
  void synchronize() override {}

  void embedding(Tensor out, const Tensor& ids, const Tensor& table, const Tensor& pos_table,
                 const Tensor& positions) override;
  void layer_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                  const Tensor& bias, float eps) override;
  void rms_norm(Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
                float eps) override;
  void gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout, const Tensor& bias,
            float beta = 0.0f, std::int64_t out_row_stride = 0) override;
  void gemm_parts(Tensor out, const Tensor& a, std::span<const Tensor> ws,
                  std::span<const Tensor> biases) override;
  void qk_transform_store(Tensor qkv, const HeadGeometry& heads, const QkTransform& t,
                          const DeviceBatch& batch, KvLayer cache) override;
  void attention(Tensor out, const Tensor& qkv, const HeadGeometry& heads,
                 const DeviceBatch& batch, const KvLayer& cache, float scale) override;
  void gelu(Tensor x) override;
  // LayerNorm, then the GEMM with the GELU fused into its epilogue (applied to each output tile
  // while it is in cache, without a parallel loop of its own).
  void layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                       const Tensor& norm_bias, float eps, const Tensor& w, WeightLayout layout,
                       const Tensor& bias, bool gelu, Tensor h_scratch) override;
  void swiglu(Tensor out, const Tensor& gate_up) override;
  void gather_rows(Tensor out, const Tensor& x, const Tensor& rows) override;
  void sample(Tensor logits, const SamplingBatch& params, std::int32_t* out_ids) override;
  void logprobs(const Tensor& logits, const std::int32_t* ids, std::int32_t top_n,
                float* out_logprobs, std::int32_t* out_top_ids, float* out_top_logprobs) override;
  // Synchronous underneath (every op is): sample_async samples at once, keeps the ids for its
  // ticket and writes them to ids_out; the engine's overlapped steps run on the CPU this way, so
  // CPU-only tests cover their bookkeeping (placeholders, discarded tokens).
  std::uint64_t sample_async(Tensor logits, const SamplingBatch& params, Tensor ids_out) override;
  void wait_sampled(std::uint64_t ticket, std::int32_t* out_ids) override;
  void resolve_tokens(Tensor tokens, const Tensor& sampled) override;
  bool samples_async() const noexcept override { return true; }

  std::size_t threads() const noexcept { return pool_.size(); }
  // How long its idle threads poll now (set by upload_batch and at the end of sample).
  std::uint32_t spin_us() const noexcept { return pool_.spin_us(); }
  const KernelTable& kernel_table() const noexcept { return *kernels_; }

 private:
  void gemm_impl(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                 const Tensor& bias, float beta, std::int64_t out_row_stride, bool gelu);
  void run_amx(std::span<const GemmProblem> ps);
  void norm(const char* op, Tensor out, const Tensor& x, Tensor residual, const Tensor& weight,
            const Tensor& bias, float eps, bool rms);

  ThreadPool pool_;
  const KernelTable* kernels_;
  bool use_blas_;
  // Prefill GEMMs of bf16 out_in weights on AMX tiles (cpu_amx.hpp), A rounded to bf16 into
  // amx_a_ first: 0 off, 1 the tiles (the default where amx_bf16_usable(); XSERV_CPU_AMX=0 turns
  // it off), 2 emulated (XSERV_CPU_AMX=emulate: tests).
  int amx_;
  std::vector<std::uint16_t> amx_a_;
  bool kv_bf16_;  // XSERV_CPU_KV=bf16: kv_dtype
  // qk_transform_store's RoPE tables: inv_freq for (rope_theta_, rope_d_), and the cos | sin of
  // position rope_pos_ (the last one-row call's; -1: none).
  float rope_theta_ = 0.0f;
  std::int64_t rope_d_ = 0;
  std::int32_t rope_pos_ = -1;
  std::vector<float> rope_inv_freq_, rope_cs_;
  // How long idle threads poll: while a forward runs (set by upload_batch), decode_spin_us_
  // (XSERV_CPU_SPIN_US, 200) for batches of up to gemv_max_rows tokens, prefill_spin_us_
  // (XSERV_CPU_PREFILL_SPIN_US, else the larger of 200 and decode's) for larger ones; from the
  // end of sample() to the next forward, idle_spin_us_ (XSERV_CPU_IDLE_SPIN_US, 20).
  std::uint32_t decode_spin_us_, prefill_spin_us_, idle_spin_us_;
  // upload_batch's storage: the DeviceBatch views point here until the next upload_batch.
  std::vector<std::int32_t> batch_storage_;
  // sample_async's ids by ticket until wait_sampled takes them (engines sharing the backend
  // may wait from their own threads: under the mutex).
  std::mutex async_mutex_;
  std::map<std::uint64_t, std::vector<std::int32_t>> async_ids_;
  std::uint64_t next_ticket_ = 1;
};

// The least work (bytes of weights or K/V read) worth handing to another thread in a decode-sized
// op: below it the op, or that much of it, runs on the calling thread. 128 KB: on the 2-core dev
// EPYC a hand-off costs 1-30 us (a sleeping or descheduled worker, a busy machine), about what
// 128 KB from L2 take; with it the embedded model's layers run inline and its decode step has one
// parallel loop (the lm_head) instead of ~25 (docs/cpu.md). XSERV_CPU_PARALLEL_KB overrides it.
std::int64_t min_parallel_bytes();

// How a prefill GEMM (M > gemv_max_rows) is cut into tasks for `threads` threads: column tiles
// of tile_n times row_blocks row ranges (cpu_gemm.cpp says how it is chosen).
struct GemmSplit {
  std::int64_t tile_n = 128, row_blocks = 1;
};
// packs: whether each task packs its weight tile (not for panel32 weights, used in place).
GemmSplit split_gemm(std::int64_t m, std::int64_t n, std::int64_t threads, bool packs = true);

// The allocator CpuBackend::allocator returns with XSERV_CPU_HUGEPAGES=1 (opt-in): from 2 MB up
// an allocation is its own anonymous mapping on a 2 MB boundary, advised MADV_HUGEPAGE; smaller
// ones come from cpu_allocator (cpu_backend.cpp). Named here so tests cover it whatever the switch.
Allocator& hugepage_allocator() noexcept;

// Output columns per piece of work of a decode GEMV over out_in weights of row_bytes per column:
// 16, or with max_group_bytes > 0 (XSERV_CPU_GEMV_GROUP_KB) the largest multiple of 4 whose
// weights fit in it, at least 4 (cpu_gemm.cpp). in_out weights always take 16.
std::int64_t gemv_group_cols(std::int64_t row_bytes, std::int64_t max_group_bytes);

// How a decode GEMV prefetches its weights (GemmProblem::gemv_prefetch_l1 / _l2).
struct GemvPrefetch {
  bool l1 = true;
  std::int64_t l2_bytes = 0;
  bool operator==(const GemvPrefetch&) const = default;
};
// An XSERV_CPU_GEMV_PREFETCH value: "l1" (L1 only), "off", "l2[:KB]" (L2 only, KB ahead, default
// 32) or "both[:KB]"; `fallback` for null or anything else. The backend reads the variable once,
// with the CPU vendor's default as the fallback (cpu_gemm.cpp).
GemvPrefetch parse_gemv_prefetch(const char* value, GemvPrefetch fallback);

// The log-probability of `id` under log_softmax(logits) and the top_n most likely tokens
// (log-probability desc, id asc) into top_ids / top_logprobs: the reference of Backend::logprobs.
float logprobs_row(std::span<const float> logits, std::int32_t id, std::int32_t top_n,
                   std::int32_t* top_ids, float* top_logprobs);

// One row of sampling (logits modified in place): penalties, temperature, top-k, top-p, min-p,
// then the inverse-CDF draw with sampling_uniform(row.seed, row.step) over the kept tokens in
// descending probability order (ties: lower id first). Throws on a history id outside the vocab.
// Greedy rows take kernels.argmax (the first maximum).
std::int32_t sample_row(std::span<float> logits, const SamplingRow& row,
                        std::span<const std::int32_t> prompt_tokens,
                        std::span<const std::int32_t> output_tokens,
                        const KernelTable& kernels = cpu::kernels());

}  // namespace xserv::cpu
