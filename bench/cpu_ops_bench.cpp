// CPU backend GEMV/GEMM speed on GPT-2-124M shapes (d = 768; Conv1D weights as stored and
// transposed), f32, bf16 and f16 weights, and on Qwen3-0.6B shapes (bf16).
//
// Decode rows (M = 1, 4) are memory bound: read the GB/s counter against the machine's DRAM
// bandwidth. Prefill rows (M = 128, 512) are compute bound: read GFLOP/s. "own" runs xserv's
// kernels even for f32 (where the default is OpenBLAS when built in); XSERV_CPU_ISA picks the
// kernel table, XSERV_BENCH_THREADS the thread count (default: all cores).
//   build/<dir>/bench/cpu_ops_bench --benchmark_filter=gemm
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "tensor/buffer.hpp"

namespace {

using namespace xserv;

std::size_t bench_threads() {
  const char* t = std::getenv("XSERV_BENCH_THREADS");
  return t ? static_cast<std::size_t>(std::atoi(t)) : 0;
}

cpu::CpuBackend& backend(bool use_blas) {
  static cpu::CpuBackend with_blas(BackendOptions{bench_threads(), 0}, nullptr, true);
  static cpu::CpuBackend own(BackendOptions{bench_threads(), 0}, nullptr, false);
  return use_blas ? with_blas : own;
}

struct Shape3 {
  const char* name;
  std::int64_t k, n;
  WeightLayout layout;
};
// GPT-2 124M: attention qkv, attention out, MLP up, MLP down (Conv1D, in_out) and the tied
// lm_head (wte [vocab, d], out_in).
constexpr Shape3 kShapes[] = {{"qkv", 768, 2304, WeightLayout::in_out},
                              {"attn_out", 768, 768, WeightLayout::in_out},
                              {"mlp_up", 768, 3072, WeightLayout::in_out},
                              {"mlp_down", 3072, 768, WeightLayout::in_out},
                              {"lm_head", 768, 50257, WeightLayout::out_in},
                              // The same Conv1D weights as the CPU backend holds them (transposed
                              // at load, Model::transpose_in_out).
                              {"qkv_t", 768, 2304, WeightLayout::out_in},
                              {"attn_out_t", 768, 768, WeightLayout::out_in},
                              {"mlp_up_t", 768, 3072, WeightLayout::out_in},
                              {"mlp_down_t", 3072, 768, WeightLayout::out_in},
                              // Qwen3-0.6B (Linear, out_in): packed q/k/v, gate+up, down, tied lm_head.
                              {"q3_qkv", 1024, 4096, WeightLayout::out_in},
                              {"q3_gate_up", 1024, 6144, WeightLayout::out_in},
                              {"q3_down", 3072, 1024, WeightLayout::out_in},
                              {"q3_lm_head", 1024, 151936, WeightLayout::out_in},
                              // GPT-2's Conv1D weights in 32-column panels (XSERV_CPU_CONV1D=panels).
                              {"qkv_p", 768, 2304, WeightLayout::panel32},
                              {"attn_out_p", 768, 768, WeightLayout::panel32},
                              {"mlp_up_p", 768, 3072, WeightLayout::panel32},
                              {"mlp_down_p", 3072, 768, WeightLayout::panel32}};
constexpr int kGpt2Shapes = 9, kQwen3End = 13, kShapeCount = 17;

// args: shape index, M, dtype (0 f32, 1 bf16, 2 f16), use BLAS (f32 only)
void BM_gemm(benchmark::State& state) {
  const Shape3& s = kShapes[state.range(0)];
  const std::int64_t m = state.range(1);
  const DType wt = state.range(2) == 1 ? DType::bf16 : state.range(2) == 2 ? DType::f16 : DType::f32;
  const bool blas = state.range(3) != 0;
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  // 64-byte aligned, as the backend's buffers are (a vector's 16 bytes split every 512-bit load
  // of an unpacked kernel across two cache lines).
  Buffer a_buf(cpu_allocator(), static_cast<std::size_t>(m * s.k) * 4);
  Buffer out_buf(cpu_allocator(), static_cast<std::size_t>(m * s.n) * 4);
  Buffer w_buf(cpu_allocator(), static_cast<std::size_t>(s.k * s.n) * 4);
  const std::span<float> a(static_cast<float*>(a_buf.data()), static_cast<std::size_t>(m * s.k));
  const std::span<float> out(static_cast<float*>(out_buf.data()),
                             static_cast<std::size_t>(m * s.n));
  const std::span<float> wf(static_cast<float*>(w_buf.data()), static_cast<std::size_t>(s.k * s.n));
  for (auto& x : a) x = dist(rng);
  for (auto& x : wf) x = dist(rng);
  Buffer wh_buf(cpu_allocator(), wt != DType::f32 ? wf.size() * 2 : 0);
  void* wp = wf.data();
  if (wt != DType::f32) {
    convert_from_f32(wf.data(), wh_buf.data(), wt, wf.size());
    wp = wh_buf.data();
  }
  const Shape ws = s.layout == WeightLayout::out_in ? Shape{s.n, s.k} : Shape{s.k, s.n};
  auto& be = backend(blas);
  for (auto _ : state) {
    be.gemm(Tensor(out.data(), DType::f32, {m, s.n}), Tensor(a.data(), DType::f32, {m, s.k}),
            Tensor(wp, wt, ws), s.layout, Tensor{});
    benchmark::DoNotOptimize(out.data());
  }
  state.SetLabel(std::string(s.name) + " " + std::string(dtype_name(wt)) +
                 (blas && wt == DType::f32 && m > cpu::gemv_max_rows &&
                          be.name().find("OpenBLAS") != std::string::npos
                      ? " OpenBLAS"
                      : " own") +
                 " [" + be.kernel_table().isa + "]");
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(s.k * s.n);
  const double wbytes = static_cast<double>(s.k * s.n) * static_cast<double>(dtype_size(wt));
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["weight_GB/s"] =
      benchmark::Counter(wbytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void gemm_args(benchmark::internal::Benchmark* b) {
  for (int shape = 0; shape < kGpt2Shapes; ++shape)
    for (int m : {1, 4, 128, 512}) {
      if (shape == 4 && m > 128) continue;  // lm_head runs on logit rows only
      b->Args({shape, m, 0, 1});
      if (m > cpu::gemv_max_rows) b->Args({shape, m, 0, 0});
      b->Args({shape, m, 1, 0});
      if (m == 1) b->Args({shape, m, 2, 0});  // f16 (the embedded model's weights)
    }
  for (int shape = kGpt2Shapes; shape < kQwen3End; ++shape)  // Qwen3: bf16
    for (int m : {1, 128})
      if (shape != kQwen3End - 1 || m == 1) b->Args({shape, m, 1, 0});
  for (int shape = kQwen3End; shape < kShapeCount; ++shape)  // panels: f32, xserv's kernels
    for (int m : {1, 4, 128, 512}) b->Args({shape, m, 0, 0});
}
BENCHMARK(BM_gemm)->Apply(gemm_args)->Unit(benchmark::kMicrosecond)->UseRealTime();

// Decode attention: one row per sequence over a context of `ctx` tokens; heads of GPT-2 (12 x 64),
// Qwen3-0.6B / 1.7B (16 q and 8 kv heads of 128: GQA groups of 2) or Qwen3-8B (32 q, 8 kv:
// groups of 4), with the cache in f32 or (kv_bf16 = 1) bf16 (XSERV_CPU_KV=bf16's cache), for
// `layers` layers' caches in turn, as a decode step reads them: one layer's cache (a few MB)
// stays in the last-level cache from one iteration to the next, 28 do not (Qwen3-0.6B's 28 at
// 2048 tokens are 235 MB in bf16), so the per-layer figure of 28 is the one a step sees.
// Args: seqs, ctx, heads (0, 1, 2 as listed), kv_bf16, layers.
void BM_attention_decode(benchmark::State& state) {
  const std::int32_t seqs = static_cast<std::int32_t>(state.range(0));
  const std::int32_t ctx = static_cast<std::int32_t>(state.range(1));
  const std::int64_t kind = state.range(2);
  const bool bf16 = state.range(3) != 0;
  const auto layers = static_cast<std::size_t>(state.range(4));
  const HeadGeometry heads = kind == 2   ? HeadGeometry{32, 8, 128}
                             : kind == 1 ? HeadGeometry{16, 8, 128}
                                         : HeadGeometry{12, 12, 64};
  const std::int64_t kv_row = std::int64_t{heads.n_kv_heads} * heads.head_dim;
  const std::int64_t q_width = std::int64_t{heads.n_q_heads} * heads.head_dim;
  const std::int32_t bs = 16, per_seq = (ctx + bs - 1) / bs, blocks = seqs * per_seq;
  const std::size_t elems = static_cast<std::size_t>(blocks) * bs * kv_row;
  // Each layer's K and V (f32 or bf16 bits) in one buffer of 4-byte words.
  const std::size_t words = bf16 ? (elems + 1) / 2 : elems;
  std::vector<std::vector<float>> kc(layers), vc(layers);
  for (std::size_t l = 0; l < layers; ++l) {
    kc[l].assign(words, 0.01f);  // as bf16 pairs: small normal values as well
    vc[l].assign(words, 0.02f);
  }
  ForwardBatch b;
  for (std::int32_t s = 0; s < seqs; ++s) {
    b.token_ids.push_back(0);
    b.positions.push_back(ctx - 1);
    b.slot_mapping.push_back((s * per_seq + per_seq - 1) * bs);
    b.query_start.push_back(s);
    b.context_lens.push_back(ctx);
    for (std::int32_t j = 0; j < per_seq; ++j) b.block_tables.push_back(s * per_seq + j);
  }
  b.query_start.push_back(seqs);
  b.max_blocks_per_seq = per_seq;
  std::vector<float> qkv(static_cast<std::size_t>(seqs * heads.qkv_width()), 0.1f);
  std::vector<float> out(static_cast<std::size_t>(seqs * q_width));
  auto& be = backend(true);
  const DeviceBatch db = be.upload_batch(b);
  const Shape cs{blocks, bs, heads.n_kv_heads, heads.head_dim};
  const DType dt = bf16 ? DType::bf16 : DType::f32;
  for (auto _ : state) {
    for (std::size_t l = 0; l < layers; ++l)
      be.attention(Tensor(out.data(), DType::f32, {seqs, q_width}),
                   Tensor(qkv.data(), DType::f32, {seqs, heads.qkv_width()}), heads, db,
                   KvLayer{Tensor(kc[l].data(), dt, cs), Tensor(vc[l].data(), dt, cs)},
                   1.0f / std::sqrt(static_cast<float>(heads.head_dim)));
    benchmark::DoNotOptimize(out.data());
  }
  const double kv_bytes = 2.0 * static_cast<double>(layers) * seqs * ctx * static_cast<double>(kv_row) * (bf16 ? 2 : 4);
  state.counters["kv_GB/s"] =
      benchmark::Counter(kv_bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["us_per_layer"] = benchmark::Counter(
      static_cast<double>(layers), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}
BENCHMARK(BM_attention_decode)
    ->Args({1, 1024, 0, 0, 1})->Args({8, 512, 0, 0, 1})
    ->Args({1, 2048, 1, 0, 1})->Args({1, 2048, 1, 1, 1})->Args({1, 2048, 2, 1, 1})
    ->Args({1, 2048, 1, 0, 28})->Args({1, 2048, 1, 1, 28})->Args({1, 2048, 2, 1, 28})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

// Prefill attention: one sequence of `rows` new tokens attending causally to themselves (the
// cache holds their K/V), GPT-2 heads (12 x 64, heads 0) or Qwen3-0.6B's (16 q / 8 kv x 128,
// heads 1), the cache f32 or (kv_bf16 = 1) bf16; GFLOP/s counts QK and PV of every (row, key).
// Args: rows, heads, kv_bf16.
void BM_attention_prefill(benchmark::State& state) {
  const std::int32_t rows = static_cast<std::int32_t>(state.range(0));
  const HeadGeometry heads = state.range(1) == 1 ? HeadGeometry{16, 8, 128} : HeadGeometry{12, 12, 64};
  const bool bf16 = state.range(2) != 0;
  const std::int64_t kv_row = std::int64_t{heads.n_kv_heads} * heads.head_dim;
  const std::int64_t q_width = std::int64_t{heads.n_q_heads} * heads.head_dim;
  const std::int32_t bs = 16, blocks = (rows + bs - 1) / bs;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  const std::size_t elems = static_cast<std::size_t>(blocks) * bs * static_cast<std::size_t>(kv_row);
  std::vector<float> kc(elems), vc(elems);
  std::vector<std::uint16_t> kh(elems), vh(elems);
  for (std::size_t i = 0; i < elems; ++i) {
    kc[i] = dist(rng);
    vc[i] = dist(rng);
    kh[i] = f32_to_bf16(kc[i]);
    vh[i] = f32_to_bf16(vc[i]);
  }
  ForwardBatch b;
  for (std::int32_t t = 0; t < rows; ++t) {
    b.token_ids.push_back(0);
    b.positions.push_back(t);
    b.slot_mapping.push_back(t);
  }
  b.query_start = {0, rows};
  b.context_lens.push_back(rows);
  for (std::int32_t j = 0; j < blocks; ++j) b.block_tables.push_back(j);
  b.max_blocks_per_seq = blocks;
  std::vector<float> qkv(static_cast<std::size_t>(rows * heads.qkv_width()));
  for (auto& x : qkv) x = dist(rng);
  std::vector<float> out(static_cast<std::size_t>(rows * q_width));
  auto& be = backend(true);
  const DeviceBatch db = be.upload_batch(b);
  const Shape cs{blocks, bs, heads.n_kv_heads, heads.head_dim};
  const KvLayer cache = bf16 ? KvLayer{Tensor(kh.data(), DType::bf16, cs), Tensor(vh.data(), DType::bf16, cs)}
                             : KvLayer{Tensor(kc.data(), DType::f32, cs), Tensor(vc.data(), DType::f32, cs)};
  const float scale = 1.0f / std::sqrt(static_cast<float>(heads.head_dim));
  for (auto _ : state) {
    be.attention(Tensor(out.data(), DType::f32, {rows, q_width}),
                 Tensor(qkv.data(), DType::f32, {rows, heads.qkv_width()}), heads, db, cache, scale);
    benchmark::DoNotOptimize(out.data());
  }
  const double pairs = 0.5 * rows * (rows + 1.0);
  state.counters["GFLOP/s"] = benchmark::Counter(pairs * static_cast<double>(q_width) * 4 * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_attention_prefill)
    ->Args({128, 0, 0})->Args({512, 0, 0})->Args({2048, 1, 0})->Args({2048, 1, 1})->Args({128, 1, 0})
    ->Unit(benchmark::kMicrosecond)->UseRealTime();

// LayerNorm of a prefill's rows (GPT-2: 128 x 768), as the layers run it (no residual).
void BM_layer_norm(benchmark::State& state) {
  const std::int64_t rows = state.range(0), d = state.range(1);
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(static_cast<std::size_t>(rows * d)), out(x.size()), w(static_cast<std::size_t>(d), 1.0f),
      b(static_cast<std::size_t>(d), 0.0f);
  for (auto& v : x) v = dist(rng);
  auto& be = backend(false);
  for (auto _ : state) {
    be.layer_norm(Tensor(out.data(), DType::f32, {rows, d}), Tensor(x.data(), DType::f32, {rows, d}),
                  Tensor{}, Tensor(w.data(), DType::f32, {d}), Tensor(b.data(), DType::f32, {d}), 1e-5f);
    benchmark::DoNotOptimize(out.data());
  }
  state.counters["rows/s"] = benchmark::Counter(static_cast<double>(rows), benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_layer_norm)->Args({128, 768})->Args({1, 768})->Unit(benchmark::kMicrosecond)->UseRealTime();

#if defined(__x86_64__) && defined(__GNUC__)
// One core's f32 FMA peak with AVX-512 (the ceiling the GEMM rows' GFLOP/s compare with): 16
// independent accumulator chains of 512-bit FMAs, enough to cover 2 FMA units x 4-cycle latency.
// Run it pinned to one core; with XSERV_BENCH_THREADS unset it is still one thread.
// 16 chains of vfmadd231ps on zmm0-15 (zmm16/17 the constant operands), in asm so no compiler
// keeps them in memory.
__attribute__((target("avx512f"), noinline)) void fma_chains(std::int64_t iters) {
  __asm__ volatile(
      "vxorps %%xmm16, %%xmm16, %%xmm16\n\t"
      "vxorps %%xmm17, %%xmm17, %%xmm17\n\t"
      "1:\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm0\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm1\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm2\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm3\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm4\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm5\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm6\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm7\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm8\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm9\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm10\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm11\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm12\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm13\n\t"
      "vfmadd231ps %%zmm16, %%zmm17, %%zmm14\n\t vfmadd231ps %%zmm16, %%zmm17, %%zmm15\n\t"
      "dec %0\n\t"
      "jnz 1b\n\t"
      "vzeroupper"
      : "+r"(iters)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "xmm14", "xmm15", "xmm16", "xmm17", "cc");
}
// Runs chains(iters): `chains_n` accumulator chains of `lanes`-float FMAs, where the CPU has them.
void fma_peak(benchmark::State& state, bool supported, void (*chains)(std::int64_t), int chains_n, int lanes) {
  if (!supported) {
    state.SkipWithError("this CPU lacks the instructions");
    return;
  }
  constexpr std::int64_t iters = 1 << 20;
  for (auto _ : state) chains(iters);
  state.counters["GFLOP/s"] = benchmark::Counter(static_cast<double>(iters) * chains_n * lanes * 2 * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
}
void BM_fma_peak(benchmark::State& state) {
  fma_peak(state, __builtin_cpu_supports("avx512f"), fma_chains, 16, 16);
}
BENCHMARK(BM_fma_peak)->Unit(benchmark::kMicrosecond)->UseRealTime();

// The same with AVX2's 256-bit FMAs (CPUs without AVX-512): 12 chains on ymm0-11, enough for
// 2 FMA units x 5-cycle latency (Zen 2/3).
__attribute__((target("avx2,fma"), noinline)) void fma_chains_avx2(std::int64_t iters) {
  __asm__ volatile(
      "vxorps %%xmm12, %%xmm12, %%xmm12\n\t"
      "vxorps %%xmm13, %%xmm13, %%xmm13\n\t"
      "1:\n\t"
      "vfmadd231ps %%ymm12, %%ymm13, %%ymm0\n\t vfmadd231ps %%ymm12, %%ymm13, %%ymm1\n\t"
      "vfmadd231ps %%ymm12, %%ymm13, %%ymm2\n\t vfmadd231ps %%ymm12, %%ymm13, %%ymm3\n\t"
      "vfmadd231ps %%ymm12, %%ymm13, %%ymm4\n\t vfmadd231ps %%ymm12, %%ymm13, %%ymm5\n\t"
      "vfmadd231ps %%ymm12, %%ymm13, %%ymm6\n\t vfmadd231ps %%ymm12, %%ymm13, %%ymm7\n\t"
      "vfmadd231ps %%ymm12, %%ymm13, %%ymm8\n\t vfmadd231ps %%ymm12, %%ymm13, %%ymm9\n\t"
      "vfmadd231ps %%ymm12, %%ymm13, %%ymm10\n\t vfmadd231ps %%ymm12, %%ymm13, %%ymm11\n\t"
      "dec %0\n\t"
      "jnz 1b\n\t"
      "vzeroupper"
      : "+r"(iters)
      :
      : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10",
        "xmm11", "xmm12", "xmm13", "cc");
}
void BM_fma_peak_avx2(benchmark::State& state) {
  fma_peak(state, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"), fma_chains_avx2, 12, 8);
}
BENCHMARK(BM_fma_peak_avx2)->Unit(benchmark::kMicrosecond)->UseRealTime();
#endif

}  // namespace

BENCHMARK_MAIN();
