// CpuBackend::gemm: out[M, N] = a[M, K] · W + bias + beta * out, W in_out [K, N] or out_in
// [N, K] in f32/bf16/f16, accumulated in f32.
//
// Work split: a GEMV (M <= gemv_max_rows, decode) is memory bound, so N is cut into one
// contiguous column range per thread and every weight byte is read once. A GEMM (prefill) is cut
// into column tiles of up to 128, and into row blocks too when there are too few column tiles to
// keep all threads busy; each task packs its own weight tile. f32 weights with M > gemv_max_rows go to
// OpenBLAS when it is there: its sgemm beats the portable kernel on f32 (bench/cpu_ops_bench).
#include <algorithm>
#include <vector>

#include "backend/cpu/cpu_backend.hpp"
#include "backend/cpu/tensor_checks.hpp"

#ifdef XSERV_HAVE_BLAS
#include <cblas.h>
#endif

namespace xserv::cpu {
namespace {

float* gemm_scratch() {
  thread_local std::vector<float> scratch(static_cast<std::size_t>(gemm_scratch_floats));
  return scratch.data();
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

}  // namespace

void CpuBackend::gemm(Tensor out, const Tensor& a, const Tensor& w, WeightLayout layout,
                      const Tensor& bias, float beta, std::int64_t out_row_stride) {
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
              out_in ? "out_in" : "in_out", wk);
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
  if (m == 0 || n == 0) return;

  const F32View bias_f32(bias);
  GemmProblem p;
  p.a = a.as<const float>();
  p.m = m;
  p.k = k;
  p.n = n;
  p.w = w.data;
  p.w_dtype = w.dtype;
  p.layout = layout;
  p.bias = bias_f32.get();
  p.beta = beta;
  p.out = out.as<float>();
  p.ldo = ldo;

#ifdef XSERV_HAVE_BLAS
  if (use_blas_ && w.dtype == DType::f32 && m > gemv_max_rows && k > 0) {
    const bool plain = !p.bias && beta == 0.0f;
    if (!plain) apply_epilogue(pool_, p);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, out_in ? CblasTrans : CblasNoTrans,
                static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), 1.0f, p.a,
                static_cast<int>(k), w.as<const float>(), static_cast<int>(out_in ? k : n),
                plain ? 0.0f : 1.0f, p.out, static_cast<int>(ldo));
    return;
  }
#endif

  const KernelTable& kt = *kernels_;
  const auto threads = static_cast<std::int64_t>(pool_.size());
  if (m <= gemv_max_rows) {
    // Column ranges of whole 16-column groups (cache lines of f32 output), each at least
    // min_parallel_bytes() of weights: a small model's GEMV (tens of KB, in L2) runs faster on
    // the calling thread than it takes to hand half of it to another one.
    const std::int64_t groups = (n + 15) / 16;
    const auto group_bytes = static_cast<std::int64_t>(16 * k * dtype_size(w.dtype));
    const auto grain = static_cast<std::size_t>(
        std::max<std::int64_t>(1, min_parallel_bytes() / std::max<std::int64_t>(group_bytes, 1)));
    pool_.parallel_for(static_cast<std::size_t>(groups), [&](std::size_t b, std::size_t e) {
      kt.gemm_tile(p, 0, m, static_cast<std::int64_t>(b) * 16,
                   std::min(n, static_cast<std::int64_t>(e) * 16), gemm_scratch());
    }, grain);
    return;
  }
  // Enough tasks for every thread: narrower column tiles first (down to two 16-float registers
  // wide), then row blocks of at least min_rows (each packs the weight tile once more).
  constexpr std::int64_t min_rows = 48;
  std::int64_t tile_n = 128;
  while ((n + tile_n - 1) / tile_n < 4 * threads && tile_n > 32) tile_n /= 2;
  const std::int64_t col_tiles = (n + tile_n - 1) / tile_n;
  std::int64_t row_blocks = 1;
  while (col_tiles * row_blocks < 4 * threads && m / (row_blocks * 2) >= min_rows) row_blocks *= 2;
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

}  // namespace xserv::cpu
