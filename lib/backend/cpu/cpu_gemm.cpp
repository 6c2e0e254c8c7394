// CpuBackend::gemm: out[M, N] = a[M, K] · W + bias + beta * out, W in_out [K, N] or out_in
// [N, K] in f32/bf16/f16, accumulated in f32.
//
// Work split: a GEMV (M <= gemv_max_rows, decode) is memory bound, so N is cut into contiguous
// column ranges and every weight byte is read once; gemm_parts runs the GEMVs of several weights
// (q/k/v, gate/up) as one such loop. A GEMM (prefill) is cut into column tiles of up to 128, and
// into row blocks too when the tiles do not share out over the threads (split_gemm); each task
// packs its own weight tile. bf16 out_in weights go to AMX tiles where the CPU has them (run_amx,
// cpu_amx.hpp). f32 weights with M > gemv_max_rows go to
// OpenBLAS when it is there: its sgemm beats the portable kernel on f32 (bench/cpu_ops_bench).
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "backend/cpu/cpu_amx.hpp"
#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/tensor_checks.hpp"

#ifdef XSERV_HAVE_BLAS
#include <cblas.h>
#endif

namespace xserv::cpu {
namespace {

// The most weights gemm_parts runs as one loop (q/k/v: 3); more go one gemm each.
constexpr std::size_t max_gemv_parts = 8;

// 64-byte aligned: the micro-kernel loads each packed panel row as whole 512-bit registers, and
// malloc's 16-byte alignment (a 128 KB block comes from mmap, 16 bytes past a page) made every
// one of those loads straddle two cache lines.
float* gemm_scratch() {
  thread_local std::vector<float> scratch(static_cast<std::size_t>(gemm_scratch_floats + 16));
  const auto at = reinterpret_cast<std::uintptr_t>(scratch.data());
  return reinterpret_cast<float*>((at + 63) & ~std::uintptr_t{63});
}

// The calling thread's scratch for amx_gemm_columns (64-byte aligned, grown as K needs).
void* amx_scratch(std::int64_t k) {
  thread_local std::vector<float> scratch;
  const auto floats = static_cast<std::size_t>(amx_scratch_bytes(k) / 4 + 16);
  if (scratch.size() < floats) scratch.resize(floats);
  const auto at = reinterpret_cast<std::uintptr_t>(scratch.data());
  return reinterpret_cast<void*>((at + 63) & ~std::uintptr_t{63});
}

// XSERV_CPU_GEMM_PREFETCH: where the prefill GEMM prefetches the next weight tile while it
// multiplies the current one (GemmProblem::pack_prefetch): l2 (the default) into L2 only
// (prefetcht1), l1 into L1 and L2 (the rule before 2026-12-02), off nowhere. Measured on the
// GPU machine's Xeon (docs/benchmarks.md, issue 16, 2026-12-02; 8 threads, 3 interleaved runs,
// medians): GPT-2 f32 prefill 2328 tok/s with l1, 2721 with l2, 2490 with off; Qwen3-0.6B bf16
// 548 / 547. A whole f32 tile (up to 128 KB) pulled through the 48 KB L1 evicted the panel and
// the A rows being multiplied; with L3-resident weights (cpu_ops_bench) the three are alike.
int gemm_prefetch() {
  static const int level = [] {
    const char* v = std::getenv("XSERV_CPU_GEMM_PREFETCH");
    const std::string_view s(v ? v : "");
    return s == "l1" ? 2 : s == "off" ? 0 : 1;
  }();
  return level;
}

// XSERV_CPU_GEMV_PREFETCH=l1 (the next rows into L1 only, as before the L2 prefetch existed),
// off (none), l2:KB (KB ahead into L2 only) or both:KB (both); KB defaults to 32. Read once.
// Default per vendor, from what was measured (docs/cpu.md, docs/benchmarks.md, issue 16):
// - AMD, l2:32. The dev EPYC (Zen 4), DRAM-sized weights (cpu_ops_bench M = 1, the 77-311 MB
//   lm_heads, medians of 3): one thread 8.3-10.6 GB/s with the L1 prefetch alone, 17.5-19.3
//   with l2:32, 13.4-18.5 with both; two threads 15.6-19.8 -> 22-28. Qwen3-0.6B decode at 2
//   threads 14.1 -> 21.2 tok/s (both:32: 19.7); GPT-2 f32 42.8 -> 48.7.
// - Intel, both:32. The GPU machine's Xeon at 8 threads (medians of 3 interleaved runs):
//   Qwen3-0.6B decode 46.5 tok/s with l1, 49.0 with l2:32, 53.9 with both:32 (main: 46.7);
//   GPT-2 f32 125.1 / 131.5 / 129.9 (main: 120.6); the 8 cores' streaming-read ceiling
//   69.0 GB/s with an L1 prefetch, 80.1 with l2:32, 80.4 with both.
// - Other CPUs: not measured, so the L1 prefetch alone, as before.
GemvPrefetch gemv_prefetch() {
  static const GemvPrefetch chosen = [] {
    GemvPrefetch d{true, 0};
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    if (__builtin_cpu_is("intel")) d = {true, 32 * 1024};
    if (__builtin_cpu_is("amd")) d = {false, 32 * 1024};
#endif
    return parse_gemv_prefetch(std::getenv("XSERV_CPU_GEMV_PREFETCH"), d);
  }();
  return chosen;
}

// Measurement: XSERV_CPU_GEMM_FIRST=l2 (GemmProblem::first_tile_prefetch). GPT-2 f32 prefill at
// 8 threads on the Xeon, 3 interleaved runs against the default in each of two calls
// (docs/benchmarks.md, issue 16, 2026-12-02): median +3% in one (3242 vs 3144 tok/s), -7% in the
// other (2826 vs 3045): no reliable gain, so off.
bool gemm_first_tile_prefetch() {
  static const bool on = [] {
    const char* v = std::getenv("XSERV_CPU_GEMM_FIRST");
    return v && std::string_view(v) == "l2";
  }();
  return on;
}

// Measurement only: XSERV_CPU_GEMM_KC=N packs weight tiles N deep (at most the kernels' 256)
// instead of 256, a smaller L1 footprint per thread (docs/cpu.md).
std::int64_t gemm_kc() {
  static const std::int64_t kc = [] {
    const char* v = std::getenv("XSERV_CPU_GEMM_KC");
    return v ? std::clamp<std::int64_t>(std::atoll(v), 0, 256) : 0;
  }();
  return kc;
}

// bias + beta * out into out, the part of the epilogue sgemm cannot do.
[[maybe_unused]] void apply_epilogue(ThreadPool& pool, const GemmProblem& p) {  // BLAS builds only
  pool.parallel_for(static_cast<std::size_t>(p.m), [&](std::size_t b, std::size_t e) {
    for (std::size_t m = b; m < e; ++m) {
      float* o = p.out + static_cast<std::int64_t>(m) * p.ldo;
      for (std::int64_t n = 0; n < p.n; ++n)
        o[n] = (p.bias ? p.bias[n] : 0.0f) + (p.beta != 0.0f ? p.beta * o[n] : 0.0f);
    }
  }, 16);
}

// XSERV_CPU_GEMV_L1_KB=N (read once; unset or 0: the next C rows, the rule before): how far
// ahead in its stream an out_in GEMV prefetches into L1 (GemmProblem::gemv_l1_ahead).
std::int64_t gemv_l1_ahead() {
  static const std::int64_t bytes = [] {
    const char* v = std::getenv("XSERV_CPU_GEMV_L1_KB");
    return v ? 1024 * std::max<std::int64_t>(0, std::atoll(v)) : std::int64_t{0};
  }();
  return bytes;
}

// XSERV_CPU_GEMV_HEAD (read once; 1 on, 0 off; default on for Intel CPUs, off for others): each
// out_in GEMV tile prefetches its first L2 distance (XSERV_CPU_GEMV_PREFETCH's KB) into L2 before
// its loop (GemmProblem::gemv_prefetch_head). A guided GEMV hands each thread several pieces,
// and each began with that much read on demand and by the L1 prefetch alone. Measured on the GPU
// machine's Xeon (docs/benchmarks.md, issue 16, 2026-12-04; 8 threads, 3-4 interleaved runs,
// medians, two calls): decode with it against without, GPT-2 f32 173.7 vs 170.0 and 146.2 vs
// 140.9 tok/s, with XSERV_CPU_GEMV_SEQ 154.5 vs 143.4; Qwen3-0.6B 58.4 vs 58.1, with SEQ 53.2 vs
// 52.8. Each inside its runs' spread, all five the same way. Not measured on other CPUs.
bool gemv_prefetch_head() {
  static const bool on = [] {
    bool d = false;
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    d = __builtin_cpu_is("intel");
#endif
    const char* v = std::getenv("XSERV_CPU_GEMV_HEAD");
    return v ? std::string_view(v) == "1" : d;
  }();
  return on;
}

// XSERV_CPU_GEMV_SEQ (read once; default 1, 0 the rule before 2026-12-04): a one-row GEMV over
// out_in weights reads its W rows one after the other (GemmProblem::gemv_seq), one sequential
// stream per thread, instead of four rows in step. Measured (docs/benchmarks.md, issue 16,
// 2026-12-04; interleaved runs, medians): the GPU machine's Xeon, Qwen3-0.6B decode at 8 threads
// 52.8 vs 46.5 tok/s (every run above every run of the rule before), GPT-2 f32 143.4 vs 140.9
// (154.5 with XSERV_CPU_GEMV_HEAD), a Qwen3-0.6B 2-thread decode step 60.0 vs 62.9 ms (one
// profile each: the down and o projections 11% and 9% faster); the dev EPYC at 2 threads,
// Qwen3-0.6B 40.3 vs 37.7 tok/s, GPT-2 98.7 vs 91.6.
bool gemv_seq() {
  static const bool on = [] {
    const char* v = std::getenv("XSERV_CPU_GEMV_SEQ");
    return !(v && std::string_view(v) == "0");
  }();
  return on;
}

// Checks one GEMM's arguments (as gemm() documents them) and describes it; bias_f32 keeps a
// converted bias alive.
GemmProblem make_problem(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                         const Tensor& bias, float beta, std::int64_t out_row_stride,
                         std::optional<F32View>& bias_f32) {
  constexpr const char* op = "gemm";
  check_dtype(op, "a", a, DType::f32);
  check_dtype(op, "out", out, DType::f32);
  check_float(op, "w", w);
  XSERV_CHECK(a.shape.rank() == 2 && w.shape.rank() == 2 && out.shape.rank() == 2,
              ErrorCode::invalid_argument, "gemm: a {}, w {} and out {} must all be 2-D", a.shape,
              w.shape, out.shape);
  const std::int64_t m = a.shape[0], k = a.shape[1];
  const bool out_in = layout == WeightLayout::out_in;
  const std::int64_t wk = out_in ? w.shape[1] : w.shape[0];
  const std::int64_t n = out_in ? w.shape[0] : w.shape[1];
  XSERV_CHECK(wk == k, ErrorCode::invalid_argument,
              "gemm: a {} does not match w {} ({} layout: K = {})", a.shape, w.shape,
              out_in ? "out_in" : layout == WeightLayout::in_out ? "in_out" : "panel32", wk);
  XSERV_CHECK(layout != WeightLayout::panel32 || n % weight_panel_width == 0,
              ErrorCode::invalid_argument, "gemm: panel32 weights {} need N a multiple of {}",
              w.shape, weight_panel_width);
  const std::int64_t ldo = out_row_stride ? out_row_stride : n;
  // With a row stride, out is the [M, N] column slice of a wider activation.
  XSERV_CHECK(out.shape[0] == m && out.shape[1] == n && ldo >= n, ErrorCode::invalid_argument,
              "gemm: out has shape {} (row stride {}), expected [{}, {}] from a {} and w {}",
              out.shape, ldo, m, n, a.shape, w.shape);
  if (!bias.empty()) {
    check_float(op, "bias", bias);
    check_shape(op, "bias", bias, Shape{n});
  }
  check_data(op, "a", a);
  check_data(op, "w", w);
  check_data(op, "out", out);
  bias_f32.emplace(bias);
  GemmProblem p;
  p.a = a.as<const float>();
  p.m = m;
  p.k = k;
  p.n = n;
  p.w = w.data;
  p.w_dtype = w.dtype;
  p.layout = layout;
  p.bias = bias_f32->get();
  p.beta = beta;
  p.out = out.as<float>();
  p.ldo = ldo;
  p.kc = gemm_kc();
  p.pack_prefetch = gemm_prefetch();
  p.first_tile_prefetch = gemm_first_tile_prefetch();
  const GemvPrefetch gp = gemv_prefetch();
  p.gemv_prefetch_l1 = gp.l1;
  p.gemv_prefetch_l2 = gp.l2_bytes;
  p.gemv_l1_ahead = gemv_l1_ahead();
  p.gemv_prefetch_head = gemv_prefetch_head();
  p.gemv_seq = gemv_seq();
  return p;
}

// XSERV_CPU_GEMV_SPLIT=even: a decode GEMV's column groups in the pool's even chunks (4 per
// thread, the rule before 2026-12-02) instead of guided pieces (run_gemv). Read once. Measured
// on the GPU machine's Xeon (docs/benchmarks.md, issue 16, twelfth session; with the attention
// prefetch, against both off; interleaved runs, medians): Qwen3-0.6B decode at 8 threads 66.8
// vs 51.9 and 68.3 vs 62.9 tok/s in two calls, GPT-2 217.0 vs 197.5 and 217.1 vs 180.0,
// Qwen3-0.6B at 16 threads 85.3 vs 79.6; at 2 threads within the noise (23.6-24.3 vs 22.5-25.0).
bool gemv_guided() {
  static const bool on = [] {
    const char* v = std::getenv("XSERV_CPU_GEMV_SPLIT");
    return !(v && std::string_view(v) == "even");
  }();
  return on;
}

// XSERV_CPU_GEMV_GROUP_KB=N (read once; unset or 0: 16 columns always): an out_in GEMV's
// column groups narrowed, 4 columns at a time down to 4, until one holds at most N KB of
// weights. A 16-column group of GPT-2's f32 mlp down projection (K = 3072) is 192 KB, so its
// loop's last pieces are 192 KB read by one core while the others wait.
std::int64_t gemv_group_bytes() {
  static const std::int64_t bytes = [] {
    const char* v = std::getenv("XSERV_CPU_GEMV_GROUP_KB");
    return v ? 1024 * std::max<std::int64_t>(0, std::atoll(v)) : std::int64_t{0};
  }();
  return bytes;
}

// GEMVs (M <= gemv_max_rows) of several problems in one parallel loop over their output
// columns in 16-column groups (cache lines of f32 output), so each chunk streams contiguous
// slices of out_in weights; chunks hold at least min_parallel_bytes() of weights: a small
// model's GEMV (tens of KB, in L2) runs faster on the calling thread than it takes to hand half
// of it to another one. One loop for q/k/v (gemm_parts) has one hand-off and one tail where
// three loops have three, and the smallest parts (k, v) no longer end on a mostly idle pool.
//
// Guided (gemv_guided): the pool runs one slot per thread, and each slot claims pieces of the
// groups from a shared counter, each piece 1 / (2 x slots) of what is left, down to 64 KB of
// weights. With even chunks (4 per thread) a loop ends on its last chunk run by one core, whose
// bandwidth alone is a fraction of the machine's: 1/32 of the op at 8 threads (262 KB of
// Qwen3-0.6B's q/k/v, 9.7 MB of its lm_head) read at one core's ~10 GB/s while the other seven
// wait. Guided pieces end the loop on 64 KB ones.
void run_gemv(ThreadPool& pool, const KernelTable& kt, std::span<const GemmProblem> ps) {
  std::int64_t first_group[max_gemv_parts + 1] = {}, cols[max_gemv_parts] = {};
  std::int64_t group_bytes = 1;
  const std::int64_t max_group = gemv_group_bytes();
  for (std::size_t i = 0; i < ps.size(); ++i) {
    const auto row_bytes = static_cast<std::int64_t>(ps[i].k * dtype_size(ps[i].w_dtype));
    // panel32: whole panels, each one contiguous run of the weights.
    cols[i] = ps[i].layout == WeightLayout::out_in    ? gemv_group_cols(row_bytes, max_group)
              : ps[i].layout == WeightLayout::panel32 ? weight_panel_width
                                                      : 16;
    first_group[i + 1] = first_group[i] + (ps[i].n + cols[i] - 1) / cols[i];
    group_bytes = std::max<std::int64_t>(group_bytes, cols[i] * row_bytes);
  }
  const std::int64_t groups = first_group[ps.size()];
  const auto grain = std::max<std::int64_t>(1, min_parallel_bytes() / group_bytes);
  const auto run_groups = [&](std::int64_t b, std::int64_t e) {
    for (std::size_t i = 0; i < ps.size(); ++i) {
      const std::int64_t g0 = std::max(b, first_group[i]);
      const std::int64_t g1 = std::min(e, first_group[i + 1]);
      if (g0 >= g1) continue;
      const GemmProblem& p = ps[i];
      kt.gemm_tile(p, 0, p.m, (g0 - first_group[i]) * cols[i],
                   std::min(p.n, (g1 - first_group[i]) * cols[i]), gemm_scratch());
    }
  };
  const std::int64_t slots = std::min(static_cast<std::int64_t>(pool.size()), groups / grain);
  if (gemv_guided() && slots > 1) {
    std::atomic<std::int64_t> next{0};
    const std::int64_t min_piece = std::max<std::int64_t>(1, (64 * 1024 + group_bytes - 1) / group_bytes);
    pool.parallel_for(static_cast<std::size_t>(slots), [&](std::size_t, std::size_t) {
      std::int64_t b = next.load(std::memory_order_relaxed);
      while (b < groups) {
        const std::int64_t e = std::min(groups, b + std::max(min_piece, (groups - b) / (2 * slots)));
        if (next.compare_exchange_weak(b, e, std::memory_order_relaxed)) {
          run_groups(b, e);
          b = next.load(std::memory_order_relaxed);
        }
      }
    });
    return;
  }
  pool.parallel_for(static_cast<std::size_t>(groups), [&](std::size_t b, std::size_t e) {
    run_groups(static_cast<std::int64_t>(b), static_cast<std::int64_t>(e));
  }, static_cast<std::size_t>(grain));
}

}  // namespace

// Tasks of a prefill GEMM: column tiles tile_n wide (a multiple of 32, at most 128) times row
// blocks. Chosen for the least time on the busiest thread: rounds of tasks (ceil(tasks /
// threads), claimed dynamically) times one task's cost, its rows plus the packing of its weight
// tile, which costs about pack_rows rows of compute (the tile comes from DRAM, strided, and is
// widened). Every row block packs the weights once more, so they pay only when there are too few
// column tiles for the threads. Among equal costs the split with more tasks wins while there are
// fewer than 4 per thread (a descheduled thread then holds up less).
// GPT-2's N = 768 at 8 threads, M = 128: 24 tiles of 32 (3 per thread); the old rule (4 tasks per
// thread by narrowing to 32, then halving rows) gave 48 tasks that packed every weight twice.
// f32 panel32 weights are multiplied in place (packs false): tiles of one panel, 32 columns, so
// a task reads one contiguous stream of weights whose K tile stays in L1/L2 over its row steps
// (on the dev EPYC, 2 threads, 128-column tiles of panels ran GPT-2's prefill GEMMs 10-60%
// slower than 32-column ones); a task's first K tile from DRAM costs about 8 rows of compute.
GemmSplit split_gemm(std::int64_t m, std::int64_t n, std::int64_t threads, bool packs) {
  constexpr std::int64_t min_rows = 48;
  const std::int64_t pack_rows = packs ? 32 : 8, widest = packs ? 128 : 32;
  GemmSplit best;
  std::int64_t best_cost = -1, best_tasks = 0;
  for (std::int64_t tile_n = widest; tile_n >= 32; tile_n -= 32) {
    for (std::int64_t rb = 1; rb == 1 || m / rb >= min_rows; rb *= 2) {
      const std::int64_t tasks = (n + tile_n - 1) / tile_n * rb;
      const std::int64_t rounds = (tasks + threads - 1) / threads;
      const std::int64_t cost = rounds * std::min(tile_n, n) * ((m + rb - 1) / rb + pack_rows);
      if (best_cost < 0 || cost < best_cost ||
          (cost == best_cost && tasks > best_tasks && best_tasks < 4 * threads)) {
        best = {tile_n, rb};
        best_cost = cost;
        best_tasks = tasks;
      }
    }
  }
  return best;
}

std::int64_t gemv_group_cols(std::int64_t row_bytes, std::int64_t max_group_bytes) {
  std::int64_t cols = 16;
  if (max_group_bytes > 0)
    while (cols > 4 && cols * row_bytes > max_group_bytes) cols -= 4;
  return cols;
}

GemvPrefetch parse_gemv_prefetch(const char* value, GemvPrefetch fallback) {
  if (!value) return fallback;
  const std::string_view s(value);
  if (s == "l1") return {true, 0};
  if (s == "off") return {false, 0};
  const bool both = s.starts_with("both");
  if (!both && !s.starts_with("l2")) return fallback;
  const std::string_view rest = s.substr(both ? 4 : 2);  // empty or ":KB"
  if (!rest.empty() && rest[0] != ':') return fallback;
  const long kb = rest.empty() ? 32 : std::atol(value + (s.size() - rest.size()) + 1);
  return kb > 0 ? GemvPrefetch{both, std::int64_t{kb} * 1024} : fallback;
}

void CpuBackend::gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                      const Tensor& bias, float beta, std::int64_t out_row_stride) {
  gemm_impl(out, a, w, layout, bias, beta, out_row_stride, false);
}

void CpuBackend::layer_norm_gemm(Tensor out, const Tensor& x, const Tensor& norm_weight,
                                 const Tensor& norm_bias, float eps, const Tensor& w,
                                 WeightLayout layout, const Tensor& bias, bool gelu,
                                 Tensor h_scratch) {
  layer_norm(h_scratch, x, {}, norm_weight, norm_bias, eps);
  gemm_impl(out, h_scratch, w, layout, bias, 0.0f, 0, gelu);
}

void CpuBackend::gemm_impl(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                           const Tensor& bias, float beta, std::int64_t out_row_stride, bool gelu) {
  std::optional<F32View> bias_f32;
  GemmProblem p = make_problem(out, a, w, layout, bias, beta, out_row_stride, bias_f32);
  p.gelu = gelu;
  const std::int64_t m = p.m, n = p.n;
  if (m == 0 || n == 0) return;

#ifdef XSERV_HAVE_BLAS
  if (use_blas_ && w.dtype == DType::f32 && m > gemv_max_rows && p.k > 0 &&
      layout != WeightLayout::panel32) {
    const bool plain = !p.bias && beta == 0.0f;
    if (!plain) apply_epilogue(pool_, p);
    const bool out_in = layout == WeightLayout::out_in;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(p.k), 1.0f, p.a,
                static_cast<int>(p.k), w.as<const float>(), static_cast<int>(out_in ? p.k : n),
                plain ? 0.0f : 1.0f, p.out, static_cast<int>(p.ldo));
    if (gelu) this->gelu(out);  // only layer_norm_gemm sets it, with a contiguous out
    return;
  }
#endif

  const KernelTable& kt = *kernels_;
  const auto threads = static_cast<std::int64_t>(pool_.size());
  if (m <= gemv_max_rows) {
    run_gemv(pool_, kt, std::span<const GemmProblem>(&p, 1));
    return;
  }
  if (amx_ && w.dtype == DType::bf16 && layout == WeightLayout::out_in) {
    run_amx(std::span<const GemmProblem>(&p, 1));
    return;
  }
  GemmSplit split = split_gemm(m, n, threads,
                               !(layout == WeightLayout::panel32 && w.dtype == DType::f32));
  // Measurement only: XSERV_CPU_GEMM_TILE=W[xR] forces the prefill tile width (a multiple of 32,
  // at most 128) and row blocks, to compare splits on a given machine (docs/cpu.md).
  static const GemmSplit forced = [] {
    GemmSplit f{0, 0};
    if (const char* v = std::getenv("XSERV_CPU_GEMM_TILE")) {
      char* end = nullptr;
      f.tile_n = std::strtoll(v, &end, 10);
      f.row_blocks = end && *end == 'x' ? std::strtoll(end + 1, nullptr, 10) : 1;
      if (f.tile_n < 32 || f.tile_n > 128 || f.tile_n % 32 || f.row_blocks < 1) f = {0, 0};
    }
    return f;
  }();
  if (forced.tile_n) split = forced;
  const std::int64_t tile_n = split.tile_n, row_blocks = split.row_blocks;
  const std::int64_t col_tiles = (n + tile_n - 1) / tile_n;
  const std::int64_t tasks = col_tiles * row_blocks;
  pool_.parallel_for(static_cast<std::size_t>(tasks), [&](std::size_t b, std::size_t e) {
    float* scratch = gemm_scratch();
    for (auto t = static_cast<std::int64_t>(b); t < static_cast<std::int64_t>(e); ++t) {
      // Consecutive tasks share a row block, so a thread keeps its A rows warm.
      const std::int64_t rb = t / col_tiles, ct = t % col_tiles;
      kt.gemm_tile(p, m * rb / row_blocks, m * (rb + 1) / row_blocks, ct * tile_n,
                   std::min(n, (ct + 1) * tile_n), scratch);
    }
  });
}

// Prefill GEMMs of bf16 out_in weights (every problem's) on AMX tiles: A (the same for all) rounded
// to bf16 once, then one loop over every problem's 32-column groups, about 4 tasks per thread,
// each packing its W rows for the tiles (q/k/v: one rounding and one hand-off instead of three).
void CpuBackend::run_amx(std::span<const GemmProblem> ps) {
  const GemmProblem& p0 = ps[0];
  // Measurement: XSERV_CPU_AMX_LDA=tight, A's rows K (padded to tiles) apart, no skew.
  static const bool skew = [] {
    const char* v = std::getenv("XSERV_CPU_AMX_LDA");
    return !(v && std::string_view(v) == "tight");
  }();
  const std::int64_t lda = amx_lda(p0.k, skew), rows = amx_padded(p0.m, amx_rows);
  amx_a_.resize(static_cast<std::size_t>(rows * lda));
  std::uint16_t* abf = amx_a_.data();
  pool_.parallel_for(
      static_cast<std::size_t>(rows),
      [&](std::size_t b, std::size_t e) {
        amx_round_rows(p0.a, p0.m, p0.k, abf, lda, static_cast<std::int64_t>(b),
                       static_cast<std::int64_t>(e));
      },
      8);
  GemmProblem q[max_gemv_parts];
  std::int64_t first_task[max_gemv_parts + 1] = {}, width[max_gemv_parts] = {};
  std::int64_t groups = 0;
  for (const GemmProblem& p : ps) groups += (p.n + 31) / 32;
  const auto threads = static_cast<std::int64_t>(pool_.size());
  const std::int64_t per_task = std::max<std::int64_t>(1, groups / (4 * threads));
  for (std::size_t i = 0; i < ps.size(); ++i) {
    q[i] = ps[i];
    q[i].a_bf16 = abf;
    q[i].lda_bf16 = lda;
    width[i] = 32 * per_task;
    first_task[i + 1] = first_task[i] + (q[i].n + width[i] - 1) / width[i];
  }
  pool_.parallel_for(
      static_cast<std::size_t>(first_task[ps.size()]), [&](std::size_t b, std::size_t e) {
        void* scratch = amx_scratch(p0.k);
        for (auto t = static_cast<std::int64_t>(b); t < static_cast<std::int64_t>(e); ++t) {
          std::size_t i = 0;
          while (t >= first_task[i + 1]) ++i;
          const std::int64_t c0 = (t - first_task[i]) * width[i];
          if (amx_ == 1)
            amx_gemm_columns(q[i], c0, std::min(q[i].n, c0 + width[i]), scratch);
          else
            amx_gemm_columns_emulated(q[i], c0, std::min(q[i].n, c0 + width[i]), scratch);
        }
      });
}

void CpuBackend::gemm_parts(Tensor out, const Tensor& a, std::span<const Tensor> ws,
                            std::span<const Tensor> biases) {
  check_gemm_parts(out, ws, biases);
  XSERV_CHECK(a.shape.rank() == 2, ErrorCode::invalid_argument, "gemm_parts: a {} must be 2-D", a.shape);
  const bool amx =
      amx_ && a.shape[0] > gemv_max_rows && ws.size() <= max_gemv_parts &&
      std::all_of(ws.begin(), ws.end(), [](const Tensor& w) { return w.dtype == DType::bf16; });
  // Prefill GEMMs are long enough that one loop each costs nothing (but the AMX path's A
  // rounding is shared).
  if (!amx && (a.shape[0] > gemv_max_rows || ws.size() > max_gemv_parts)) {
    Backend::gemm_parts(out, a, ws, biases);
    return;
  }
  GemmProblem ps[max_gemv_parts];
  std::optional<F32View> bias_f32[max_gemv_parts];
  std::int64_t col = 0;
  for (std::size_t i = 0; i < ws.size(); ++i) {
    const std::int64_t n = ws[i].shape[0];
    ps[i] = make_problem(column_slice(out, col, n), a, ws[i], WeightLayout::out_in,
                         biases.empty() ? Tensor{} : biases[i], 0.0f, out.shape[1], bias_f32[i]);
    col += n;
  }
  if (a.shape[0] == 0 || out.shape[1] == 0) return;
  if (amx)
    run_amx(std::span<const GemmProblem>(ps, ws.size()));
  else
    run_gemv(pool_, *kernels_, std::span<const GemmProblem>(ps, ws.size()));
}

}  // namespace xserv::cpu
